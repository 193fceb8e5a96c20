"""Exact recovery of two-layer ReLU networks from gradient queries (Milli et al., FAT* 2019, Sec. 2-3, App. B).

The paper's model is ``f(x) = sum_i w_i ReLU(<A_i, x>)`` with linearly independent rows ``A_i``. Inside a
cell of the hyperplane arrangement ``{A_i x = 0}`` the gradient is constant, and across hyperplane ``i`` it
jumps by exactly ``+-w_i A_i``. The paper's box, Algorithm 1 (Sec. 3), and the functions that follow it:

    learnModel(h, epsilon, l):            -> recover_two_layer / recover_with
        Z <- recoverZ(h, epsilon, l)      -> search_line (Algorithm 1a, Sec. 3.1)
        s <- recoverS(Z)                  -> recover_signs (Algorithm 1b, Sec. 3.2, App. B)
        return Z, s

* **Algorithm 1a** (``recoverZ``, Sec. 3.1): pick ``u, v ~ N(0, I)`` and binary-search the segment
  ``u + t v``, ``t in [-l, l]``, with resolution ``epsilon`` for points ``x_l, x_r`` whose gradients differ;
  ``grad f(x_r) - grad f(x_l)`` is a row ``+-w_i A_i`` of ``Z``. Our h binary searches run together, level by
  level, sharing every queried point (``search="bisect"``: the paper's procedure, one ``explain`` batch per
  level).
* **Algorithm 1b** (``recoverS``, Sec. 3.2, App. B): the Chebyshev centre ``y0`` and radius ``r`` of the
  cell of a random ``v`` within ``[0, 1]^d`` by a linear program (SciPy's HiGHS), the points
  ``y0 + (r/2) e_j``, ``h`` of them with ``rank(ZX) = h`` (pivoted QR), their ``2h`` values at ``X`` and
  ``-X``, and the ``2h x 2h`` solve ``M s = [f(X), f(-X)]`` (Eq. 3). App. B writes the LP constraint as
  ``(z_i^T y0 + r) sgn(z_i^T v) >= 0``; we use the Chebyshev-ball constraint it stands for,
  ``sgn(z_i^T v) z_i^T y0 >= r ||z_i||`` (Boyd & Vandenberghe, Sec. 4.3.1).
* Failure is notified as :class:`RecoveryFailure` (Theorem 1: "if the algorithm fails, it notifies of the
  failure"): fewer crossings than ``h`` on the line, an empty LP cell, a singular ``M``, or a fit that does
  not reproduce the oracle. ``lines > 1`` retries on fresh random lines, keeping the rows already found.

``ExactConfig(search="bisect", bias=False, lines=1)`` is the paper's algorithm. The defaults add the extension
of :mod:`stealkit.extract.explanations.exact_secant`: a secant step in the search (``search="secant"``) and biased,
multi-output networks (``bias=True``, whose output layer is fitted there instead of by Algorithm 1b).
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

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.explanations.exact_access import GradientAccess, RecoveryFailure, SearchLine, prune
from stealkit.extract.explanations.exact_secant import Plan, exact_crossings, fit_output_layer, secant_plans
from stealkit.oracle import Oracle
from stealkit.oracle.float64 import TwoLayerReLU

__all__ = ["ExactConfig", "ExactRecovery", "GradientAccess", "RecoveryFailure", "recover_signs",
           "recover_two_layer", "recover_with", "relative_error", "search_line"]

log = logging.getLogger(__name__)

Search = Literal["bisect", "secant"]


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


# -- Algorithm 1: learnModel ----------------------------------------------------------------------------------
def recover_two_layer(oracle: Oracle, hidden: int, config: ExactConfig | None = None, *,
                      anchors: np.ndarray | torch.Tensor | None = None) -> ExactRecovery:
    """Recover a network equivalent to the victim behind ``oracle`` from gradient and membership queries.

    ``oracle`` must answer logits and explain (an :class:`~stealkit.oracle.ExplanationOracle`); its
    ``domain`` attribute (``"real"`` for :class:`~stealkit.oracle.float64.Float64ExplanationOracle`
    over ``R^d``, else the pixel box) decides where the search lines run. ``hidden`` is the victim's hidden
    width ``h`` (the paper's input). ``anchors`` (images the attacker holds, no queries spent on them) seed
    the search lines in the pixel box. Raises :class:`RecoveryFailure` when the answer cannot be certified.
    """
    cfg = config or ExactConfig()
    access = GradientAccess(oracle, output=cfg.output, batch_size=cfg.batch_size)
    return recover_with(access, hidden, cfg, anchors=anchors)


def recover_with(access: GradientAccess, hidden: int, cfg: ExactConfig, *,
                 anchors: np.ndarray | torch.Tensor | None = None) -> ExactRecovery:
    """Algorithm 1 (and its extension) over any :class:`GradientAccess` (gradients or finite differences):
    ``Z`` from the gradient changes on search lines (Algorithm 1a), then ``s`` (Algorithm 1b) or, with
    ``bias``, the extension's output-layer fit."""
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
        log.info("line %d: %d distinct hyperplanes of %d; %s queries", line, len(rows), hidden,
                 fmt.queries(access.oracle.ledger.as_dict()))
        if len(rows) < hidden and (line < cfg.lines or not cfg.bias):
            last = RecoveryFailure(f"found {len(rows)} of {hidden} hidden units on {line} search line(s) "
                                   f"(range {t_hi - t_lo:.3g}, epsilon {eps:.3g}); allow more lines, a larger "
                                   "length, or check the hidden width")
            continue
        z = np.stack(rows) if rows else np.zeros((0, access.d))
        c = np.asarray(offsets)
        fit_tol = cfg.fit_tol or access.default_fit_tol()
        try:
            if cfg.bias:
                model, resid = fit_output_layer(access, z, c, rng, anchor_arr, check_points=cfg.check_points,
                                                fit_tol=fit_tol)
                signs = None
            else:
                model, signs, resid = recover_signs(access, z, rng, check_points=cfg.check_points, fit_tol=fit_tol)
        except RecoveryFailure as exc:
            last = exc
            log.info("line %d: %s", line, exc)
            continue
        return ExactRecovery(model=model, rows=z, offsets=c, signs=signs, queries=access.oracle.ledger.as_dict(),
                             lines=line, hidden_found=len(rows), fit_residual=resid)
    assert last is not None
    raise last


# -- Algorithm 1a: recoverZ ----------------------------------------------------------------------------------
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


def bisect_plans(line: SearchLine, work: list[tuple[float, float]], eps: float) -> list[Plan]:
    """binarySearch's step (Algorithm 1a, lines 9-16): probe each bracket ``[t_l, t_r]`` at its midpoint."""
    return [(a, b, [(a + b) / 2], None) for a, b in work]


def search_line(access: GradientAccess, u: np.ndarray, v: np.ndarray, t_lo: float, t_hi: float, *, eps: float,
                tol: float, search: Search = "secant", exact_points: bool = True, cap: int = 10_000,
                output: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every gradient change on ``u + t v``, ``t in [t_lo, t_hi]``: pairs ``(row, point)`` with
    ``row = grad f(x_r) - grad f(x_l)`` and ``point`` on the crossed hyperplane (exact when ``exact_points``
    or ``search="secant"``, else the bracket's midpoint). Algorithm 1a's binary searches, run level by level:
    a bracket whose ends' gradients differ is split at its probes until it is at most ``epsilon`` wide
    (line 11: return ``grad f(x_r) - grad f(x_l)``). ``search="secant"`` probes next to the secant crossing
    instead of the midpoint, and a crossing its probes confirm is found at once
    (:func:`~stealkit.extract.explanations.exact_secant.secant_plans`).
    """
    line = SearchLine(access, u, v, output)
    plan = secant_plans if search == "secant" else bisect_plans
    line.need_g([t_lo, t_hi])
    work = [(t_lo, t_hi)] if line.differs(t_lo, t_hi, tol) else []
    found: list[tuple[float, float, float | None]] = []  # (a, b, exact t or None)
    while work:
        if len(line.grads) > cap:
            raise RecoveryFailure(f"the line search used more than {cap} gradient probes without isolating "
                                  "every crossing; the network may violate the paper's assumptions (more hidden "
                                  "units than inputs, or collinear rows)")
        found += [(a, b, None) for a, b in work if b - a <= eps]
        plans = plan(line, [(a, b) for a, b in work if b - a > eps], eps)
        line.need_g([t for p in plans for t in p[2]])
        nxt: list[tuple[float, float]] = []
        for a, b, probes, t in plans:
            if t is not None and not line.differs(probes[0], a, tol) and not line.differs(probes[1], b, tol):
                found.append((probes[0], probes[1], t))  # the secant crossing, confirmed
                continue
            knots = [a, *probes, b]
            nxt += [(lo, hi) for lo, hi in zip(knots, knots[1:], strict=False) if line.differs(lo, hi, tol)]
        work = nxt
    found = sorted(found)
    if exact_points:
        found = exact_crossings(line, found)
    return [(line.grads[b] - line.grads[a], u + ((a + b) / 2 if t is None else t) * v) for a, b, t in found]


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


# -- Algorithm 1b: recoverS ----------------------------------------------------------------------------------
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
    model = prune(w1, np.zeros(2 * h), s.T, np.zeros(f.shape[1]), access.shape, rel=access.prune_tol())
    resid = 0.0
    if check_points > 0:
        xc = rng.standard_normal((check_points, d))
        fc = access.values(xc)
        resid = float(np.abs(model.numpy_forward(xc) - fc).max() / max(1.0, float(np.abs(fc).max())))
        if resid > fit_tol:
            raise RecoveryFailure(f"Algorithm 1b's network disagrees with the oracle (relative error {resid:.2e}); "
                                  "two crossings fell within epsilon or the model has biases (use bias=True)")
    return model, s, resid


def relative_error(victim: torch.nn.Module, recovered: torch.nn.Module, x: torch.Tensor) -> float:
    """``max |f_hat(x) - f(x)| / max |f(x)|`` over a batch (the benchmark's exactness measure), in float64.

    Each model sees ``x`` on its own device (the victim may sit on a GPU, the recovery on the CPU)."""
    from stealkit.device import module_device

    with torch.no_grad():
        f = victim(x.double().to(module_device(victim))).double().cpu()
        g = recovered(x.double().to(module_device(recovered))).double().cpu()
    return float((g - f).abs().max() / f.abs().max().clamp_min(1e-300))
