"""Confidence bounds on the class probabilities of a smoothed classifier, from Monte-Carlo counts.

- One-sided Clopper-Pearson (exact binomial) bounds; Cohen et al.'s ``pA_lower`` is the lower bound at level
  ``alpha`` on the top class alone.
- Li et al. (NeurIPS 2019), Sec. 4 "Confidence Interval and Sample Size": the lower end for ``p(1)`` and the
  upper end for ``p(2)`` by one-sided Clopper-Pearson intervals with a Bonferroni correction. Which class is
  second is itself random, so ``p(2)`` is bounded by the largest upper bound over all ``K - 1`` other classes:
  ``K`` one-sided intervals at level ``alpha / K`` each hold together with probability >= 1 - alpha. Since
  ``p(2) <= 1 - p(1)``, the upper end is also capped at ``1 - p1_lower``.
- Sison & Glaz (1995) simultaneous multinomial intervals, what the STN reference code uses (R's
  ``MultinomialCI``): a port of the algorithm as implemented in ``statsmodels``'
  ``multinomial_proportions_confint(method="sison-glaz")`` (Edgeworth-corrected Poisson approximation).
  The approximation breaks down at extreme counts (e.g. all n samples in one class, where statsmodels returns
  a lower bound of exactly 1) and often cannot reach 1 - alpha for alpha = 0.001; where it finds no interval
  width with the requested coverage we fall back to Bonferroni-corrected Clopper-Pearson intervals.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from stealkit.errors import InputError

log = logging.getLogger(__name__)

Interval = Literal["clopper-pearson", "sison-glaz"]
INTERVALS: tuple[str, ...] = ("clopper-pearson", "sison-glaz")


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise InputError(f"alpha must lie in (0, 1), got {alpha}")


def clopper_pearson_lower(k: ArrayLike, n: ArrayLike, alpha: float) -> NDArray[np.float64] | float:
    """One-sided lower bound on a binomial proportion: P(p >= bound) >= 1 - alpha. ``k = 0`` gives 0."""
    _check_alpha(alpha)
    k_, n_ = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    out = np.where(k_ > 0, stats.beta.ppf(alpha, np.maximum(k_, 1e-300), n_ - k_ + 1), 0.0)
    return float(out) if out.ndim == 0 else out


def clopper_pearson_upper(k: ArrayLike, n: ArrayLike, alpha: float) -> NDArray[np.float64] | float:
    """One-sided upper bound on a binomial proportion: P(p <= bound) >= 1 - alpha. ``k = n`` gives 1."""
    _check_alpha(alpha)
    k_, n_ = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    out = np.where(k_ < n_, stats.beta.ppf(1 - alpha, k_ + 1, np.maximum(n_ - k_, 1e-300)), 1.0)
    return float(out) if out.ndim == 0 else out


def _pois_interval(b: np.ndarray, a: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """P(b <= Z <= a) for Z ~ Poisson(lam), elementwise."""
    return stats.poisson.cdf(a, lam) - stats.poisson.cdf(b - 1, lam)


def _sg_moment(x: np.ndarray, b: np.ndarray, a: np.ndarray, r: int) -> np.ndarray:
    """The r-th factorial moment of Poisson(x) truncated to [b, a]."""
    base = _pois_interval(b, a, x)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (_pois_interval(a - r + 1, a, x) - _pois_interval(b - r, b - 1, x)) / base
    return x**r * (1 - np.nan_to_num(frac))


def _sg_coverage(x: np.ndarray, n: float, c: np.ndarray) -> np.ndarray:
    """Sison-Glaz's approximation (their formula (1)) of P(x_i - c <= X_i <= x_i + c for all i) for
    X ~ Multinomial(n, x / n), for every width in the vector ``c`` at once."""
    cc = np.asarray(c, dtype=np.float64)[:, None]
    b, a = np.maximum(x[None, :] - cc, 0), np.minimum(x[None, :] + cc, n)
    m1, m2, m3, m4 = (_sg_moment(x[None, :], b, a, r) for r in range(1, 5))
    mu = m1
    mu2 = m2 + mu - mu**2
    mu3 = m3 + m2 * (3 - 3 * mu) + mu - 3 * mu**2 + 2 * mu**3
    mu4 = m4 + m3 * (6 - 4 * mu) + m2 * (7 - 12 * mu + 6 * mu**2) + mu - 4 * mu**2 + 6 * mu**3 - 3 * mu**4
    s2 = mu2.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g1 = mu3.sum(axis=1) / s2**1.5
        g2 = (mu4.sum(axis=1) - 3 * (mu2**2).sum(axis=1)) / s2**2
        z = (n - mu.sum(axis=1)) / np.sqrt(s2)
        phi = np.exp(-(z**2) / 2) / np.sqrt(2 * np.pi)
        h3, h4, h6 = z**3 - 3 * z, z**4 - 6 * z**2 + 3, z**6 - 15 * z**4 + 45 * z**2 - 15
        edge = phi * (1 + g1 * h3 / 6 + g2 * h4 / 24 + g1**2 * h6 / 72) / np.sqrt(s2)
        logp = (np.log(_pois_interval(b, a, x[None, :])).sum(axis=1) + np.log(np.maximum(edge, 1e-300))
                - stats.poisson.logpmf(n, n))
    return np.where(s2 > 0, np.exp(logp), 1.0)


def sison_glaz(counts: ArrayLike, alpha: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Simultaneous ``1 - alpha`` intervals ``(lower[K], upper[K])`` for all K multinomial proportions.

    Finds the first integer width ``c`` with ``nu(c) <= 1 - alpha < nu(c + 1)`` (searched up to
    ``5 sqrt(n) + 10``), as statsmodels does; falls back to Clopper-Pearson when there is none.
    """
    _check_alpha(alpha)
    x = np.asarray(counts, dtype=np.float64)
    if x.ndim != 1 or len(x) < 2 or (x < 0).any():
        raise InputError("counts must be a vector of at least two non-negative counts")
    n = float(x.sum())
    if n <= 0:
        raise InputError("counts must not all be zero")
    widths = np.arange(1.0, min(n, 5 * np.sqrt(n) + 10) + 2)
    nu = _sg_coverage(x, n, widths)
    hits = np.flatnonzero((nu[:-1] <= 1 - alpha) & (1 - alpha < nu[1:]))
    if len(hits) == 0:
        # The Edgeworth approximation never reaches 1 - alpha (extreme counts, small alpha): fall back to
        # Bonferroni-corrected two-sided Clopper-Pearson intervals, which are valid but wider.
        log.debug("Sison-Glaz approximation failed for counts %s; using Clopper-Pearson", x.tolist())
        a = alpha / (2 * len(x))
        return (np.asarray(clopper_pearson_lower(x, n, a), dtype=np.float64),
                np.asarray(clopper_pearson_upper(x, n, a), dtype=np.float64))
    i = int(hits[0])
    c, nuc, nucp1 = widths[i], nu[i], nu[i + 1]
    g = (1 - alpha - nuc) / (nucp1 - nuc)
    p = x / n
    return np.maximum(p - c / n, 0.0), np.minimum(p + (c + 2 * g) / n, 1.0)


def pair_bounds(counts: ArrayLike, top: int, alpha: float,
                interval: Interval = "clopper-pearson") -> tuple[float, float]:
    """``(p1_lower, p2_upper)``: a lower bound on the probability of class ``top`` and an upper bound on the
    largest probability of any other class, holding together with probability >= 1 - alpha."""
    x = np.asarray(counts, dtype=np.float64)
    k = len(x)
    n = float(x.sum())
    others = np.delete(np.arange(k), top)
    if interval == "clopper-pearson":
        a = alpha / k
        p1 = float(clopper_pearson_lower(x[top], n, a))
        p2 = float(np.max(clopper_pearson_upper(x[others], n, a)))
    elif interval == "sison-glaz":
        lo, hi = sison_glaz(x, alpha)
        p1, p2 = float(lo[top]), float(hi[others].max())
    else:
        raise InputError(f"unknown interval {interval!r}; expected one of {', '.join(INTERVALS)}")
    return p1, min(p2, 1.0 - p1)
