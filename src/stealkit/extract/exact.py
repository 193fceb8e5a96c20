"""Exact recovery of two-layer ReLU networks from gradient queries (Milli et al., FAT* 2019, Sec. 2-3, App. B).

The paper's model is ``f(x) = sum_i w_i ReLU(<A_i, x>)`` with linearly independent rows ``A_i``. Inside a
cell of the hyperplane arrangement ``{A_i x = 0}`` the gradient is constant, and across hyperplane ``i`` it
jumps by exactly ``+-w_i A_i``.

* **Algorithm 1a** (``recoverZ``, Sec. 3.1): pick ``u, v ~ N(0, I)`` and binary-search the segment
  ``u + t v``, ``t in [-l, l]``, with resolution ``epsilon`` for points ``x_l, x_r`` whose gradients differ;
  ``grad f(x_r) - grad f(x_l)`` is a row ``+-w_i A_i`` of ``Z``. Our h binary searches run together, level by
  level, sharing every queried point (``search="bisect"``: the paper's procedure, one ``explain`` batch per
  level). ``search="secant"`` (beyond the paper) uses two membership queries at a bracket's ends: ``f`` is
  affine on each side of a single kink and continuous, so the two affine pieces meet exactly at the crossing;
  two gradient probes at ``t* +- epsilon/2`` confirm it. That finds each crossing in about 2 gradient + 2
  membership queries instead of ``log2(2l/epsilon)`` gradient queries, and locates it exactly.
* **Algorithm 1b** (``recoverS``, Sec. 3.2, App. B): the Chebyshev centre ``y0`` and radius ``r`` of the
  cell of a random ``v`` within ``[0, 1]^d`` by a linear program (SciPy's HiGHS), the points
  ``y0 + (r/2) e_j``, ``h`` of them with ``rank(ZX) = h`` (pivoted QR), their ``2h`` values at ``X`` and
  ``-X``, and the ``2h x 2h`` solve ``M s = [f(X), f(-X)]`` (Eq. 3). App. B writes the LP constraint as
  ``(z_i^T y0 + r) sgn(z_i^T v) >= 0``; we use the Chebyshev-ball constraint it stands for,
  ``sgn(z_i^T v) z_i^T y0 >= r ||z_i||`` (Boyd & Vandenberghe, Sec. 4.3.1).
* Failure is notified as :class:`RecoveryFailure` (Theorem 1: "if the algorithm fails, it notifies of the
  failure"): fewer crossings than ``h`` on the line, an empty LP cell, a singular ``M``, or a fit that does
  not reproduce the oracle. ``lines > 1`` retries on fresh random lines, keeping the rows already found.

**Beyond the paper's model** (``bias=True``, the default): real networks are
``f(x) = W2 ReLU(A x + b) + c`` with ``K`` outputs (a zoo ``mlp2`` folded through its normalisation is one).
Gradient jumps of the explained logit ``k0`` still give rows ``Z_i = +-W2[k0, i] A_i``; the exact crossing
point ``x*`` from the secant step gives the offset ``c_i = -Z_i x*``, so ``p_i(x) = Z_i x + c_i`` is the unit's
pre-activation up to a non-zero factor. Every output is then *exactly* linear in the features
``[ReLU(p(x)), ReLU(-p(x)), 1]`` (``2h + 1`` unknowns, shared by all outputs: one membership query answers
all K logits), fitted by least squares on ``2h + 1 + check_points`` membership queries (plus, over ``R^d``,
mirror images across any hyperplane that too few of them straddle, so every unit is seen on and off); the
surplus rows verify the fit. Limits, precisely: a unit with ``W2[k0, i] = 0`` is invisible to gradients of ``k0`` (so each
further search line explains the next logit); in the pixel box (``domain="box"``) a unit whose hyperplane no search line crosses is
found only if it is ever crossed, and one that is always on over the explored region contributes a linear
term outside ``span(Z)``: we then fit ``ReLU(p)`` plus a linear term fixed by the K output gradients at one
point (K ``explain`` queries) and realise that term with 2K extra ReLU units. Equivalence then holds on the
region the lines and fit points explore, not provably on every corner of ``[0, 1]^d``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.linalg import qr
from scipy.optimize import linprog

from stealkit.errors import InputError, StealkitError
from stealkit.extract.exact_oracle import Domain, TwoLayerReLU
from stealkit.oracle import Oracle, OutputMode

log = logging.getLogger(__name__)

Search = Literal["bisect", "secant"]


class RecoveryFailure(StealkitError):
    """Exact recovery could not certify its answer (the paper's "notifies of the failure")."""


@dataclass(frozen=True)
class ExactConfig:
    """Settings of :func:`recover_two_layer`.

    ``epsilon``: resolution of the search in ``t`` (None: 1e-8 for float64 oracles, 1e-5 for float32).
    ``length``: ``l``, half the search range in the ``real`` domain (None: ``100 h``; Lemma 3 bounds the
    chance that a crossing lies outside by ``2h / (pi l)``). ``search``: ``bisect`` (the paper) or ``secant``.
    ``bias``: False is the paper's bias-free model with Algorithm 1b; True the biased multi-output extension.
    ``output``: the logit whose gradient is asked for on the first line; with ``bias`` each further line
    explains the next logit, so a unit with no weight to one output is still seen through another.
    ``lines``: search lines tried at most (1 = the paper).
    ``check_points``: membership queries beyond the unknowns that verify the fit. ``tol``: relative size of a
    gradient change that counts (None: by precision). ``fit_tol``: largest relative fit residual accepted.
    """

    epsilon: float | None = None
    length: float | None = None
    search: Search = "secant"
    bias: bool = True
    output: int = 0
    lines: int = 10
    check_points: int = 16
    tol: float | None = None
    fit_tol: float | None = None
    seed: int = 0
    batch_size: int = 512

    def __post_init__(self) -> None:
        if self.search not in ("bisect", "secant"):
            raise InputError(f"search must be 'bisect' or 'secant', got {self.search!r}")
        if self.lines < 1:
            raise InputError(f"lines must be at least 1, got {self.lines}")
        for name in ("epsilon", "length", "tol", "fit_tol"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise InputError(f"{name} must be a positive number, got {value}")
        if self.check_points < 0:
            raise InputError(f"check_points must be >= 0, got {self.check_points}")


@dataclass
class ExactRecovery:
    """An equivalent network and how it was found; ``queries`` are the ledger's counts by kind."""

    model: TwoLayerReLU
    rows: np.ndarray
    offsets: np.ndarray
    signs: np.ndarray | None
    queries: dict[str, int]
    lines: int
    hidden_found: int
    fit_residual: float


class GradientAccess:
    """Metered access to the victim: gradients of logit ``output`` (``explain``) and all logits (``predict``).

    Subclassed by :class:`stealkit.extract.exact_mq.MembershipAccess`, which estimates gradients from
    membership queries instead (Algorithm 1-MQ).
    """

    def __init__(self, oracle: Oracle, *, output: int = 0, batch_size: int = 512, need_explain: bool = True):
        if oracle.mode is not OutputMode.LOGITS:
            raise InputError(f"exact recovery needs raw scores but the oracle answers {oracle.mode.value!r}; "
                             "open the victim with --mode logits")
        if need_explain and not callable(getattr(oracle, "explain", None)):
            raise InputError("this oracle gives no explanations; open it with explanations, or use the "
                             "membership-query variant (stealkit extract exact --variant mq)")
        if not 0 <= output < oracle.num_classes:
            raise InputError(f"output must be a class index in [0, {oracle.num_classes - 1}], got {output}")
        self.oracle = oracle
        self.output = int(output)
        self.batch_size = int(batch_size)
        self.shape = tuple(oracle.input_shape)
        self.d = math.prod(self.shape)
        self.num_classes = int(oracle.num_classes)
        self.dtype = getattr(oracle, "dtype", torch.float32)
        self.domain: Domain = getattr(oracle, "domain", "box")
        self.exact = self.dtype == torch.float64

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).reshape(-1, *self.shape).to(self.dtype)

    def _chunks(self, x: np.ndarray) -> list[np.ndarray]:
        return [x[i : i + self.batch_size] for i in range(0, x.shape[0], self.batch_size)]

    def values(self, x: np.ndarray) -> np.ndarray:
        """All logits at rows ``x [n, d]``: n ``predict`` queries."""
        outs = [self.oracle.query(self._tensor(c)).detach().double().numpy() for c in self._chunks(x)]
        return np.concatenate(outs).reshape(x.shape[0], -1)

    def grads(self, x: np.ndarray, output: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Gradients of one logit (default ``output``) at ``x [n, d]`` (n ``explain`` queries), and all
        logits if they came with them (finite differences), else None."""
        return self._explain(x, self.output if output is None else output), None

    def grads_all(self, x: np.ndarray) -> np.ndarray:
        """Gradients of every logit at ``x``: ``[n, K, d]`` (K ``explain`` queries per row)."""
        return np.stack([self._explain(x, k) for k in range(self.num_classes)], axis=1)

    def _explain(self, x: np.ndarray, target: int) -> np.ndarray:
        outs = [self.oracle.explain(self._tensor(c), "gradient", target=target, output="logit")  # type: ignore[attr-defined]
                .detach().double().numpy().reshape(c.shape[0], -1) for c in self._chunks(x)]
        return np.concatenate(outs)

    def default_tol(self) -> float:
        return 1e-9 if self.exact else 1e-4

    def default_epsilon(self) -> float:
        return 1e-8 if self.exact else 1e-5

    def default_fit_tol(self) -> float:
        return 1e-7 if self.exact else 1e-3

    def prune_tol(self) -> float:
        """Hidden units weaker than this (relative) are rounding noise of the fit and are dropped."""
        return 1e-11 if self.exact else 1e-6


def recover_two_layer(oracle: Oracle, hidden: int, config: ExactConfig | None = None, *,
                      anchors: np.ndarray | torch.Tensor | None = None) -> ExactRecovery:
    """Recover a network equivalent to the victim behind ``oracle`` from gradient and membership queries.

    ``oracle`` must answer logits and explain (an :class:`~stealkit.oracle.ExplanationOracle`); its
    ``domain`` attribute (``"real"`` for :class:`~stealkit.extract.exact_oracle.Float64ExplanationOracle`
    over ``R^d``, else the pixel box) decides where the search lines run. ``hidden`` is the victim's hidden
    width ``h`` (the paper's input). ``anchors`` (images the attacker holds, no queries spent on them) seed
    the search lines in the pixel box. Raises :class:`RecoveryFailure` when the answer cannot be certified.
    """
    cfg = config or ExactConfig()
    access = GradientAccess(oracle, output=cfg.output, batch_size=cfg.batch_size)
    return recover_with(access, hidden, cfg, anchors=anchors)


def recover_with(access: GradientAccess, hidden: int, cfg: ExactConfig, *,
                 anchors: np.ndarray | torch.Tensor | None = None) -> ExactRecovery:
    """Algorithm 1 (and its extension) over any :class:`GradientAccess` (gradients or finite differences)."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise InputError(f"hidden must be a positive integer (the victim's hidden width), got {hidden!r}")
    if not cfg.bias and access.domain != "real":
        raise InputError("the paper's Algorithm 1b queries f(-x), outside the pixel box; use bias=True (the "
                         "extension) with a [0, 1] oracle, or a Float64ExplanationOracle with domain='real'")
    anchor_arr = _anchors(anchors, access.d)
    rng = np.random.default_rng(cfg.seed)
    tol = cfg.tol or access.default_tol()
    eps = cfg.epsilon or access.default_epsilon()
    length = cfg.length or 100.0 * hidden
    rows: list[np.ndarray] = []
    offsets: list[float] = []
    last: RecoveryFailure | None = None
    for line in range(1, cfg.lines + 1):
        u, v, t_lo, t_hi = _line(rng, access, anchor_arr, length)
        output = (cfg.output + line - 1) % access.num_classes if cfg.bias else cfg.output
        for row, point in search_line(access, u, v, t_lo, t_hi, eps=eps, tol=tol, search=cfg.search,
                                      exact_points=cfg.bias, cap=64 * hidden + 256, output=output):
            _add_unique(rows, offsets, row, -float(row @ point), 1e3 * tol)
        log.info("line %d: %d distinct hyperplanes of %d; queries %s", line, len(rows), hidden,
                 access.oracle.ledger.as_dict())
        if len(rows) < hidden and (line < cfg.lines or not cfg.bias):
            last = RecoveryFailure(f"found {len(rows)} of {hidden} hidden units on {line} search line(s) "
                                   f"(range {t_hi - t_lo:.3g}, epsilon {eps:.3g}); allow more lines, a larger "
                                   "length, or check the hidden width")
            continue
        z = np.stack(rows) if rows else np.zeros((0, access.d))
        c = np.asarray(offsets)
        try:
            if cfg.bias:
                model, resid = fit_output_layer(access, z, c, rng, anchor_arr, cfg, length)
                signs = None
            else:
                model, signs, resid = recover_signs(access, z, rng, check_points=cfg.check_points,
                                                    fit_tol=cfg.fit_tol or access.default_fit_tol())
        except RecoveryFailure as exc:
            last = exc
            log.info("line %d: %s", line, exc)
            continue
        return ExactRecovery(model=model, rows=z, offsets=c, signs=signs, queries=access.oracle.ledger.as_dict(),
                             lines=line, hidden_found=len(rows), fit_residual=resid)
    assert last is not None
    raise last


# -- Algorithm 1a -------------------------------------------------------------------------------------------
def _anchors(anchors: np.ndarray | torch.Tensor | None, d: int) -> np.ndarray | None:
    if anchors is None:
        return None
    arr = anchors.detach().double().numpy() if isinstance(anchors, torch.Tensor) else np.asarray(anchors, float)
    arr = arr.reshape(arr.shape[0], -1)
    if arr.shape[1] != d or arr.shape[0] < 2:
        raise InputError(f"anchors must be at least two inputs of {d} values each, got {list(arr.shape)}")
    return arr


def _line(rng: np.random.Generator, access: GradientAccess, anchors: np.ndarray | None,
          length: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """A random search line ``u + t v`` and its range of ``t``: ``[-l, l]`` over ``R^d`` (Algorithm 1a), or
    the chord of the pixel box through two (slightly shrunk) points: two anchors or (half the time, or
    always without anchors) two uniform points, the same mixture the output layer is fitted on."""
    d = access.d
    if access.domain == "real":
        return rng.standard_normal(d), rng.standard_normal(d), -length, length
    for _ in range(100):
        if anchors is not None and rng.uniform() < 0.5:
            i, j = rng.choice(anchors.shape[0], size=2, replace=False)
            p, q = anchors[i], anchors[j]
        else:
            p, q = rng.uniform(0, 1, d), rng.uniform(0, 1, d)
        p = 0.5 + 0.98 * (p - 0.5)
        q = 0.5 + 0.98 * (q - 0.5)
        v = q - p + 1e-3 * rng.standard_normal(d)
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.where(v > 0, -p / v, np.where(v < 0, (1 - p) / v, -np.inf))
            hi = np.where(v > 0, (1 - p) / v, np.where(v < 0, -p / v, np.inf))
        t_lo, t_hi = float(lo.max()), float(hi.min())
        if t_hi - t_lo > 1e-6:
            return p, v, t_lo, t_hi
    raise InputError("could not find a search line inside the pixel box; pass distinct anchors")


def _same(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), 1e-300)
    return float(np.linalg.norm(a - b)) <= tol * scale


def _kink(a: float, b: float, fa: float, fb: float, sa: float, sb: float) -> float | None:
    """Where the affine pieces ``fa + sa (t - a)`` and ``fb + sb (t - b)`` meet (the kink if it is single)."""
    den = sa - sb
    if den == 0 or not math.isfinite(den):
        return None
    t = (fb - fa + sa * a - sb * b) / den
    return t if math.isfinite(t) else None


def search_line(access: GradientAccess, u: np.ndarray, v: np.ndarray, t_lo: float, t_hi: float, *, eps: float,
                tol: float, search: Search = "secant", exact_points: bool = True, cap: int = 10_000,
                output: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every gradient change on ``u + t v``, ``t in [t_lo, t_hi]``: pairs ``(row, point)`` with
    ``row = grad f(x_r) - grad f(x_l)`` and ``point`` on the crossed hyperplane (exact when ``exact_points``
    or ``search="secant"``, else the bracket's midpoint). Algorithm 1a's binary searches, run level by level.
    """
    grads: dict[float, np.ndarray] = {}
    vals: dict[float, float] = {}
    k0 = access.output if output is None else output

    def at(ts: list[float]) -> np.ndarray:
        return u[None, :] + np.asarray(ts)[:, None] * v[None, :]

    def need_g(ts: list[float]) -> None:
        new = sorted({t for t in ts if t not in grads})
        if new:
            g, f = access.grads(at(new), k0)
            grads.update(zip(new, g, strict=True))
            if f is not None:
                vals.update(zip(new, f[:, k0].tolist(), strict=True))

    def need_f(ts: list[float]) -> None:
        new = sorted({t for t in ts if t not in vals})
        if new:
            vals.update(zip(new, access.values(at(new))[:, k0].tolist(), strict=True))

    def kink(a: float, b: float) -> float | None:
        return _kink(a, b, vals[a], vals[b], float(grads[a] @ v), float(grads[b] @ v))

    need_g([t_lo, t_hi])
    work = [] if _same(grads[t_lo], grads[t_hi], tol) else [(t_lo, t_hi)]
    found: list[tuple[float, float, float | None]] = []  # (a, b, exact t or None)
    while work:
        if len(grads) > cap:
            raise RecoveryFailure(f"the line search used more than {cap} gradient probes without isolating "
                                  "every crossing; the network may violate the paper's assumptions (more hidden "
                                  "units than inputs, or collinear rows)")
        if search == "secant":
            need_f([t for a, b in work if b - a > eps for t in (a, b)])
        plans: list[tuple[float, float, list[float], float | None]] = []
        for a, b in work:
            if b - a <= eps:
                found.append((a, b, None))
                continue
            t = kink(a, b) if search == "secant" else None
            if t is not None and a + eps < t < b - eps:
                plans.append((a, b, [t - eps / 2, t + eps / 2], t))
            else:
                plans.append((a, b, [(a + b) / 2], None))
        need_g([t for plan in plans for t in plan[2]])
        nxt: list[tuple[float, float]] = []
        for a, b, probes, t in plans:
            if t is not None and _same(grads[probes[0]], grads[a], tol) and _same(grads[probes[1]], grads[b], tol):
                found.append((probes[0], probes[1], t))
                continue
            knots = [a, *probes, b]
            nxt += [(lo, hi) for lo, hi in zip(knots, knots[1:], strict=False)
                    if not _same(grads[lo], grads[hi], tol)]
        work = nxt
    if exact_points:
        need_f([t for a, b, t in found if t is None for t in (a, b)])
    out = []
    for a, b, t in sorted(found):
        if t is None:
            t = kink(a, b) if exact_points else None
            t = (a + b) / 2 if t is None else min(max(t, a), b)
        out.append((grads[b] - grads[a], u + t * v))
    return out


def _add_unique(rows: list[np.ndarray], offsets: list[float], row: np.ndarray, offset: float, tol: float) -> None:
    """Keep ``row`` unless it is the same hyperplane (collinear, same offset) as one already kept."""
    norm = float(np.linalg.norm(row))
    if norm == 0:
        return
    for r, c in zip(rows, offsets, strict=True):
        rn = float(np.linalg.norm(r))
        cos = float(row @ r) / (norm * rn)
        if abs(cos) > 1 - tol and abs(offset / norm - math.copysign(1, cos) * c / rn) <= math.sqrt(tol) * (
                1 + abs(c / rn)):
            return
    rows.append(row)
    offsets.append(offset)


# -- Algorithm 1b and the biased, multi-output extension -----------------------------------------------------
def recover_signs(access: GradientAccess, z: np.ndarray, rng: np.random.Generator, *, check_points: int = 0,
                  fit_tol: float = 1e-7) -> tuple[TwoLayerReLU, np.ndarray, float]:
    """Algorithm 1b with App. B's query points: returns the network ``[ReLU(Zx), ReLU(-Zx)] s`` (one column
    of ``s`` per output), ``s`` and the relative error on ``check_points`` fresh N(0, I) inputs (0 if none).
    Costs ``2h`` membership queries (the square solve cannot detect a wrong Z; the check points can)."""
    h, d = z.shape
    if h > d:
        raise RecoveryFailure(f"{h} rows in {d} dimensions cannot be linearly independent (assumption 3)")
    v = rng.uniform(0, 1, d)
    sign = np.sign(z @ v)
    norms = np.linalg.norm(z, axis=1)
    # maximise r  s.t.  sign_i z_i^T y0 >= r ||z_i||,  0 <= y0 <= 1   (Chebyshev centre of the cell in the box)
    a_ub = np.hstack([-sign[:, None] * z, norms[:, None]])
    res = linprog(np.r_[np.zeros(d), -1.0], A_ub=a_ub, b_ub=np.zeros(h), bounds=[(0, 1)] * d + [(0, None)],
                  method="highs")
    if not res.success or res.x[-1] <= 0:
        raise RecoveryFailure(f"Algorithm 1b: the cell's Chebyshev LP failed ({res.message}); retry")
    y0, r = res.x[:d], float(res.x[-1])
    zy = (z @ y0)[:, None] + (r / 2) * z  # Z [y0 + (r/2) e_1, ..., y0 + (r/2) e_d]
    cols = qr(zy, pivoting=True, mode="economic")[2][:h]
    x = y0[:, None] + (r / 2) * np.eye(d)[:, cols]
    zx = z @ x
    if np.linalg.matrix_rank(zx) < h:
        raise RecoveryFailure("Algorithm 1b: no h points of the cell give rank(ZX) = h")
    f = access.values(np.concatenate([x.T, -x.T]))
    pos, neg = np.maximum(zx, 0).T, np.maximum(-zx, 0).T
    m = np.block([[pos, neg], [neg, pos]])
    if np.linalg.cond(m) > 1e12:
        raise RecoveryFailure("Algorithm 1b: the 2h x 2h system is singular; retry with a fresh line")
    s = np.linalg.solve(m, f)
    w1 = np.vstack([z, -z])
    model = _prune(w1, np.zeros(2 * h), s.T, np.zeros(f.shape[1]), access.shape, rel=access.prune_tol())
    resid = 0.0
    if check_points > 0:
        xc = rng.standard_normal((check_points, d))
        fc = access.values(xc)
        resid = float(np.abs(model.numpy_forward(xc) - fc).max() / max(1.0, float(np.abs(fc).max())))
        if resid > fit_tol:
            raise RecoveryFailure(f"Algorithm 1b's network disagrees with the oracle (relative error {resid:.2e}); "
                                  "two crossings fell within epsilon or the model has biases (use bias=True)")
    return model, s, resid


def _sample(rng: np.random.Generator, access: GradientAccess, n: int, anchors: np.ndarray | None,
            length: float) -> np.ndarray:
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
                     anchors: np.ndarray | None, cfg: ExactConfig, length: float) -> tuple[TwoLayerReLU, float]:
    """Fit every output exactly on ``[ReLU(p), ReLU(-p), 1]``, ``p = Zx + c`` (membership queries); if that
    does not reproduce the oracle in the pixel box, fit ``[ReLU(p), 1]`` plus the linear term fixed by the
    outputs' gradients at one point (units never crossed). Raises :class:`RecoveryFailure` if neither fits."""
    h = z.shape[0]
    fit_tol = cfg.fit_tol or access.default_fit_tol()
    x = _sample(rng, access, 2 * h + 1 + max(cfg.check_points, 1), anchors, length)
    if access.domain == "real":
        x = _both_sides(x, z, c, rng)
    y = access.values(x)
    p = x @ z.T + c
    feats = np.hstack([np.maximum(p, 0), np.maximum(-p, 0), np.ones((x.shape[0], 1))])
    coef, resid = _lstsq(feats, y)
    if resid <= fit_tol:
        w1, b1 = np.vstack([z, -z]), np.r_[c, -c]
        return _prune(w1, b1, coef[:-1].T, coef[-1], access.shape, rel=access.prune_tol()), resid
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
    return _prune(w1, np.r_[c, np.zeros(2 * k)], w2, coef[-1], access.shape, rel=access.prune_tol()), resid


def _lstsq(feats: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    scale = np.linalg.norm(feats, axis=0)
    scale[scale == 0] = 1.0
    coef = np.linalg.lstsq(feats / scale, y, rcond=None)[0] / scale[:, None]
    resid = float(np.abs(feats @ coef - y).max() / max(1.0, float(np.abs(y).max())))
    return coef, resid


def _prune(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, shape: tuple[int, ...], *,
           rel: float = 1e-11) -> TwoLayerReLU:
    """Drop hidden units whose outgoing weights are zero up to rounding (``rel`` of the largest unit)."""
    out_norm = np.abs(w2).max(axis=0) * np.maximum(np.linalg.norm(w1, axis=1), np.abs(b1))
    keep = out_norm > rel * max(float(out_norm.max(initial=0.0)), 1e-300)
    if not keep.any():
        keep[:1] = True
    return TwoLayerReLU(w1[keep], b1[keep], w2[:, keep], np.asarray(b2).reshape(-1), shape)


def relative_error(victim: torch.nn.Module, recovered: torch.nn.Module, x: torch.Tensor) -> float:
    """``max |f_hat(x) - f(x)| / max |f(x)|`` over a batch (the benchmark's exactness measure), in float64."""
    with torch.no_grad():
        f = victim(x.double()).double()
        g = recovered(x.double()).double()
    return float((g - f).abs().max() / f.abs().max().clamp_min(1e-300))
