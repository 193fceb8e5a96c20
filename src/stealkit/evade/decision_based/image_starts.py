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
than the current best, pays a binary search (as :func:`stealkit.evade.decision_based.starts.best_of_noise` does for noise).
The pool's labels are never used: a candidate of ``x``'s own class simply costs its one query and loses.
With ``spread = c`` the candidates are instead the nearest pool image of each of ``c`` k-means clusters of the
pool (Lloyd's algorithm on the pixels, no query), nearest first: a spread over the pool's modes, so that the
tries are not all spent on images like ``x`` (which the victim likely puts in ``x``'s class).

All images move in lock-step: each try is one batch of oracle calls, the winners' binary searches another few.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess
from stealkit.evade.decision_based.starts import improve_along
from stealkit.kmeans import kmeans as shared_kmeans


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


def kmeans(pool: torch.Tensor, k: int, *, iters: int = 10, seed: int = 0) -> torch.Tensor:
    """Cluster labels [N] of the pool's images: Lloyd's algorithm in pixel space (double precision) from ``k``
    distinct images drawn with ``seed`` (deterministic for a seed)."""
    return shared_kmeans(pool.flatten(1).double().cpu(), k, torch.Generator().manual_seed(seed), iters=iters,
                         init="random")


def spread(pool: torch.Tensor, x: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[B, <= k]`` of the nearest pool image to each ``x`` in each cluster of ``labels``, the
    clusters ordered by that distance (nearest first; no query)."""
    xf = x.detach().flatten(1).double().cpu()
    dist = torch.cdist(xf, pool.flatten(1).double().cpu())
    firsts, dists = [], []
    for c in torch.unique(labels).tolist():
        members = (labels == c).nonzero().squeeze(1)
        sub = dist[:, members]
        firsts.append(members[sub.argmin(1)])
        dists.append(sub.min(1).values)
    order = torch.sort(torch.stack(dists, 1), dim=1, stable=True).indices[:, :k]
    return torch.stack(firsts, 1).gather(1, order)


def best_of_pool(access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, pool: torch.Tensor,
                 *, tries: int, tol: float, clusters: int = 0) -> torch.Tensor:
    """Improve the verified boundary points ``best`` (of examples ``idx``, rows aligned with ``x``) with the
    rays to the ``tries`` pool images nearest to each ``x`` (``clusters > 0``: the nearest of each of that
    many k-means clusters, nearest first); returns the new points, every one verified adversarial. Stops early
    (the points found so far kept) when the caps bind."""
    if tries <= 0 or idx.numel() == 0:
        return best.clone()
    cand = spread(pool, x, kmeans(pool, clusters), tries) if clusters else nearest(pool, x, tries)

    def images(j: int, sel: torch.Tensor) -> torch.Tensor:
        return pool[cand[sel, j]].to(x.device, x.dtype)

    return improve_along(access, x, best, idx, tries=cand.shape[1], tol=tol, ends=images)


@dataclass(frozen=True, eq=False)
class PoolStarts:
    """:func:`best_of_pool` on the attacker's images ``pool`` (checked by :func:`check_pool`) as a
    :class:`~stealkit.evade.decision_based.starts.StartFinder`; HopSkipJump's ``pool_tries`` / ``pool_spread``."""

    pool: torch.Tensor
    tries: int
    spread: int = 0

    def __call__(self, access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *,
                 tol: float, gen: torch.Generator) -> torch.Tensor:
        return best_of_pool(access, x, best, idx, self.pool, tries=self.tries, tol=tol, clusters=self.spread)


def start_norms(x: torch.Tensor, best: torch.Tensor, found: torch.Tensor) -> list[float]:
    """Each example's L2 distance of its start (``inf`` where none was found): what the study logs."""
    d = (best - x).flatten(1).norm(dim=1).tolist()
    return [v if bool(f) else math.inf for v, f in zip(d, found.tolist(), strict=True)]


__all__ = ["PoolStarts", "best_of_pool", "check_pool", "kmeans", "nearest", "spread", "start_norms"]
