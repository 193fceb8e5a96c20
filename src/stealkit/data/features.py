"""Feature-vector (tabular) inputs: the map between stealkit's ``[0, 1]^d`` and each feature's own range.

A victim whose input is a vector of ``d`` features (input shape ``(d,)``) is attacked, like an image victim, in
``[0, 1]^d``: every attack, eps and query source works there, and :class:`FeatureRange` maps a point onto the
features the model takes (``to_model``: ``lo + u * (hi - lo)`` per feature) and back (``from_model``). The ranges
come from the owner: a ranges file (JSON ``{"lo": [...], "hi": [...]}`` or ``.npz`` with ``lo`` and ``hi``), or
the min / max of the owner's own arrays widened by :data:`MARGIN` of each feature's span on each side
(:func:`ranges_from_data`). The owner's arrays of raw features (``.npy`` / ``.npz`` holding ``x [N, d]`` and, where
labels are needed, ``y``) are read by :func:`read_features` into ``[0, 1]^d``; :func:`read_own` reads images or
features, as the victim's input shape says. Every failure is one ``InputError`` line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stealkit.data.own import ArrayData, OwnData, check_own_path, labels_of, load_arrays, read_images
from stealkit.errors import InputError

log = logging.getLogger(__name__)

#: the share of each feature's observed span added on each side when ranges come from the owner's data
MARGIN = 0.05
#: the half-width given to a feature that is constant in the owner's data (its span is 0)
_FLAT_PAD = 0.5
#: how the owner's features are read, as :class:`~stealkit.data.own.OwnData` states it
FEATURE_SCALE = "features, mapped to [0, 1] by the feature ranges"
ASK_RANGES = ("pass your data with --test-data FILE.npz (or --pool FILE.npz), whose min/max per feature give the "
              "ranges, or declare them in a ranges file: VICTIM.onnx?feature_ranges=FILE.json holding "
              "{\"lo\": [...], \"hi\": [...]} (Target(features=...) in Python)")


def is_tabular(input_shape: Sequence[int] | None) -> bool:
    """Whether ``input_shape`` is a feature vector ``(d,)`` rather than an image ``(C, H, W)``."""
    return input_shape is not None and len(tuple(input_shape)) == 1


@dataclass(frozen=True)
class FeatureRange:
    """Each feature's range ``[lo_i, hi_i]`` (``hi_i > lo_i``), where it came from (``source``: a file, or the
    data it was taken from) and the margin added (0 for declared ranges)."""

    lo: tuple[float, ...]
    hi: tuple[float, ...]
    source: str = "declared"
    margin: float = 0.0

    def __post_init__(self) -> None:
        lo, hi = tuple(float(v) for v in self.lo), tuple(float(v) for v in self.hi)
        if not lo or len(lo) != len(hi):
            raise InputError(f"feature ranges need one lo and one hi per feature, got {len(lo)} lo and {len(hi)} hi")
        if not all(np.isfinite(lo + hi)):
            raise InputError("feature ranges must be finite numbers; give lo and hi for every feature")
        bad = [i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if not b > a]
        if bad:
            raise InputError(f"feature ranges need hi > lo for every feature; feature(s) {bad[:5]} have hi <= lo")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def d(self) -> int:
        return len(self.lo)

    def _bounds(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.tensor(self.lo, dtype=like.dtype, device=like.device)
        return lo, torch.tensor(self.hi, dtype=like.dtype, device=like.device) - lo

    def to_model(self, u: torch.Tensor) -> torch.Tensor:
        """stealkit's points ``u`` ``[B, d]`` in [0, 1] as the model's features: ``lo + u * (hi - lo)``."""
        lo, span = self._bounds(u)
        return u * span + lo

    def from_model(self, x: torch.Tensor) -> torch.Tensor:
        """The model's features ``x`` ``[B, d]`` as stealkit's points: ``(x - lo) / (hi - lo)`` (not clipped)."""
        lo, span = self._bounds(x)
        return (x - lo) / span

    @property
    def digest(self) -> str:
        """sha256 of the float64 bytes of ``lo`` then ``hi``."""
        return hashlib.sha256(np.asarray(self.lo + self.hi, dtype=np.float64).tobytes()).hexdigest()

    def record(self) -> dict[str, Any]:
        """What ``config.json`` records: the source, the margin, the feature count, the digest and the ranges."""
        return {"source": self.source, "margin": self.margin, "features": self.d, "sha256": self.digest,
                "lo": list(self.lo), "hi": list(self.hi)}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ranges as JSON (``{"lo": [...], "hi": [...]}``), readable by :func:`load_ranges`."""
        Path(path).write_text(json.dumps({"lo": list(self.lo), "hi": list(self.hi)}) + "\n")


def load_ranges(path: str | os.PathLike[str], d: int | None = None) -> FeatureRange:
    """Declared ranges from ``path``: JSON ``{"lo": [...], "hi": [...]}`` or an ``.npz`` with ``lo`` and ``hi``;
    ``d``: the victim's feature count, checked."""
    p = Path(path)
    where = f"feature ranges {os.fspath(path)}"
    if not p.is_file():
        raise InputError(f"{where}: no such file; give a JSON file {{\"lo\": [...], \"hi\": [...]}} or an .npz")
    if p.suffix.lower() == ".npz":
        lo, hi = _npz_ranges(p, where)
    else:
        try:
            raw = json.loads(p.read_text())
            lo, hi = raw["lo"], raw["hi"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"{where}: not a JSON object with 'lo' and 'hi' lists ({exc}); write "
                             "{\"lo\": [...], \"hi\": [...]}") from None
    try:
        lo_t, hi_t = tuple(float(v) for v in lo), tuple(float(v) for v in hi)
    except (TypeError, ValueError):
        raise InputError(f"{where}: lo and hi must be lists of numbers, one per feature") from None
    ranges = FeatureRange(lo_t, hi_t, source=os.fspath(path))
    if d is not None and ranges.d != d:
        raise InputError(f"{where}: gives {ranges.d} feature ranges but the victim takes {d} features")
    return ranges


def _npz_ranges(p: Path, where: str) -> tuple[Any, Any]:
    try:
        with np.load(p, allow_pickle=False) as z:
            if "lo" not in z or "hi" not in z:
                raise InputError(f"{where}: the .npz holds {list(z.keys())} but needs 'lo' and 'hi'")
            return z["lo"].reshape(-1).tolist(), z["hi"].reshape(-1).tolist()
    except (ValueError, OSError) as exc:
        raise InputError(f"{where}: not a plain numeric .npz ({exc})") from None


def _features(x: np.ndarray, d: int, where: str) -> np.ndarray:
    """``x`` as float64 ``[N, d]``; one line when its width fits neither the victim's flat input nor a shape."""
    if x.dtype.kind not in "fiub":
        raise InputError(f"{where}: expected numeric features, got dtype {x.dtype}; save x as float32/float64")
    if x.ndim != 2 or x.shape[1] != d:
        raise InputError(f"{where}: an array of shape {list(x.shape)} fits neither the victim's input of {d} "
                         f"features [N, {d}] nor any other shape it takes; give x as [N, {d}]")
    values = x.astype(np.float64)
    if not np.isfinite(values).all():
        raise InputError(f"{where}: the features hold NaN or infinite values; impute or drop those rows")
    return values


def raw_features(path: str | os.PathLike[str], d: int, *, with_labels: bool = False,
                 what: str = "data") -> tuple[np.ndarray, np.ndarray | None]:
    """The owner's raw features ``x`` (float64 ``[N, d]``) and labels (or ``None``) at ``path``, unmapped."""
    where = f"{what} {os.fspath(path)}"
    if isinstance(path, ArrayData):  # the owner's arrays, given in memory
        if with_labels and path.y is None:
            raise InputError(f"{where}: labels are needed but only features were given; give (x, y)")
        return _features(path.x, d, where), path.y
    p = check_own_path(path, what)
    if p.is_dir():
        raise InputError(f"{where}: a folder of images, but the victim takes a vector of {d} features; give an "
                         f".npy/.npz file holding x [N, {d}] (and y)")
    try:
        x, y = load_arrays(p, with_labels)
    except InputError as exc:
        raise InputError(f"{what} {exc}") from None
    return _features(x, d, where), y


def ranges_from_data(paths: Sequence[str | os.PathLike[str]], d: int, *, margin: float = MARGIN) -> FeatureRange:
    """Each feature's min / max over the owner's arrays at ``paths``, widened by ``margin`` of its span on each
    side (a constant feature gets +/- 0.5)."""
    if not paths:
        raise InputError(f"the victim takes a vector of {d} features and stealkit needs each feature's range; "
                         f"{ASK_RANGES}")
    xs = [raw_features(p, d, what="feature ranges from")[0] for p in paths]
    stacked = np.concatenate(xs)
    lo, hi = stacked.min(axis=0), stacked.max(axis=0)
    pad = np.where(hi > lo, margin * (hi - lo), _FLAT_PAD)
    source = "min/max of " + ", ".join(os.fspath(p) for p in paths) + f" (+/- {margin:g} of each span)"
    return FeatureRange(tuple((lo - pad).tolist()), tuple((hi + pad).tolist()), source=source, margin=margin)


def resolve_ranges(spec: Any, d: int) -> FeatureRange:
    """The feature ranges a victim of ``d`` features is attacked under: ``spec`` is a :class:`FeatureRange`, a
    ranges file (``.json`` or ``.npz`` with ``lo``/``hi``), or a sequence of the owner's data files whose min / max
    give them; anything else is refused with one line saying what to pass."""
    if isinstance(spec, FeatureRange):
        if spec.d != d:
            raise InputError(f"the feature ranges cover {spec.d} features but the victim takes {d}")
        return spec
    if isinstance(spec, str | os.PathLike):
        return load_ranges(spec, d)
    paths = [p for p in (spec or ()) if p]
    return ranges_from_data(paths, d)


def read_features(path: str | os.PathLike[str], ranges: FeatureRange, *, with_labels: bool,
                  num_classes: int | None = None, what: str = "data") -> OwnData:
    """The owner's feature vectors at ``path`` as stealkit's points in ``[0, 1]^d`` (``ranges.from_model``);
    values outside the ranges are clipped to them, and how many were is logged."""
    x, y = raw_features(path, ranges.d, with_labels=with_labels, what=what)
    where = f"{what} {os.fspath(path)}"
    u = ranges.from_model(torch.from_numpy(x)).float()
    outside = int(((u < 0) | (u > 1)).any(dim=1).sum())
    if outside:
        log.warning("%s: %d of %d rows have features outside the feature ranges (%s); clipped to them", where,
                    outside, len(u), ranges.source)
        u = u.clamp(0.0, 1.0)
    labels = labels_of(y, len(u), where, num_classes) if y is not None else None
    u = u.contiguous()
    digest = hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()
    source = "array" if isinstance(path, ArrayData) else os.fspath(path)
    return OwnData(x=u, y=labels, source=source, size=len(u), digest=digest, pixel_scale=FEATURE_SCALE)


def read_own(path: str | os.PathLike[str], *, input_shape: Sequence[int], features: FeatureRange | None,
             with_labels: bool, num_classes: int | None = None, what: str = "data") -> OwnData:
    """The owner's data at ``path`` as the victim's input: feature vectors (:func:`read_features`) for an input
    shape ``(d,)``, which needs the victim's ``features`` ranges, else images (:func:`read_images`)."""
    if is_tabular(input_shape):
        if features is None:
            raise InputError(f"{what} {os.fspath(path)}: the victim takes a vector of {input_shape[0]} features "
                             f"but its feature ranges are unknown; {ASK_RANGES}")
        return read_features(path, features, with_labels=with_labels, num_classes=num_classes, what=what)
    return read_images(path, input_shape=tuple(input_shape), with_labels=with_labels, num_classes=num_classes,
                       what=what)
