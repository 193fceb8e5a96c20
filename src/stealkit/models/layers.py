"""Building blocks shared by every architecture of the zoo.

Every zoo model is a :class:`Classifier`: a :class:`Normalize` layer followed by the network body, so
models take pixels in ``[0, 1]`` (float32, NCHW; or feature vectors ``[B, d]`` mapped to ``[0, 1]``,
:mod:`stealkit.data.features`) and return logits ``[B, num_classes]``. Keeping the
normalisation inside the model means attacks, oracles and certifiers all work in pixel space, where
epsilon budgets and clipping to ``[0, 1]`` have their usual meaning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from stealkit.errors import InputError

__all__ = ["Classifier", "Normalize", "count_parameters", "pool_out", "valid_input_shape"]


def _channel_values(values: float | Sequence[float], channels: int, name: str) -> list[float]:
    """Turn a scalar or a per-channel sequence into a list of ``channels`` finite floats."""
    if isinstance(values, int | float) and not isinstance(values, bool):
        seq = [float(values)] * channels
    elif isinstance(values, torch.Tensor):
        seq = [float(v) for v in values.detach().flatten().tolist()]
    else:
        try:
            seq = [float(v) for v in values]
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"{name} must be a number or a list of {channels} numbers, got {values!r}"
            ) from exc
    if len(seq) == 1 and channels > 1:
        seq = seq * channels
    if len(seq) != channels:
        raise InputError(
            f"{name} has {len(seq)} values but the input has {channels} channel(s); give one value per channel"
        )
    if not all(math.isfinite(v) for v in seq):
        raise InputError(f"{name} must be finite, got {seq}")
    return seq


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std``; the first layer of every zoo model.

    ``mean`` and ``std`` are stored as buffers of shape ``[1, C, 1, 1]`` (they travel with the weights).
    A scalar or a one-element list is repeated over ``channels`` when ``channels`` is given.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self, mean: float | Sequence[float], std: float | Sequence[float], channels: int | None = None,
        *, flat: bool = False,
    ):
        """``flat``: the input is ``[B, d]`` feature vectors and ``channels`` is ``d`` (buffers ``[1, d]``)."""
        super().__init__()
        if channels is None:
            channels = 1 if isinstance(mean, int | float) else len(mean)  # type: ignore[arg-type]
        mean_l = _channel_values(mean, channels, "mean")
        std_l = _channel_values(std, channels, "std")
        if any(s <= 0 for s in std_l):
            raise InputError(f"std must be positive in every channel, got {std_l}")
        view = (1, -1) if flat else (1, -1, 1, 1)
        self.register_buffer("mean", torch.tensor(mean_l, dtype=torch.float32).view(*view))
        self.register_buffer("std", torch.tensor(std_l, dtype=torch.float32).view(*view))

    @property
    def channels(self) -> int:
        return int(self.mean.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class Classifier(nn.Module):
    """A zoo model: ``normalize`` (a :class:`Normalize`) then ``net`` (the architecture's body).

    It remembers how it was built (``arch``, ``input_shape``, ``num_classes``, ``arch_kwargs`` with every
    default filled in) so that :meth:`stealkit.models.ModelSpec.from_model` can describe it.
    ``forward`` checks the input shape and raises :class:`~stealkit.errors.InputError` on a mismatch.
    """

    def __init__(
        self,
        normalize: Normalize,
        net: nn.Module,
        *,
        arch: str,
        input_shape: tuple[int, int, int],
        num_classes: int,
        arch_kwargs: dict | None = None,
    ):
        super().__init__()
        self.normalize = normalize
        self.net = net
        self.arch = arch
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)
        self.arch_kwargs = dict(arch_kwargs or {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise InputError(
                f"{self.arch} expects input of shape [B, {', '.join(map(str, self.input_shape))}] "
                f"(pixels in [0, 1]), got {list(x.shape)}; reshape the batch or build a model for this shape"
            )
        return self.net(self.normalize(x))


def valid_input_shape(input_shape: Sequence[int], *, features: bool = False) -> tuple[int, int, int]:
    """Check ``input_shape`` is ``(C, H, W)`` with positive ints (or, with ``features``, also ``(d,)``: a vector
    of ``d`` features) and return it as a tuple."""
    try:
        shape = tuple(input_shape)
    except TypeError as exc:
        raise InputError(f"input_shape must be (channels, height, width), got {input_shape!r}") from exc
    sizes = (1, 3) if features else (3,)
    if len(shape) not in sizes or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
        also = " or one positive int (d features)" if features else ""
        raise InputError(
            f"input_shape must be three positive ints (channels, height, width){also}, got {input_shape!r}"
        )
    return shape  # type: ignore[return-value]


def pool_out(h: int, w: int) -> tuple[bool, int, int]:
    """Whether a 2x2/stride-2 pool fits an ``h x w`` map, and the size after it (skipped if < 2 pixels)."""
    if min(h, w) >= 2:
        return True, h // 2, w // 2
    return False, h, w


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters in ``model`` (only those with ``requires_grad`` when ``trainable_only``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
