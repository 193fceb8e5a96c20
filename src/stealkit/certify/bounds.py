"""Certified L2 radii of a Gaussian-smoothed classifier from its top-two class probabilities.

Every function takes the probability of the top class ``p1`` (a lower bound in practice) and of the runner-up
``p2`` (an upper bound), scalars or broadcastable arrays, with ``0 <= p2``, ``p1 + p2 <= 1``, and the noise
level ``sigma``; it returns the radius, 0 where no certificate can be given (the caller abstains).

- :func:`renyi_radius`: Li, Chen, Wang & Carin, "Certified Adversarial Robustness with Additive Gaussian
  Noise" (NeurIPS 2019), Theorem 2 / Algorithm 1 line 6:
  ``L = sup_{alpha > 1} sqrt(-(2 sigma^2 / alpha) log(1 - p1 - p2 + 2 M_{1-alpha}(p1, p2)))`` with ``M_q`` the
  generalised mean. The supremum is taken over a log-spaced grid of ``alpha - 1`` in [1e-8, 1e6] plus the
  limit alpha -> 1, then refined by golden-section search (a bounded 1-D optimiser) in the grid cells around
  the best grid point; the result is never below the grid's value. :func:`renyi_radius_reference` is the
  reference code's fixed grid ``linspace(1.01, 2.0, 100)`` (``official-code-notes.md``), which can miss the
  supremum when it lies near alpha = 1 or above 2.
- :func:`cohen_radius`: Cohen, Rosenfeld & Kolter (ICML 2019), Theorem 1: ``sigma * Phi^-1(p1)`` (needs
  ``p1 > 1/2``), or the two-class form ``sigma / 2 * (Phi^-1(p1) - Phi^-1(p2))`` when ``p2`` is given.
- :func:`pixeldp_radius`: Lecuyer et al. (S&P 2019) as stated in Li et al. Appendix A: robust to L2 attacks of
  size ``L = sigma * eps / sqrt(2 log(1.25 / delta))`` when ``p1 >= e^{2 eps} p2 + (1 + e^eps) delta``
  (the Gaussian mechanism, valid for ``eps <= 1``). The paper grid-searches (eps, delta); for each eps the
  best delta is the largest feasible one, ``(p1 - e^{2 eps} p2) / (1 + e^eps)``, so we search eps on a fine
  grid with that delta and refine by golden section: never below any (eps, delta) grid search
  (:func:`pixeldp_radius_grid` is that grid search, for comparison).

All three are linear in ``sigma``, non-decreasing in ``p1`` and non-increasing in ``p2`` (property-tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri

from stealkit.errors import InputError

Bound = Literal["renyi", "cohen", "pixeldp"]
BOUNDS: tuple[str, ...] = ("cohen", "renyi", "pixeldp")

Array = NDArray[np.float64]

#: log(alpha - 1) grid of :func:`renyi_radius`
_RENYI_LOG_GRID = np.linspace(np.log(1e-8), np.log(1e6), 400)
#: the STN reference code's alpha grid
REFERENCE_ALPHAS = np.linspace(1.01, 2.0, 100)
_GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


def _check(p1: ArrayLike, p2: ArrayLike | None, sigma: float) -> tuple[Array, Array | None]:
    if not np.isfinite(sigma) or sigma <= 0:
        raise InputError(f"sigma must be a positive number, got {sigma}")
    a = np.asarray(p1, dtype=np.float64)
    if np.isnan(a).any() or (a < 0).any() or (a > 1).any():
        raise InputError("p1 must lie in [0, 1]")
    if p2 is None:
        return a, None
    b = np.asarray(p2, dtype=np.float64)
    if np.isnan(b).any() or (b < 0).any() or (b > 1).any():
        raise InputError("p2 must lie in [0, 1]")
    if (a + b > 1 + 1e-9).any():
        raise InputError("p1 + p2 must be <= 1 (they are probabilities of two different classes)")
    return a, b


def _out(r: Array) -> float | Array:
    return float(r) if r.ndim == 0 else r


def _golden_max(f: Callable[[Array], Array], lo: Array, hi: Array, iters: int = 60) -> Array:
    """Vectorised golden-section search for the maximum of ``f`` on ``[lo, hi]`` (elementwise); returns the
    best value at any point evaluated (one evaluation per iteration)."""
    c = hi - _GOLDEN * (hi - lo)
    d = lo + _GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    best = np.maximum(fc, fd)
    for _ in range(iters):
        left = fc >= fd  # keep [lo, d]: the old c becomes the new d
        hi = np.where(left, d, hi)
        lo = np.where(left, lo, c)
        new = np.where(left, hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo))
        f_new = f(new)
        c, fc, d, fd = (np.where(left, new, d), np.where(left, f_new, fd),
                        np.where(left, c, new), np.where(left, fc, f_new))
        best = np.maximum(best, f_new)
    return best


def renyi_divergence_bound(p1: Array, p2: Array, alpha: Array) -> Array:
    """``-log(1 - p1 - p2 + 2 M_{1-alpha}(p1, p2)) / alpha`` (Lemma 1 divided by alpha), elementwise.

    Its supremum over alpha > 1 is ``L^2 / (2 sigma^2)`` of Theorem 2. ``alpha`` = 1 gives the limit (geometric
    mean). Computed without cancellation (:func:`_neg_log_g`): near a tie (``p1 ~ p2``) ``1 - p1 - p2 + 2 M`` is
    ``1 - O(eps)``, and the plain formula (``M`` from ``logaddexp`` divided by ``1 - alpha``) divided its rounding
    noise by a small ``1 - alpha``, overstating the bound (and the radius) by up to 1e15 times.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = 1.0 - alpha
        lp1, lp2 = np.log(p1), np.log(p2)
        near_one = np.abs(t) < 1e-12
        safe_t = np.where(near_one, -1.0, t)
        val = _neg_log_g(p1, p2, lp1, lp2, safe_t, near_one) / alpha
    val = np.where(np.isnan(val), 0.0, val)
    return np.maximum(val, 0.0)


def renyi_radius(p1: ArrayLike, p2: ArrayLike, sigma: float) -> float | Array:
    """Li et al.'s certified L2 radius (Theorem 2), supremum over alpha > 1 (see the module docstring)."""
    a, b = _check(p1, p2, sigma)
    assert b is not None
    a, b = np.broadcast_arrays(a, b)
    flat_a, flat_b = a.reshape(-1, 1), b.reshape(-1, 1)
    grid = 1.0 + np.exp(_RENYI_LOG_GRID)[None, :]
    vals = renyi_divergence_bound(flat_a, flat_b, grid)
    limit = renyi_divergence_bound(flat_a[:, 0], flat_b[:, 0], np.ones(len(flat_a)))
    i = vals.argmax(axis=1)
    lo = _RENYI_LOG_GRID[np.maximum(i - 1, 0)]
    hi = _RENYI_LOG_GRID[np.minimum(i + 1, len(_RENYI_LOG_GRID) - 1)]
    refined = _golden_max(lambda u: renyi_divergence_bound(flat_a[:, 0], flat_b[:, 0], 1.0 + np.exp(u)), lo, hi, 40)
    best = np.maximum(np.maximum(vals.max(axis=1), limit), refined)
    r = sigma * np.sqrt(2.0 * best)
    r = np.where(flat_a[:, 0] > flat_b[:, 0], r, 0.0)
    return _out(r.reshape(a.shape))


def renyi_radius_reference(p1: ArrayLike, p2: ArrayLike, sigma: float,
                           alphas: ArrayLike = REFERENCE_ALPHAS) -> float | Array:
    """The STN reference code's radius: the maximum over a fixed alpha grid (default ``linspace(1.01, 2, 100)``)."""
    a, b = _check(p1, p2, sigma)
    assert b is not None
    a, b = np.broadcast_arrays(a, b)
    grid = np.asarray(alphas, dtype=np.float64)[None, :]
    vals = renyi_divergence_bound(a.reshape(-1, 1), b.reshape(-1, 1), grid).max(axis=1)
    r = np.where(a.reshape(-1) > b.reshape(-1), sigma * np.sqrt(2.0 * vals), 0.0)
    return _out(r.reshape(a.shape))


def cohen_radius(p1_lower: ArrayLike, sigma: float, p2_upper: ArrayLike | None = None) -> float | Array:
    """Cohen et al.'s radius: ``sigma * Phi^-1(p1)`` if ``p1 > 1/2``, else 0; with ``p2_upper`` the two-class form
    ``sigma / 2 * (Phi^-1(p1) - Phi^-1(p2))`` if ``p1 > p2``, else 0."""
    a, b = _check(p1_lower, p2_upper, sigma)
    with np.errstate(divide="ignore", invalid="ignore"):
        if b is None:
            r = np.where(a > 0.5, sigma * ndtri(a), 0.0)
        else:
            a, b = np.broadcast_arrays(a, b)
            r = np.where(a > b, 0.5 * sigma * (ndtri(a) - ndtri(b)), 0.0)
    return _out(np.asarray(r, dtype=np.float64))


def _pixeldp_value(p1: Array, p2: Array, eps: Array) -> Array:
    """``eps / sqrt(2 log(1.25 / delta))`` with the largest feasible delta for this eps (0 if none)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        delta = (p1 - np.exp(2.0 * eps) * p2) / (1.0 + np.exp(eps))
        val = eps / np.sqrt(2.0 * np.log(1.25 / delta))
    return np.where((delta > 0) & np.isfinite(val), val, 0.0)


def pixeldp_radius(p1: ArrayLike, p2: ArrayLike, sigma: float, *, max_epsilon: float = 1.0) -> float | Array:
    """PixelDP's radius with the best (eps, delta), eps in (0, ``max_epsilon``] (see the module docstring)."""
    a, b = _check(p1, p2, sigma)
    assert b is not None
    a, b = np.broadcast_arrays(a, b)
    fa, fb = a.reshape(-1, 1), b.reshape(-1, 1)
    grid = np.linspace(max_epsilon / 1000, max_epsilon, 1000)
    vals = _pixeldp_value(fa, fb, grid[None, :])
    i = vals.argmax(axis=1)
    lo, hi = grid[np.maximum(i - 1, 0)], grid[np.minimum(i + 1, len(grid) - 1)]
    refined = _golden_max(lambda e: _pixeldp_value(fa[:, 0], fb[:, 0], e), lo, hi, 30)
    best = np.maximum(vals.max(axis=1), refined)
    return _out((sigma * best).reshape(a.shape))


def pixeldp_radius_grid(p1: float, p2: float, sigma: float, epsilons: ArrayLike, deltas: ArrayLike) -> float:
    """Appendix A's plain grid search over (eps, delta) for one point: the largest feasible radius."""
    e = np.asarray(epsilons, dtype=np.float64)[:, None]
    d = np.asarray(deltas, dtype=np.float64)[None, :]
    feasible = p1 >= np.exp(2 * e) * p2 + (1 + np.exp(e)) * d
    with np.errstate(divide="ignore", invalid="ignore"):
        val = sigma * e / np.sqrt(2 * np.log(1.25 / d))
    val = np.where(feasible & (d > 0) & (d < 1.25), val, 0.0)
    return float(val.max()) if val.size else 0.0


def radius(bound: Bound, p1: ArrayLike, p2: ArrayLike, sigma: float) -> float | Array:
    """Dispatch by name; ``cohen`` uses the one-argument form ``sigma * Phi^-1(p1)``."""
    if bound == "renyi":
        return renyi_radius(p1, p2, sigma)
    if bound == "pixeldp":
        return pixeldp_radius(p1, p2, sigma)
    if bound == "cohen":
        return cohen_radius(p1, sigma)
    raise InputError(f"unknown bound {bound!r}; expected one of {', '.join(BOUNDS)}")


def _neg_log_g(p1: Array, p2: Array, lp1: Array, lp2: Array, t: Array, near_one: Array) -> Array:
    """``-log(g)``, ``g = 1 - p1 - p2 + 2 M_t(p1, p2)``, without cancellation. With ``mu`` and ``delta`` the half sum
    and half difference of ``log p1`` and ``log p2`` (the difference as ``log1p((p1 - p2) / p2)``, exact near a
    tie), ``M_t = e^mu cosh(t delta)^(1/t)`` (``t -> 0``, ``near_one``: the geometric mean ``e^mu``) and
    ``d = p1 + p2 - 2 M_t = 2 e^mu (2 sinh^2(delta / 2) - expm1(log cosh(t delta) / t))``, two terms of the same
    sign for ``t < 0``. Where ``d <= 1/2`` the result is ``-log1p(-d)``, else ``-log(g)`` (``g`` is then small and
    accurate)."""
    mu, delta = 0.5 * (lp1 + lp2), 0.5 * np.log1p((p1 - p2) / p2)
    x = np.abs(t * delta)
    log_cosh = np.where(x < 1.0, np.log1p(2.0 * np.sinh(0.5 * x) ** 2), x + np.log1p(np.exp(-2.0 * x)) - np.log(2.0))
    log_ratio = np.where(near_one, 0.0, log_cosh / t)
    d = 2.0 * np.exp(mu) * (2.0 * np.sinh(0.5 * delta) ** 2 - np.expm1(log_ratio))
    g = 1.0 - p1 - p2 + 2.0 * np.exp(mu + log_ratio)
    small = np.isfinite(d) & (d <= 0.5)
    return np.where(small, -np.log1p(-np.clip(d, 0.0, 0.5)), -np.log(np.clip(g, 0.0, 1.0)))
