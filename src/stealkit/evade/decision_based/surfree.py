"""SurFree (Maho, Furon and Le Merrer, "SurFree: a fast surrogate-free black-box attack", CVPR 2021), L2,
label-only: no gradient estimate, only searches along circles through random orthogonal directions.

Sec. 3 of the paper (Alg. 1), at a boundary point ``x_b`` of the original ``x`` (``D = |x_b - x|``,
``u = (x_b - x) / D``), repeat:

1. draw a random direction ``t`` (Sec. 3.3: full-resolution Gaussian noise, ``basis="full"``, or Gaussian
   noise on the lowest ``freq`` share of the 2-D DCT frequencies, ``basis="dct"``, Sec. 5.2) and make it
   orthogonal (Gram-Schmidt) to ``u`` and to the last ``n_ortho`` directions tried: ``v``;
2. sign search (Sec. 3.2): on the circle ``z(a) = x + D cos(a) (cos(a) u + sin(a) v)`` (the circle with
   diameter ``[x, x_b]``; ``|z(a) - x| = D cos(a)``) try ``a = +-theta_max (1 - k / T)``, ``k = 0..T-1``, one
   query each, until one is adversarial; ``theta_max`` shrinks by ``rho`` after a failed direction and grows
   by ``1 / rho`` after a successful one;
3. on success, bisect the angle between the adversarial ``a`` and the next one out (clean; pushed out while
   adversarial) until ``1 - cos`` is known to ``bs_gamma`` or ``bs_steps`` bisections (Sec. 3.2's "binary
   search on theta"); the new ``x_b`` is ``z`` at the adversarial end, nearer by the factor ``cos(a)``.

All examples move in lock-step (each stage one batch of oracle calls); every query goes through
:class:`~stealkit.evade.decision_based.decision.LabelAccess` (the ledger, the per-example cap); every point kept was queried
and found adversarial. :func:`hopskipjump_surfree` runs HopSkipJump for a ``share`` of the per-image budget
and SurFree on its result for the rest (a finishing phase).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stealkit.errors import InputError
from stealkit.evade.base import TINY, AttackResult, check_batch, check_target
from stealkit.evade.decision_based.decision import (
    LabelAccess,
    binary_search,
    check_starts,
    decision_result,
    find_starts,
    lockstep,
)
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.semicircle import arc_points
from stealkit.evade.decision_based.subspace import dct_directions, dct_matrix
from stealkit.oracle import Oracle


@dataclass(frozen=True)
class SurFreeConfig:
    """``theta_max`` in degrees (the paper's 30); ``evals``: the paper's ``T`` (angles tried per sign)."""

    steps: int = 100_000
    theta_max: float = 30.0
    rho: float = 0.98
    evals: int = 3
    bs_gamma: float = 0.01
    bs_steps: int = 10
    n_ortho: int = 100
    basis: str = "full"
    freq: float = 0.5
    init_trials: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.evals < 1 or self.bs_steps < 0 or self.n_ortho < 0 or self.init_trials < 1:
            raise InputError("steps, bs_steps and n_ortho must be >= 0; evals and init_trials positive")
        if not (0 < self.theta_max < 90 and 0 < self.rho <= 1 and 0 < self.bs_gamma < 1):
            raise InputError("theta_max must be in (0, 90) degrees, rho in (0, 1], bs_gamma in (0, 1)")
        if self.basis not in ("full", "dct") or not (0 < self.freq <= 1):
            raise InputError(f"basis must be 'full' or 'dct' and freq in (0, 1], got {self.basis!r}, {self.freq!r}")


def surfree(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
            target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
            max_queries: int | None = None, config: SurFreeConfig | None = None, batch_size: int = 256,
            used: torch.Tensor | None = None) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` with SurFree using only labels (module docstring). ``used``: queries each
    example already spent under the same ``max_queries`` (a finishing phase); ``queries`` is the ledger's."""
    cfg = config or SurFreeConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    if cfg.basis == "dct" and x.dim() != 4:
        raise InputError("basis='dct' needs [C, H, W] images")
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    if used is not None:
        access.used += used.long().cpu()
    gen = torch.Generator().manual_seed(cfg.seed)
    if starting_points is not None:
        best, found = check_starts(access, x, starting_points)
    else:
        best, found = find_starts(access, x, trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    if idx.numel():
        d = idx.to(x.device)
        tol = 1.0 / (x[0].numel() ** 1.5)
        best[d] = binary_search(access, x[d], best[d], idx, tol)
        best[d] = _Search(access, x[d], idx, cfg, gen).run(best[d])
    res = decision_result(access, x, y, tgt, best, found)
    if used is not None:
        res.extra["queries_per_example"] = access.used.clone()
    return res


def hopskipjump_surfree(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, max_queries: int, share: float,
                        hsj: HopSkipJumpConfig | None = None, config: SurFreeConfig | None = None,
                        batch_size: int = 256) -> AttackResult:
    """HopSkipJump for ``share`` of the per-image budget, then SurFree from its points for the rest (one
    query re-checks each start); the per-image total never passes ``max_queries``."""
    if not 0 < share < 1:
        raise InputError(f"share must be in (0, 1), got {share!r}")
    if max_queries is None or max_queries < 2:
        raise InputError("a finishing phase needs a per-image budget (max_queries >= 2)")
    start = oracle.ledger.as_dict()
    first = hopskipjump(oracle, x, y, max_queries=max(1, int(share * max_queries)), config=hsj,
                        batch_size=batch_size)
    ok = first.success.cpu()
    out = surfree(oracle, x[ok.to(x.device)], y[ok.to(y.device)], starting_points=first.x_adv[ok.to(x.device)],
                  max_queries=max_queries, config=config, batch_size=batch_size,
                  used=first.extra["queries_per_example"][ok])
    x_adv, per = first.x_adv.clone(), first.extra["queries_per_example"].clone()
    x_adv[ok.to(x.device)] = out.x_adv
    per[ok] = out.extra["queries_per_example"]
    success = first.success.clone()
    success[ok.to(success.device)] = out.success
    now = oracle.ledger.as_dict()
    return AttackResult(x_adv=x_adv, success=success, norms=(x_adv - x).flatten(1).norm(dim=1), norm=first.norm,
                        labels=first.labels, target=first.target,
                        queries={k: now.get(k, 0) - start.get(k, 0) for k in now},
                        extra={"queries_per_example": per})


class _Search:
    """SurFree's iterations for a batch of examples with verified boundary points (rows aligned with ``x``)."""

    def __init__(self, access: LabelAccess, x: torch.Tensor, idx: torch.Tensor, cfg: SurFreeConfig,
                 gen: torch.Generator) -> None:
        self.access, self.x, self.idx, self.cfg, self.gen = access, x, idx, cfg, gen
        n, dim = x.shape[0], x[0].numel()
        #: the ring of kept directions: at most ``dim - 2`` (room for the current direction and a new one)
        self.ring = max(0, min(cfg.n_ortho, dim - 2))
        self.hist = torch.zeros(n, self.ring, dim, device=x.device)
        self.count = 0
        self.theta_max = torch.full((n,), math.radians(cfg.theta_max), device=x.device)

    def run(self, best: torch.Tensor) -> torch.Tensor:
        lockstep(self.access, self.idx, self.cfg.steps, lambda sel: self._step(best, sel))
        return best

    def _directions(self, sel: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Random unit directions for rows ``sel`` orthogonal to ``u`` and to the directions kept."""
        x, cfg = self.x, self.cfg
        if cfg.basis == "dct":
            r = dct_directions(sel.numel(), tuple(x.shape[1:]), cfg.freq, self.gen, x.device).flatten(1)
        else:
            r = torch.randn((sel.numel(), x[0].numel()), generator=self.gen).to(x.device)
        d = sel.to(x.device)
        hist = self.hist[d, : min(self.count, self.ring)]
        for _ in range(2 if hist.shape[1] else 1):  # alternating projections: off the kept ones, off u
            if hist.shape[1]:
                r = r - torch.einsum("bk,bkd->bd", torch.einsum("bkd,bd->bk", hist, r), hist)
            r = r - (r * u).sum(1, keepdim=True) * u  # last: exactly orthogonal to u, as the circle needs
        return r / r.norm(dim=1, keepdim=True).clamp_min(TINY)

    def _ask(self, best: torch.Tensor, rows: torch.Tensor, u: torch.Tensor, v: torch.Tensor, dist: torch.Tensor,
             angle: torch.Tensor) -> torch.Tensor:
        """Query ``z(angle)`` for ``rows`` and keep the adversarial ones in ``best`` (every angle asked about is
        farther out than the row's best so far, so nearer). Returns which were adversarial."""
        x = self.x
        d = rows.to(x.device)
        pts = arc_points(x[d], u[d].view_as(x[d]), v[d].view_as(x[d]), dist[d], angle)
        adv = self.access.is_adv(pts, self.idx[rows]).to(x.device)
        best[d[adv]] = pts[adv]
        return adv

    def _step(self, best: torch.Tensor, sel: torch.Tensor) -> None:
        """One direction for each row of ``sel``: sign search, then bisection of the angle (in place)."""
        x, cfg, access = self.x, self.cfg, self.access
        n = x.shape[0]
        d = sel.to(x.device)
        diff = (best[d] - x[d]).flatten(1)
        dist_s = diff.norm(dim=1).clamp_min(TINY)
        u_s = diff / dist_s.unsqueeze(1)
        v_s = self._directions(sel, u_s)
        # full-size views indexed by row (rows not in sel are never asked about)
        u = torch.zeros(n, u_s.shape[1], device=x.device)
        v, dist = torch.zeros_like(u), torch.ones(n, device=x.device)
        u[d], v[d], dist[d] = u_s, v_s, dist_s
        if self.ring:  # a ring of the last directions (each orthogonal to the others in it)
            self.hist[d, self.count % self.ring] = v_s
            self.count += 1
        lo = torch.zeros(n, device=x.device)
        found = torch.zeros(n, dtype=torch.bool)
        theta = self.theta_max.clone()
        for k in range(cfg.evals):
            for sign in (1.0, -1.0):
                todo = sel[~found[sel]]
                todo = todo[access.room(self.idx[todo], 1)] if todo.numel() else todo
                if todo.numel() == 0:
                    continue
                a = sign * theta[todo.to(x.device)] * (1 - k / cfg.evals)
                adv = self._ask(best, todo, u, v, dist, a)
                t = todo.to(x.device)
                lo[t[adv]] = a[adv]
                found[todo[adv.cpu()]] = True
        hit = found[sel].to(x.device)
        self.theta_max[d] = torch.where(hit, self.theta_max[d] / cfg.rho, self.theta_max[d] * cfg.rho)
        won = sel[found[sel]]
        if won.numel() == 0:
            return
        self._bisect(best, won, u, v, dist, lo, theta)

    def _bisect(self, best: torch.Tensor, won: torch.Tensor, u: torch.Tensor, v: torch.Tensor, dist: torch.Tensor,
                lo: torch.Tensor, theta: torch.Tensor) -> None:
        """Push the angle out while adversarial, then bisect it; ``best`` keeps the adversarial end."""
        x, cfg, access = self.x, self.cfg, self.access
        sign = torch.sign(lo)
        step = theta / cfg.evals
        hi = torch.clamp(lo.abs() + step, max=math.pi / 2) * sign
        pushing = won[((lo.abs() >= theta - 1e-12) & (hi.abs() < math.pi / 2))[won.to(x.device)].cpu()]
        while pushing.numel():
            pushing = pushing[access.room(self.idx[pushing], 1)]
            if pushing.numel() == 0:
                break
            p = pushing.to(x.device)
            adv = self._ask(best, pushing, u, v, dist, hi[p])
            lo[p[adv]] = hi[p[adv]]
            hi[p[adv]] = torch.clamp(hi[p[adv]].abs() + step[p[adv]], max=math.pi / 2) * sign[p[adv]]
            pushing = pushing[adv.cpu() & (hi[p].abs() < math.pi / 2).cpu()]
        for _ in range(cfg.bs_steps):
            w = won.to(x.device)
            gap = (torch.cos(lo[w]) - torch.cos(hi[w])).abs() > cfg.bs_gamma
            todo = won[gap.cpu()]
            todo = todo[access.room(self.idx[todo], 1)] if todo.numel() else todo
            if todo.numel() == 0:
                break
            t = todo.to(x.device)
            mid = (lo[t] + hi[t]) / 2
            adv = self._ask(best, todo, u, v, dist, mid)
            lo[t] = torch.where(adv, mid, lo[t])
            hi[t] = torch.where(adv, hi[t], mid)


__all__ = ["SurFreeConfig", "dct_matrix", "hopskipjump_surfree", "surfree"]
