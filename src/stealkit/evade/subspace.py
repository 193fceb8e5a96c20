"""Low-frequency random directions for decision-based gradient estimation (QEBA's spatial subspace).

Li et al., "QEBA: Query-Efficient Boundary-Based Blackbox Attack" (CVPR 2020), Sec. 3.3 ("QEBA-S"): draw
the random probe directions of the HopSkipJump estimator in a low-dimensional subspace -- Gaussian noise on
a coarse ``side x side`` grid per channel, upsampled (bilinear) to the image size -- so that each sign answer
says more about the component of the boundary normal that matters (natural images' normals concentrate on
low frequencies), at the price of a bias outside the subspace. ``side = 0`` means the full pixel space.
"""

from __future__ import annotations

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


__all__ = ["check_side", "random_directions", "subspace_dim"]
