"""CGBA's semicircular boundary search (a replacement for HopSkipJump's step along the normal).

Reza, Rahmati, Wu and Dai, "CGBA: Curvature-aware Geometric Black-box Attack" (ICCV 2023), Sec. 3.2-3.3
(the non-targeted variant, CGBA): at a boundary point ``x_b`` with estimated normal ``eta`` (pointing to the
adversarial side), search the 2-D plane spanned by ``v = (x_b - x)/|x_b - x|`` and the part ``w`` of ``eta``
orthogonal to ``v``. On that plane every point of the semicircle with diameter ``[x, x_b]`` is

    ``z(a) = x + D cos(a) (cos(a) v + sin(a) w)``,  ``D = |x_b - x|``,  ``0 <= a <= pi/2``,

at distance ``D cos(a)`` from ``x`` (Thales): ``z(0) = x_b`` is adversarial and ``z(pi/2) = x`` is not, so
a boundary point on the arc always exists, however the boundary curves, and it is never farther than
``x_b``. For a flat boundary and an exact normal it is the projection of ``x`` onto the boundary (at
``a = angle(v, eta)``), GeoDA's step (Rahmati et al. CVPR 2020, Sec. 3.2). The search (their Alg. 1):

1. find a non-adversarial angle: ``a_k = (pi/2)(1 - 2^-k)`` for ``k = 1, 2, ...`` (one query each) until
   ``z(a_k)`` is not adversarial (after ``max_outward`` tries ``a = pi/2``, the original, known clean);
2. bisect the angle between the last adversarial and the first clean one until they are ``tol`` apart.

Points are clipped to the pixel box (this only brings them nearer to ``x``, which is inside it). All
examples of a batch search in lock-step (one batch of oracle calls per bisection step); every point returned
was queried and found adversarial; an example whose caps bind keeps its last verified point.
"""

from __future__ import annotations

import math

import torch

from stealkit.evade.base import TINY, clip_box
from stealkit.evade.decision_based.decision import LabelAccess


def arc_points(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor, dist: torch.Tensor, angle: torch.Tensor
               ) -> torch.Tensor:
    """``z(a)`` (clipped to the box) for originals ``x``, unit directions ``v``, ``w`` and distances ``dist``."""
    shape = (-1, *([1] * (x.dim() - 1)))
    c, s = torch.cos(angle).view(shape), torch.sin(angle).view(shape)
    return clip_box(x + dist.view(shape) * c * (c * v + s * w))


def semicircle_search(access: LabelAccess, x: torch.Tensor, xb: torch.Tensor, normal: torch.Tensor,
                      idx: torch.Tensor, *, tol: float, max_outward: int = 6) -> torch.Tensor:
    """New boundary points for the adversarial ``xb`` (of examples ``idx``, rows aligned with ``x``) given the
    normal estimates ``normal``; every returned point is verified adversarial and at most as far from ``x``."""
    b = x.shape[0]
    diff = (xb - x).flatten(1)
    dist = diff.norm(dim=1).clamp_min(TINY)
    v = (diff / dist.unsqueeze(1)).view_as(x)
    g = normal.flatten(1)
    g = g - (g * v.flatten(1)).sum(1, keepdim=True) * v.flatten(1)
    gn = g.norm(dim=1)
    w = (g / gn.clamp_min(TINY).unsqueeze(1)).view_as(x)
    out = xb.clone()
    lo = torch.zeros(b, device=x.device)
    hi = torch.full((b,), math.pi / 2, device=x.device)
    live = (gn > 1e-9).cpu()
    rows = torch.arange(b)

    def ask(sel: torch.Tensor, angle: torch.Tensor) -> torch.Tensor | None:
        """Query ``z(angle)`` for rows ``sel`` that can pay; returns which were adversarial (None: nobody paid)."""
        d = sel.to(x.device)
        pts = arc_points(x[d], v[d], w[d], dist[d], angle)
        adv = access.is_adv(pts, idx[sel]).to(x.device)
        out[d[adv]] = pts[adv]
        return adv

    outward = live.clone()
    for k in range(1, max_outward + 1):
        sel = rows[outward]
        sel = sel[access.room(idx[sel], 1)] if sel.numel() else sel
        outward[rows[outward]] = False
        if sel.numel() == 0:
            break
        a = torch.full((sel.numel(),), math.pi / 2 * (1 - 2.0**-k), device=x.device)
        adv = ask(sel, a)
        d = sel.to(x.device)
        lo[d[adv]] = a[adv]
        hi[d[~adv]] = a[~adv]
        outward[sel[adv.cpu()]] = True
    while True:
        sel = rows[live & ((hi - lo) > tol).cpu()]
        if sel.numel() == 0:
            break
        room = access.room(idx[sel], 1)
        live[sel[~room]] = False
        sel = sel[room]
        if sel.numel() == 0:
            break
        d = sel.to(x.device)
        mid = (lo[d] + hi[d]) / 2
        adv = ask(sel, mid)
        lo[d] = torch.where(adv, mid, lo[d])
        hi[d] = torch.where(adv, hi[d], mid)
    return out


def search_cost(tol: float, max_outward: int = 6) -> int:
    """Queries one search can take at most: the outward tries and the bisection to ``tol``."""
    return max_outward + math.ceil(math.log2(math.pi / 4 / tol)) + 1


__all__ = ["arc_points", "search_cost", "semicircle_search"]
