"""Query images that need no data set: noise and crops of two bundled photographs.

Every function is seeded through its own ``torch.Generator`` (the global RNG is never touched) and
returns float32 ``[n, C, H, W]`` with pixels in [0, 1].
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from stealkit.data._checks import Shape3, check_count, check_seed, check_shape
from stealkit.data.adapt import resize, to_channels
from stealkit.errors import InputError, StealkitError

_CHUNK = 2048  # natural_patches works on this many crops at a time to bound memory


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(check_seed(seed))


def _per_channel(value: float | Sequence[float], channels: int, what: str, *, positive: bool) -> torch.Tensor:
    values = [value] if isinstance(value, numbers.Real) else value
    try:
        floats = [float(v) for v in values]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number or one number per channel, got {value!r}") from None
    if len(floats) not in (1, channels):
        raise InputError(f"{what} needs 1 or {channels} values (one per channel), got {len(floats)}")
    if any(not math.isfinite(v) or (positive and v < 0) for v in floats):
        raise InputError(f"{what} must be finite{' and non-negative' if positive else ''}, got {value!r}")
    return torch.tensor(floats, dtype=torch.float32).reshape(1, -1, 1, 1)


def gaussian(
    n: int,
    shape: Shape3 | tuple[int, ...],
    *,
    seed: int,
    mean: float | Sequence[float] = 0.5,
    std: float | Sequence[float] = 0.5,
) -> torch.Tensor:
    """Pixel-space Gaussian noise ``N(mean, std^2)`` clipped to [0, 1].

    ``mean`` and ``std`` are scalars or one value per channel. With ``mean``/``std`` equal to the victim's
    input normalisation this is DFME appendix A.2's ``N(0, 1)`` query distribution in normalised space
    (before clipping to the valid pixel range).
    """
    n = check_count(n)
    c, h, w = check_shape(shape, "shape")
    mu = _per_channel(mean, c, "mean", positive=False)
    sigma = _per_channel(std, c, "std", positive=True)
    x = torch.randn((n, c, h, w), generator=_generator(seed))
    return x.mul_(sigma).add_(mu).clamp_(0.0, 1.0)


def uniform(n: int, shape: Shape3 | tuple[int, ...], *, seed: int) -> torch.Tensor:
    """Pixels drawn independently and uniformly from [0, 1)."""
    n = check_count(n)
    c, h, w = check_shape(shape, "shape")
    return torch.rand((n, c, h, w), generator=_generator(seed))


@functools.lru_cache(maxsize=1)
def _photo_pyramids() -> tuple[tuple[torch.Tensor, ...], ...]:
    """scikit-learn's sample photographs as RGB float images, each with halved copies down to ~16 px."""
    try:
        from sklearn.datasets import load_sample_images

        photos = load_sample_images().images
    except ImportError:
        raise StealkitError(
            "natural patches need Pillow to decode scikit-learn's sample photographs; "
            "install it with `pip install pillow`"
        ) from None
    pyramids = []
    for photo in photos:
        level = torch.tensor(photo).permute(2, 0, 1).float().div_(255)[None].contiguous()
        levels = [level]
        while min(level.shape[2:]) >= 32:
            level = resize(level, (level.shape[2] // 2, level.shape[3] // 2))
            levels.append(level)
        pyramids.append(tuple(levels))
    return tuple(pyramids)


def natural_patches(n: int, shape: Shape3 | tuple[int, ...], *, seed: int) -> torch.Tensor:
    """Random crops of scikit-learn's two bundled photographs (``load_sample_images``), resized to ``shape``.

    Each crop picks a photograph, a size (log-uniform from 1/16 of the largest crop with the target's aspect
    ratio up to that whole crop), a position, and a horizontal flip with probability 1/2. Crops are sampled
    bilinearly from an antialiased image pyramid (so shrinking does not alias) and converted to ``C``
    channels (grayscale is the mean of RGB). ``C`` must be 1 or 3.
    """
    n = check_count(n)
    c, h, w = check_shape(shape, "shape")
    if c not in (1, 3):
        raise InputError(f"natural patches are RGB photographs and can make 1 or 3 channels, not {c}")
    gen = _generator(seed)
    pyramids = _photo_pyramids()
    draws = torch.rand((n, 5), generator=gen)
    out = torch.empty((n, 3, h, w))
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        _crops_into(out[start:stop], draws[start:stop], pyramids)
    return to_channels(out.clamp_(0.0, 1.0), c)


def _crops_into(
    out: torch.Tensor, draws: torch.Tensor, pyramids: tuple[tuple[torch.Tensor, ...], ...]
) -> None:
    """Fill ``out`` ``[B, 3, h, w]`` with crops for rows of uniform draws (photo, size, top, left, flip)."""
    h, w = out.shape[2:]
    photo_idx = (draws[:, 0] * len(pyramids)).long().clamp_(max=len(pyramids) - 1)
    steps_y = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    steps_x = (torch.arange(w, dtype=torch.float32) + 0.5) / w
    for p, levels in enumerate(pyramids):
        sel = (photo_idx == p).nonzero().flatten()
        if sel.numel() == 0:
            continue
        d = draws[sel]
        ph, pw = levels[0].shape[2:]
        max_h = min(float(ph), pw * h / w)  # tallest crop with the target aspect ratio that fits
        crop_h = max_h * torch.exp(math.log(1 / 16) * (1 - d[:, 1]))
        crop_w = crop_h * (w / h)
        top = (ph - crop_h) * d[:, 2]
        left = (pw - crop_w) * d[:, 3]
        # sample centres in grid_sample's align_corners=False units: -1 and 1 are the photo's outer edges
        gy = (top[:, None] + steps_y[None] * crop_h[:, None]) * (2 / ph) - 1  # [B, h]
        gx = (left[:, None] + steps_x[None] * crop_w[:, None]) * (2 / pw) - 1  # [B, w]
        flip = d[:, 4] < 0.5
        gx[flip] = gx[flip].flip(-1)
        grid = torch.empty((len(sel), h, w, 2))
        grid[..., 0] = gx[:, None, :]
        grid[..., 1] = gy[:, :, None]
        # pyramid level: the largest with at most a 2x shrink left, which bilinear sampling handles
        level_of = (crop_h / h).log2().floor().clamp(0, len(levels) - 1).long()
        for lv in level_of.unique().tolist():
            rows = (level_of == lv).nonzero().flatten()
            g = grid[rows].reshape(1, len(rows) * h, w, 2)
            sampled = F.grid_sample(
                levels[lv], g, mode="bilinear", padding_mode="border", align_corners=False
            )
            out[sel[rows]] = sampled.reshape(3, len(rows), h, w).permute(1, 0, 2, 3)
