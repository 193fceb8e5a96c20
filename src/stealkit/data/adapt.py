"""Dataset adaptation for surrogate / query data (DFME, Truong et al. 2021, appendix A.2).

Query images from another data set are made to fit the victim's input: channel count first (grayscale
repeated to RGB, RGB averaged to grayscale), then size (bilinear). ``keep_classes`` and ``imbalance``
make the skewed and long-tailed pools of the same appendix.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from stealkit.data._checks import Shape3, check_images, check_seed, check_shape
from stealkit.data.dataset import Dataset
from stealkit.errors import InputError


def _check_size(size: int | tuple[int, int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, numbers.Integral) else size
    if (
        not isinstance(pair, tuple | list)
        or len(pair) != 2
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or int(s) <= 0 for s in pair)
    ):
        raise InputError(f"size must be a positive int or a pair (H, W) of positive ints, got {size!r}")
    return int(pair[0]), int(pair[1])


def resize(x: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """Resize images ``[N, C, H, W]`` to ``size`` (``S`` for SxS, or ``(H, W)``) bilinearly.

    Antialiased when shrinking either side (so downsampling averages instead of aliasing). The output is
    clamped to [0, 1]. Returns ``x`` itself when it already has the requested size.
    """
    x = check_images(x)
    h, w = _check_size(size)
    if tuple(x.shape[2:]) == (h, w):
        return x
    if x.shape[0] == 0:
        return x.new_empty((0, x.shape[1], h, w))
    shrink = h < x.shape[2] or w < x.shape[3]
    out = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=shrink)
    return out.clamp_(0.0, 1.0)


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """Convert images ``[N, C, H, W]`` to ``channels`` channels.

    One channel is repeated to any count (grayscale -> RGB); any count is averaged to one (RGB ->
    grayscale, an unweighted mean so that a repeated gray image maps back to itself). Returns ``x`` itself
    when the count already matches; other conversions (e.g. 3 -> 4) raise ``InputError``.
    """
    x = check_images(x)
    if isinstance(channels, bool) or not isinstance(channels, numbers.Integral) or channels <= 0:
        raise InputError(f"channels must be a positive integer, got {channels!r}")
    c = x.shape[1]
    if c == channels:
        return x
    if c == 1:
        return x.expand(-1, int(channels), -1, -1).contiguous()
    if channels == 1:
        if bool((x == x[:, :1]).all()):  # gray stored as RGB: exact, where a float mean of 3 may round
            return x[:, :1].clone()
        return x.mean(dim=1, keepdim=True)
    raise InputError(
        f"cannot convert {c}-channel images to {channels} channels; only 1 <-> C conversions exist"
    )


def adapt_images(x: torch.Tensor, input_shape: Shape3 | tuple[int, ...]) -> torch.Tensor:
    """Make images ``[N, C, H, W]`` fit ``input_shape`` ``(C', H', W')``: channels first, then size."""
    c, h, w = check_shape(input_shape)
    return resize(to_channels(x, c), (h, w))


def adapt_dataset(ds: Dataset, input_shape: Shape3 | tuple[int, ...]) -> Dataset:
    """``ds`` with its images adapted to ``input_shape`` (labels, classes and name unchanged)."""
    shape = check_shape(input_shape)
    if ds.input_shape == shape:
        return ds
    return ds.with_x(adapt_images(ds.x, shape).contiguous())


def _class_indices(ds: Dataset, classes: Iterable[int | str]) -> list[int]:
    if isinstance(classes, str | int):
        classes = [classes]
    out: list[int] = []
    for c in classes:
        if isinstance(c, str) and c in ds.classes:
            idx = ds.classes.index(c)
        elif isinstance(c, numbers.Integral) and not isinstance(c, bool) and 0 <= int(c) < ds.num_classes:
            idx = int(c)
        else:
            raise InputError(
                f"class {c!r} is not in {ds.name!r}; give indices 0..{ds.num_classes - 1} or names from {ds.classes}"
            )
        if idx not in out:
            out.append(idx)
    if not out:
        raise InputError("keep_classes needs at least one class")
    return out


def keep_classes(ds: Dataset, classes: Iterable[int | str]) -> Dataset:
    """Only the samples whose label is in ``classes`` (indices or names), in their original order.

    Labels keep their original values and ``classes`` keeps the full label space, so a skewed pool still
    speaks the victim's labels. Raises ``InputError`` if no sample is left.
    """
    wanted = _class_indices(ds, classes)
    mask = torch.isin(ds.y, torch.tensor(wanted, dtype=torch.int64))
    out = ds.subset(mask)
    if len(out) == 0:
        names = ", ".join(ds.classes[i] for i in wanted)
        raise InputError(f"{ds.name!r} has no samples of classes {names}; choose classes present in it")
    return out


def imbalance_counts(counts: list[int], ratio: float) -> list[int]:
    """How many samples of each class ``imbalance`` keeps: ``n_k * ratio ** (k / (K - 1))``, rounded half up.

    K is the number of classes (``len(counts)``). A class with samples keeps at least one.
    """
    k_total = len(counts)
    out = []
    for k, n in enumerate(counts):
        frac = ratio ** (k / (k_total - 1)) if k_total > 1 else 1.0
        out.append(min(n, max(1, math.floor(n * frac + 0.5))) if n > 0 else 0)
    return out


def imbalance(ds: Dataset, *, ratio: float, seed: int) -> Dataset:
    """A long-tailed subset: class ``k`` keeps a fraction ``ratio ** (k / (K - 1))`` of its samples.

    The standard long-tail profile: class 0 keeps everything, the last class a fraction ``ratio`` of it,
    exponentially in between (K = ``ds.num_classes``). Which samples stay is drawn with ``seed``; they keep
    their original order. ``ratio`` must lie in (0, 1]; 1 keeps everything.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < float(ratio) <= 1:
        raise InputError(f"imbalance ratio must be a number in (0, 1] (e.g. 0.1), got {ratio!r}")
    gen = torch.Generator().manual_seed(check_seed(seed))
    counts = torch.bincount(ds.y, minlength=ds.num_classes).tolist()
    keep_n = imbalance_counts(counts, float(ratio))
    kept: list[torch.Tensor] = []
    for k, n_keep in enumerate(keep_n):
        members = (ds.y == k).nonzero().flatten()
        if n_keep:
            kept.append(members[torch.randperm(len(members), generator=gen)[:n_keep]])
    idx = torch.cat(kept).sort().values if kept else torch.empty(0, dtype=torch.int64)
    return ds.subset(idx)
