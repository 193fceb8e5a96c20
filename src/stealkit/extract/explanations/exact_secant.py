"""Exact recovery beyond Milli et al.'s algorithm: the secant search and biased, multi-output networks.

The paper's Algorithm 1 (:mod:`stealkit.extract.explanations.exact`) recovers ``f(x) = sum_i w_i ReLU(<A_i, x>)`` by
binary searches (Algorithm 1a) and a ``2h x 2h`` solve (Algorithm 1b). Two extensions, both chosen by
:class:`~stealkit.extract.explanations.exact.ExactConfig` and driven by the same Algorithm 1 loop:

* **Secant search** (``search="secant"``): uses two membership queries at a bracket's ends: ``f`` is affine on
  each side of a single kink and continuous, so the two affine pieces meet exactly at the crossing; two
  gradient probes at ``t* +- epsilon/2`` confirm it. That finds each crossing in about 2 gradient + 2
  membership queries instead of ``log2(2l/epsilon)`` gradient queries, and locates it exactly.
* **Biased, multi-output networks** (``bias=True``, the default): real networks are
  ``f(x) = W2 ReLU(A x + b) + c`` with ``K`` outputs (a zoo ``mlp2`` folded through its normalisation is one).
  Gradient jumps of the explained logit ``k0`` still give rows ``Z_i = +-W2[k0, i] A_i``; the exact crossing
  point ``x*`` (:func:`exact_crossings`) gives the offset ``c_i = -Z_i x*``, so ``p_i(x) = Z_i x + c_i`` is
  the unit's pre-activation up to a non-zero factor. Every output is then *exactly* linear in the features
  ``[ReLU(p(x)), ReLU(-p(x)), 1]`` (``2h + 1`` unknowns, shared by all outputs: one membership query answers
  all K logits), fitted by least squares on ``2h + 1 + check_points`` membership queries (plus, over
  ``R^d``, mirror images across any hyperplane that too few of them straddle, so every unit is seen on and
  off); the surplus rows verify the fit (:func:`fit_output_layer`, in place of Algorithm 1b).

Limits, precisely: a unit with ``W2[k0, i] = 0`` is invisible to gradients of ``k0`` (so each further search
line explains the next logit); in the pixel box (``domain="box"``) a unit whose hyperplane no search line
crosses is found only if it is ever crossed, and one that is always on over the explored region contributes a
linear term outside ``span(Z)``: we then fit ``ReLU(p)`` plus a linear term fixed by the K output gradients
at one point (K ``explain`` queries) and realise that term with 2K extra ReLU units. Equivalence then holds on
the region the lines and fit points explore, not provably on every corner of ``[0, 1]^d``.
"""

from __future__ import annotations

import math

import numpy as np

from stealkit.extract.explanations.exact_access import GradientAccess, RecoveryFailure, SearchLine, prune
from stealkit.oracle.float64 import TwoLayerReLU

#: a bracket ``(a, b)`` to split, the ``t`` to probe inside it, and the crossing those probes would confirm
Plan = tuple[float, float, list[float], float | None]


# -- the secant search ------------------------------------------------------------------------------------------
def kink(line: SearchLine, a: float, b: float) -> float | None:
    """Where the affine pieces ``f(a) + f'(a) (t - a)`` and ``f(b) + f'(b) (t - b)`` meet along the line (the
    kink if it is single); needs the values and gradients at ``a`` and ``b``."""
    fa, fb = line.vals[a], line.vals[b]
    sa, sb = float(line.grads[a] @ line.v), float(line.grads[b] @ line.v)
    den = sa - sb
    if den == 0 or not math.isfinite(den):
        return None
    t = (fb - fa + sa * a - sb * b) / den
    return t if math.isfinite(t) else None


def secant_plans(line: SearchLine, work: list[tuple[float, float]], eps: float) -> list[Plan]:
    """Probe each bracket at ``t* +- epsilon/2`` around its secant crossing ``t*`` (values at its ends, one
    ``predict`` batch), or at its midpoint when ``t*`` is not well inside it."""
    line.need_f([t for a, b in work for t in (a, b)])
    plans: list[Plan] = []
    for a, b in work:
        t = kink(line, a, b)
        if t is not None and a + eps < t < b - eps:
            plans.append((a, b, [t - eps / 2, t + eps / 2], t))
        else:
            plans.append((a, b, [(a + b) / 2], None))
    return plans


def exact_crossings(line: SearchLine, found: list[tuple[float, float, float | None]]
                    ) -> list[tuple[float, float, float | None]]:
    """Every bracket's exact crossing ``t`` (the kink of its two affine pieces, kept inside the bracket; the
    midpoint if they are parallel): the offsets ``c_i = -Z_i x*`` of the biased network need it."""
    line.need_f([t for a, b, t in found if t is None for t in (a, b)])
    out = []
    for a, b, t in found:
        if t is None:
            t = kink(line, a, b)
            t = (a + b) / 2 if t is None else min(max(t, a), b)
        out.append((a, b, t))
    return out


# -- the biased, multi-output network (in place of Algorithm 1b) ---------------------------------------------------
def _sample(rng: np.random.Generator, access: GradientAccess, n: int, anchors: np.ndarray | None) -> np.ndarray:
    """Points where the fit is made: N(0, I) over R^d; in the box, mixes of anchors and uniform pixels."""
    d = access.d
    if access.domain == "real":
        return rng.standard_normal((n, d)) * np.exp(rng.uniform(math.log(0.3), math.log(3.0), (n, 1)))
    out = rng.uniform(0, 1, (n, d))
    if anchors is not None:
        k = n // 2
        i, j = rng.integers(0, anchors.shape[0], k), rng.integers(0, anchors.shape[0], k)
        lam = rng.uniform(-0.5, 1.5, (k, 1))
        out[:k] = np.clip(anchors[i] + lam * (anchors[j] - anchors[i]), 0, 1)
    return out


def _both_sides(x: np.ndarray, z: np.ndarray, c: np.ndarray, rng: np.random.Generator, k: int = 3) -> np.ndarray:
    """Add mirror images (across hyperplane i) of ``k`` sample points for every unit ``i`` that is on, or
    off, at fewer than ``k`` of them: a unit whose sign never varies over the fit points would otherwise be
    fitted as linear (or absent) there and be wrong where it switches."""
    p = x @ z.T + c
    extra = []
    for i in np.where(((p > 0).sum(0) < k) | ((p < 0).sum(0) < k))[0]:
        pick = rng.choice(x.shape[0], size=min(k, x.shape[0]), replace=False)
        extra.append(x[pick] - (2 * p[pick, i] / float(z[i] @ z[i]))[:, None] * z[i][None, :])
    return np.concatenate([x, *extra]) if extra else x


def fit_output_layer(access: GradientAccess, z: np.ndarray, c: np.ndarray, rng: np.random.Generator,
                     anchors: np.ndarray | None, *, check_points: int, fit_tol: float) -> tuple[TwoLayerReLU, float]:
    """Fit every output exactly on ``[ReLU(p), ReLU(-p), 1]``, ``p = Zx + c`` (membership queries); if that
    does not reproduce the oracle in the pixel box, fit ``[ReLU(p), 1]`` plus the linear term fixed by the
    outputs' gradients at one point (units never crossed). Raises :class:`RecoveryFailure` if neither fits."""
    h = z.shape[0]
    x = _sample(rng, access, 2 * h + 1 + max(check_points, 1), anchors)
    if access.domain == "real":
        x = _both_sides(x, z, c, rng)
    y = access.values(x)
    p = x @ z.T + c
    feats = np.hstack([np.maximum(p, 0), np.maximum(-p, 0), np.ones((x.shape[0], 1))])
    coef, resid = _lstsq(feats, y)
    if resid <= fit_tol:
        w1, b1 = np.vstack([z, -z]), np.r_[c, -c]
        return prune(w1, b1, coef[:-1].T, coef[-1], access.shape, rel=access.prune_tol()), resid
    if access.domain == "real":
        raise RecoveryFailure(f"the recovered hyperplanes do not reproduce the oracle (relative residual "
                              f"{resid:.2e} > {fit_tol:.0e}); a crossing was missed or merged: retry")
    g0 = access.grads_all(x[:1])[0]  # [K, d]: the outputs' gradients at x[0]
    m0 = (p[0] > 0).astype(float)
    feats = np.hstack([np.maximum(p, 0) - m0 * (x @ z.T), np.ones((x.shape[0], 1))])
    coef, resid = _lstsq(feats, y - x @ g0.T)
    if resid > fit_tol:
        raise RecoveryFailure(f"the recovered hyperplanes do not reproduce the oracle (relative residual "
                              f"{resid:.2e} > {fit_tol:.0e}); search more lines or check the hidden width")
    a = coef[:-1].T  # [K, h]
    lin = g0 - (a * m0) @ z  # [K, d]: the part of each output that is linear on the explored region
    k = lin.shape[0]
    w1 = np.vstack([z, lin, -lin])
    w2 = np.hstack([a, np.eye(k), -np.eye(k)])
    return prune(w1, np.r_[c, np.zeros(2 * k)], w2, coef[-1], access.shape, rel=access.prune_tol()), resid


def _lstsq(feats: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    scale = np.linalg.norm(feats, axis=0)
    scale[scale == 0] = 1.0
    coef = np.linalg.lstsq(feats / scale, y, rcond=None)[0] / scale[:, None]
    resid = float(np.abs(feats @ coef - y).max() / max(1.0, float(np.abs(y).max())))
    return coef, resid
