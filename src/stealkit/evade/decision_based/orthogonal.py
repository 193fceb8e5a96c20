"""Orthogonal probe directions for the boundary-normal estimate (structured Monte Carlo).

Choromanski, Rowland, Sindhwani, Turner and Weller, "Structured Evolution with Compact Architectures for
Scalable Policy Optimization" (ICML 2018), Sec. 3: a Monte Carlo gradient estimate from ``n`` random
directions has a lower mean squared error when the directions are exactly orthogonal (blocks of ``d``
orthonormal directions, each rescaled to the length of a Gaussian vector) instead of i.i.d. Gaussian; the
gain grows with ``n / d``. HopSkipJump's estimate (Chen et al. 2020, Eq. 9) is such an estimate with sign
answers, and late rounds probe a Fashion-MNIST image with several hundred directions in 784 dimensions.

Used by :mod:`stealkit.evade.decision_based.hopskipjump` with ``orthogonal=True`` (full pixel space only); the directions
are normalised there, so only their orientation matters.
"""

from __future__ import annotations

import torch


def orthogonal_directions(n: int, shape: tuple[int, ...], gen: torch.Generator,
                          device: torch.device | str) -> torch.Tensor:
    """``n`` random unit directions of shape ``shape``, orthonormal within each block of ``d`` (the number
    of pixels): the Q factor of a Gaussian matrix, its signs fixed so that it is Haar-distributed."""
    d = int(torch.Size(shape).numel())
    blocks = []
    for start in range(0, n, d):
        m = min(d, n - start)
        q, r = torch.linalg.qr(torch.randn((d, m), generator=gen))
        blocks.append((q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0)).T)
    return torch.cat(blocks).view(n, *shape).to(device)


__all__ = ["orthogonal_directions"]
