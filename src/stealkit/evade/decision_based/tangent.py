"""The tangent-point step of the Tangent Attack (a replacement for HopSkipJump's step along the normal).

Ma et al., "Finding Optimal Tangent Points for Reducing Distortions of Hard-label Attacks" (NeurIPS 2021),
Sec. 3.2-3.3: at a boundary point ``o`` with estimated normal ``u`` (pointing to the adversarial side),
HopSkipJump steps to ``o + R u`` and binary-searches back towards the original ``x``. The Tangent Attack
instead builds a virtual hemisphere of radius ``R`` centred at ``o`` on the adversarial side and steps to the
point ``k`` of it where the line from ``x`` is tangent: of all the hemisphere's points, ``k`` makes the
smallest angle with ``o - x`` seen from ``x``, so the binary search from ``k`` towards ``x`` ends nearest to
``x`` if the boundary is locally the hemisphere's base. In the 2-D plane spanned by ``a = (x - o)/|x - o|``
and the part ``w`` of ``u`` orthogonal to ``a``, the tangent point is
``k = o + R (cos(phi) a + sin(phi) w)`` with ``cos(phi) = R / |x - o|`` (their closed form). The radius
follows HopSkipJump's geometric schedule (``R = |x - o| / sqrt(t)``, halved until ``k`` is adversarial).
Where the tangent point falls outside the hemisphere (``<k - o, u> < 0``; not seen in practice) or the plane
is degenerate, the step is HopSkipJump's ``o + R u``.
"""

from __future__ import annotations

import torch

from stealkit.evade.base import TINY


def tangent_points(o: torch.Tensor, x: torch.Tensor, u: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Tangent points (unclipped) for boundary points ``o`` [B, ...], originals ``x``, unit normals ``u`` and
    radii ``radius`` [B]."""
    flat_o, flat_u = o.flatten(1), u.flatten(1)
    a = x.flatten(1) - flat_o
    dist = a.norm(dim=1, keepdim=True).clamp_min(TINY)
    a = a / dist
    w = flat_u - (flat_u * a).sum(1, keepdim=True) * a
    w_norm = w.norm(dim=1, keepdim=True)
    w = w / w_norm.clamp_min(TINY)
    r = radius.view(-1, 1)
    cos = (r / dist).clamp(max=1.0)
    sin = (1 - cos * cos).clamp_min(0).sqrt()
    k = flat_o + r * (cos * a + sin * w)
    ok = (w_norm.squeeze(1) > 1e-6) & (((k - flat_o) * flat_u).sum(1) >= 0)
    k = torch.where(ok.view(-1, 1), k, flat_o + r * flat_u)
    return k.view_as(o)


__all__ = ["tangent_points"]
