"""Starting points from natural images the attacker owns (its unlabelled pool), one query per candidate.

A decision-based attack needs an adversarial start, and the start decides much of where it ends. Brendel et
al. (ICLR 2018, Boundary Attack, Sec. 3 "Initialisation") name two ways: noise, or "a sample from the target
class" (an image the model already puts elsewhere); Chen et al. (HopSkipJumpAttack, IEEE S&P 2020, Sec. 4)
start untargeted runs from noise and targeted ones from an image of the target class, and Cheng et al.
(OPT-attack, ICLR 2019, Sec. 3.1 and Alg. 1's initialisation) search many start directions, each by the
distance ``g(theta)`` to the boundary along it, keeping the nearest. Here the directions are the rays from
the attacked image ``x`` to the attacker's own natural images ``x'`` (never the attacked, reported or
validation images): the pool is ranked by pixel L2 distance to ``x`` (no query), and each of the nearest
``tries`` candidates is tested with **one** query, at the point of the ray ``x -> x'`` at the best distance
found so far (or ``x'`` itself when that is nearer); only a candidate whose point is adversarial, so nearer
than the current best, pays a binary search (as :func:`stealkit.evade.starts.best_of_noise` does for noise).
The pool's labels are never used: a candidate of ``x``'s own class simply costs its one query and loses.

All images move in lock-step: each try is one batch of oracle calls, the winners' binary searches another few.
"""

from __future__ import annotations

import math

import torch

from stealkit.errors import InputError
from stealkit.evade.decision import LabelAccess, OutOfQueries, binary_search, blend


def check_pool(pool: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The pool as float images of ``shape`` in [0, 1]; one-line :class:`InputError` otherwise."""
    if not isinstance(pool, torch.Tensor) or pool.dim() != len(shape) + 1 or tuple(pool.shape[1:]) != tuple(shape):
        got = list(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__
        raise InputError(f"the start pool must be images of shape [N, {', '.join(map(str, shape))}], got {got}")
    if pool.shape[0] == 0:
        raise InputError("the start pool is empty")
    p = pool.detach().float()
    if not bool(torch.isfinite(p).all()):
        raise InputError("the start pool has NaN or infinite pixels")
    if float(p.min()) < 0 or float(p.max()) > 1:
        raise InputError(f"the start pool's pixels must be in [0, 1], got [{float(p.min()):.3g}, {float(p.max()):.3g}]")
    return p


def nearest(pool: torch.Tensor, x: torch.Tensor, k: int, chunk: int = 4096) -> torch.Tensor:
    """Indices ``[B, min(k, N)]`` of the ``k`` pool images nearest to each ``x`` in pixel L2, nearest first (no
    query). Ties go to the lower index."""
    k = min(k, pool.shape[0])
    xf = x.detach().float().flatten(1).cpu()
    dist = torch.cat([torch.cdist(xf.double(), pool[i : i + chunk].flatten(1).double().cpu())
                      for i in range(0, pool.shape[0], chunk)], dim=1)
    # a stable sort keeps equal distances in index order (deterministic across runs)
    return torch.sort(dist, dim=1, stable=True).indices[:, :k]


def best_of_pool(access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, pool: torch.Tensor,
                 *, tries: int, tol: float) -> torch.Tensor:
    """Improve the verified boundary points ``best`` (of examples ``idx``, rows aligned with ``x``) with the
    rays to the ``tries`` pool images nearest to each ``x``; returns the new points, every one verified
    adversarial. Stops early (the points found so far kept) when the caps bind."""
    best = best.clone()
    if tries <= 0 or idx.numel() == 0:
        return best
    cand = nearest(pool, x, tries)
    rows = torch.arange(idx.numel())
    for j in range(cand.shape[1]):
        sel = rows[access.room(idx, 1)]
        if sel.numel() == 0:
            break
        d = sel.to(x.device)
        other = pool[cand[sel, j]].to(x.device, x.dtype)
        far = (other - x[d]).flatten(1).norm(dim=1)
        now = (best[d] - x[d]).flatten(1).norm(dim=1)
        probe = blend(x[d], other, (now / far.clamp_min(1e-12)).clamp(max=1.0))
        try:
            adv = access.is_adv(probe, idx[sel]).cpu()
        except OutOfQueries:
            break
        win = sel[adv]
        if win.numel():
            w = win.to(x.device)
            best[w] = binary_search(access, x[w], probe[adv.to(x.device)], idx[win], tol)
    return best


def start_norms(x: torch.Tensor, best: torch.Tensor, found: torch.Tensor) -> list[float]:
    """Each example's L2 distance of its start (``inf`` where none was found): what the study logs."""
    d = (best - x).flatten(1).norm(dim=1).tolist()
    return [v if bool(f) else math.inf for v, f in zip(d, found.tolist(), strict=True)]


__all__ = ["best_of_pool", "check_pool", "nearest", "start_norms"]
