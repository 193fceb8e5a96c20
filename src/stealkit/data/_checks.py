"""Argument checks shared by the data modules; each failure is an ``InputError`` that says what to pass."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from stealkit.errors import InputError

Shape3 = tuple[int, int, int]

MAX_SEED = 2**32 - 1


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int in ``[0, 2**32 - 1]`` (the range every seeded backend here accepts)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        raise InputError(f"seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    return int(seed)


def check_count(n: object, what: str = "n") -> int:
    """Return ``n`` as a non-negative int."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or int(n) < 0:
        raise InputError(f"{what} must be a non-negative integer, got {n!r}")
    return int(n)


def check_shape(shape: object, what: str = "input_shape") -> Shape3:
    """Return ``shape`` as a ``(C, H, W)`` tuple of positive ints."""
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if (
        not isinstance(shape, Sequence)
        or isinstance(shape, str)
        or len(shape) != 3
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or int(s) <= 0 for s in shape)
    ):
        raise InputError(f"{what} must be three positive integers (C, H, W), e.g. (1, 28, 28); got {shape!r}")
    c, h, w = (int(s) for s in shape)
    return (c, h, w)


def check_images(x: object, what: str = "x") -> torch.Tensor:
    """Check that ``x`` is a floating-point image batch ``[N, C, H, W]`` and return it."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{what} must be a torch.Tensor of images [N, C, H, W], got {type(x).__name__}")
    if x.dim() != 4:
        hint = " (add a batch dimension with x.unsqueeze(0))" if x.dim() == 3 else ""
        raise InputError(f"{what} must have shape [N, C, H, W], got {tuple(x.shape)}{hint}")
    if not x.is_floating_point():
        raise InputError(
            f"{what} must be floating point with pixels in [0, 1], got {x.dtype} (use x.float() / 255)"
        )
    return x
