"""Best of many random starting directions, each tested with one query against the best distance so far.

Cheng et al., "Query-Efficient Hard-label Black-box Attack: An Optimization-based Approach" (OPT-attack,
ICLR 2019), Sec. 3.1-3.2 and Algorithm 1's initialisation (kept by Sign-OPT, Cheng et al. ICLR 2020, Sec. 4):
the attack's objective along a direction ``theta`` is the distance ``g(theta)`` to the boundary on the ray
``x + lambda theta``; before optimising, many random directions are tried and the one with the smallest
``g`` is kept. A direction can only improve on the best distance ``D`` found so far if the point at distance
``D`` along it is already adversarial, so each try costs **one** query ("fine-grained search" starting at
the current best), and only the tries that win pay for a binary search.

Here the directions are HopSkipJump's start distribution (Chen et al. 2020, Sec. 4: uniform noise images;
the ray runs from ``x`` to the noise image, so it stays inside the pixel box), and the search runs for all
images of a batch in lock-step: each try is one batch of oracle calls, the winners' binary searches another
few. A decision-based attack's result depends much on the basin its start lies in; the nearest of several
starts is a cheap way to land in a better one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from stealkit.evade.decision_based.decision import LabelAccess, OutOfQueries, binary_search, blend


def improve_along(access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *, tries: int,
                  tol: float, ends: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Improve the verified boundary points ``best`` (of examples ``idx``, rows aligned with ``x``) along
    ``tries`` rays each: ``ends(j, sel)`` gives try ``j``'s far points for the rows ``sel`` still within their
    caps (on ``x``'s device). Each try costs one query per row, at the point of the ray at the best distance so
    far; only winners pay a binary search. Returns the new points, every one verified adversarial; stops early
    (the points found so far kept) when the caps bind."""
    best = best.clone()
    rows = torch.arange(idx.numel())
    for j in range(tries):
        sel = rows[access.room(idx, 1)]
        if sel.numel() == 0:
            break
        d = sel.to(x.device)
        end = ends(j, sel)
        far = (end - x[d]).flatten(1).norm(dim=1).clamp_min(1e-12)
        now = (best[d] - x[d]).flatten(1).norm(dim=1)
        probe = blend(x[d], end, (now / far).clamp(max=1.0))
        try:
            adv = access.is_adv(probe, idx[sel]).cpu()
        except OutOfQueries:
            break
        win = sel[adv]
        if win.numel():
            w = win.to(x.device)
            best[w] = binary_search(access, x[w], probe[adv.to(x.device)], idx[win], tol)
    return best


def best_of_noise(access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *, tries: int,
                  tol: float, gen: torch.Generator) -> torch.Tensor:
    """Improve the boundary points ``best`` (of examples ``idx``, rows aligned with ``x``) with ``tries``
    uniform-noise directions each; returns the new points, every one verified adversarial. Stops early (the
    points found so far kept) when the caps bind."""

    def noise(_: int, sel: torch.Tensor) -> torch.Tensor:
        return torch.rand((sel.numel(), *x.shape[1:]), generator=gen).to(x.device)

    return improve_along(access, x, best, idx, tries=tries, tol=tol, ends=noise)


class StartFinder(Protocol):
    """A start phase of :func:`~stealkit.evade.decision_based.hopskipjump.hopskipjump` (its ``starts=`` hook, in
    the spirit of Foolbox's ``init_attack``), run after the first binary search: improve the verified boundary
    points ``best`` of the examples ``idx`` (rows aligned with ``x``) and return the new points, every one
    verified adversarial. Every query goes through ``access`` (so the caps and the ledger hold); ``tol`` is the
    attack's binary-search tolerance and ``gen`` its seeded generator."""

    def __call__(self, access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *,
                 tol: float, gen: torch.Generator) -> torch.Tensor: ...


@dataclass(frozen=True)
class NoiseStarts:
    """:func:`best_of_noise` with ``tries`` uniform-noise directions (OPT-attack's initialisation) as a
    :class:`StartFinder`; HopSkipJump's ``start_tries``."""

    tries: int

    def __call__(self, access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *,
                 tol: float, gen: torch.Generator) -> torch.Tensor:
        return best_of_noise(access, x, best, idx, tries=self.tries, tol=tol, gen=gen)


__all__ = ["NoiseStarts", "StartFinder", "best_of_noise", "improve_along"]
