"""Feature-vector victims at the oracle boundary: :class:`FeatureMapped` puts a model that takes a vector of ``d``
raw features behind stealkit's ``[0, 1]^d`` (:class:`~stealkit.data.features.FeatureRange`), so the oracle, its
input checks and its ledger see points in ``[0, 1]^d`` exactly as they see pixels, and every query is counted
once, as it is answered. :func:`feature_ranges` resolves the ranges a victim is opened under."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from stealkit.data.features import FeatureRange, resolve_ranges
from stealkit.errors import InputError

log = logging.getLogger(__name__)


class FeatureMapped(nn.Module):
    """``model`` (raw features ``[B, d]`` in, logits out) taking stealkit's points ``u`` in ``[0, 1]^d``:
    ``model(ranges.to_model(u))``. Gradients flow through the map (a TorchScript or ``nn.Module`` victim can
    explain; an ONNX one cannot, as ever)."""

    def __init__(self, model: nn.Module, ranges: FeatureRange) -> None:
        super().__init__()
        self.model = model
        self.ranges = ranges
        self.input_shape = (ranges.d,)
        self.num_classes = getattr(model, "num_classes", None)
        self.meta = getattr(model, "meta", None)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 2 or u.shape[1] != self.ranges.d:
            raise InputError(f"a victim of {self.ranges.d} features takes [B, {self.ranges.d}], got {list(u.shape)}")
        return self.model(self.ranges.to_model(u))


def feature_ranges(d: int, declared: Any, data: Sequence[str | None]) -> FeatureRange:
    """The ranges a victim of ``d`` features is opened under: ``declared`` (a
    :class:`~stealkit.data.features.FeatureRange` or a ranges file) when given, else the min / max of the owner's
    data files ``data`` with a margin; one line saying what to pass when there is neither."""
    spec = declared if declared is not None else tuple(p for p in data if p)
    ranges = resolve_ranges(spec, d)
    log.debug("feature ranges of a %d-feature victim: %s", d, ranges.source)
    return ranges


def map_features(model: nn.Module, input_shape: tuple[int, ...], declared: Any,
                 data: Sequence[str | None]) -> tuple[nn.Module, FeatureRange | None]:
    """``model`` behind its feature-range map when ``input_shape`` is ``(d,)`` (and the ranges), else
    ``(model, None)``."""
    if len(input_shape) != 1:
        return model, None
    ranges = feature_ranges(int(input_shape[0]), declared, data)
    return FeatureMapped(model, ranges), ranges


def saved_ranges(d: int, declared: Any, saved: Any, data: Sequence[str | None]) -> FeatureRange:
    """The ranges of a stealkit model of ``d`` features (it takes points of ``[0, 1]^d`` itself): ``declared``,
    else those its ``model.json`` keeps (``saved``: ``{"lo", "hi", "source"}``), else from ``data``."""
    if declared is None and isinstance(saved, dict) and "lo" in saved and "hi" in saved:
        return FeatureRange(tuple(saved["lo"]), tuple(saved["hi"]), source=str(saved.get("source", "model.json")))
    return feature_ranges(d, declared, data)
