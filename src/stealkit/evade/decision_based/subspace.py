"""Low-frequency random directions for decision-based attacks: QEBA's spatial subspace and the 2-D DCT's.

Li et al., "QEBA: Query-Efficient Boundary-Based Blackbox Attack" (CVPR 2020), Sec. 3.3 ("QEBA-S"): draw
the random probe directions of the HopSkipJump estimator in a low-dimensional subspace -- Gaussian noise on
a coarse ``side x side`` grid per channel, upsampled (bilinear) to the image size -- so that each sign answer
says more about the component of the boundary normal that matters (natural images' normals concentrate on
low frequencies), at the price of a bias outside the subspace. ``side = 0`` means the full pixel space.

:func:`dct_directions`: Gaussian noise on the lowest frequencies of the orthonormal 2-D DCT, mapped back to
pixels (SurFree, Maho et al. CVPR 2021, Sec. 5.2; the Triangle Attack, Wang et al. ECCV 2022, Sec. 3) -- on a
whole ``kh x kw`` block of coefficients, or on a few of them picked at random per channel. The DCT is
orthonormal, so angles and norms of the coefficients are those of the pixel-space directions.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from stealkit.errors import InputError


def check_side(side: int, shape: tuple[int, ...]) -> None:
    if side < 0 or (side > 0 and len(shape) != 3):
        raise InputError(f"subspace side must be 0 (full space) or a positive grid side for [C, H, W] images, "
                         f"got {side} for shape {list(shape)}")


def random_directions(n: int, shape: tuple[int, ...], side: int, gen: torch.Generator,
                      device: torch.device | str) -> torch.Tensor:
    """``n`` random directions of image shape ``shape`` (not normalised): i.i.d. Gaussian pixels when
    ``side`` is 0 or not smaller than the image, else Gaussian on a ``side x side`` grid upsampled."""
    if side <= 0 or side >= max(shape[-2:]):
        return torch.randn((n, *shape), generator=gen).to(device)
    c, h, w = shape
    coarse = torch.randn((n, c, side, side), generator=gen).to(device)
    return F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)


def subspace_dim(shape: tuple[int, ...], side: int) -> int:
    """The dimension the directions of :func:`random_directions` span."""
    if side <= 0 or side >= max(shape[-2:]):
        return int(torch.Size(shape).numel())
    return shape[0] * side * side


@functools.lru_cache(maxsize=8)
def _dct(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    m = torch.cos(math.pi * (2 * torch.arange(n, dtype=torch.float64) + 1) * k / (2 * n)) * math.sqrt(2 / n)
    m[0] /= math.sqrt(2)
    return m.float()


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix (rows: frequencies)."""
    return _dct(n).clone()


def dct_directions(n: int, shape: tuple[int, ...], freq: float, gen: torch.Generator,
                   device: torch.device | str, *, coords: int = 0) -> torch.Tensor:
    """``n`` random directions of image shape ``shape`` = [C, H, W] (not normalised) on the lowest ``freq``
    share of the DCT frequencies per side (a ``ceil(freq H) x ceil(freq W)`` block per channel): Gaussian on the
    whole block (``coords = 0``) or on ``coords`` of its coefficients per channel picked at random (the rest 0)."""
    c, h, w = shape
    kh, kw = max(1, math.ceil(freq * h)), max(1, math.ceil(freq * w))
    coef = torch.zeros(n, c, h, w)
    if coords <= 0 or coords >= kh * kw:
        coef[:, :, :kh, :kw] = torch.randn(n, c, kh, kw, generator=gen)
    else:
        pick = torch.rand(n, c, kh * kw, generator=gen).topk(coords, dim=2).indices
        block = torch.zeros(n, c, kh * kw).scatter_(2, pick, torch.randn(n, c, coords, generator=gen))
        coef[:, :, :kh, :kw] = block.view(n, c, kh, kw)
    coef = coef.to(device)
    return _dct(h).to(device).T @ coef @ _dct(w).to(device)


__all__ = ["check_side", "dct_directions", "dct_matrix", "random_directions", "subspace_dim"]
