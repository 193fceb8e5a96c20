"""``ModelSpec``: everything needed to rebuild a zoo model, plus free metadata, stored as ``model.json``.

The JSON is plain data (never code) and every field is validated when read, so a hand-edited or truncated
file fails with a message that names the field.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any

from torch import nn

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.fsutil import to_jsonable
from stealkit.models.layers import Classifier, valid_input_shape
from stealkit.models.zoo import ARCHITECTURES, DEFAULT_MEAN, DEFAULT_STD

__all__ = ["SPEC_FORMAT", "ModelSpec"]

SPEC_FORMAT = "stealkit.model/1"

_REQUIRED = ("arch", "input_shape", "num_classes")


def _json_dict(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(
            f"model spec field {name!r} must be a JSON object (dict), got {type(value).__name__}"
        )
    if not all(isinstance(k, str) for k in value):
        raise InputError(f"model spec field {name!r} must have string keys, got {list(value)!r}")
    data = to_jsonable(copy.deepcopy(value))
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"model spec field {name!r} must hold only JSON values (numbers, strings, ...): {exc}"
        ) from exc
    return data


def _floats(name: str, value: Any, channels: int) -> list[float]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise InputError(f"model spec field {name!r} must be a list of {channels} numbers, got {value!r}")
    if len(value) != channels:
        raise InputError(
            f"model spec field {name!r} has {len(value)} values but input_shape has {channels} channel(s); "
            "give one value per channel"
        )
    out = [float(v) for v in value]
    if not all(math.isfinite(v) for v in out):
        raise InputError(f"model spec field {name!r} must be finite, got {out}")
    return out


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to rebuild a model (``arch``, ``input_shape``, ``num_classes``, ``kwargs``, ``mean``, ``std``) and
    what is known about it (``class_names``, ``metrics``, ``extra``, ``stealkit_version``).

    Frozen: fields cannot be reassigned (use :func:`dataclasses.replace`). ``mean``/``std`` default to 0.5
    per channel, ``class_names`` to ``["0", "1", ...]``. Dict fields are deep-copied on construction.
    """

    arch: str
    input_shape: tuple[int, int, int]
    num_classes: int
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    mean: list[float] | None = None
    std: list[float] | None = None
    class_names: list[str] | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    stealkit_version: str = __version__
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if not isinstance(self.arch, str) or self.arch not in ARCHITECTURES:
            raise InputError(
                f"model spec field 'arch' is {self.arch!r}; it must be one of: {', '.join(sorted(ARCHITECTURES))}"
            )
        shape = (valid_input_shape(self.input_shape, features=True)
                 if isinstance(self.input_shape, list | tuple) else None)
        if shape is None:
            raise InputError(
                f"model spec field 'input_shape' must be [channels, height, width], got {self.input_shape!r}"
            )
        put("input_shape", shape)
        n = self.num_classes
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise InputError(f"model spec field 'num_classes' must be an integer >= 2, got {n!r}")
        put("kwargs", _json_dict("kwargs", self.kwargs))
        channels = shape[0]
        put("mean", _floats("mean", [DEFAULT_MEAN] * channels if self.mean is None else self.mean, channels))
        std = _floats("std", [DEFAULT_STD] * channels if self.std is None else self.std, channels)
        if any(s <= 0 for s in std):
            raise InputError(f"model spec field 'std' must be positive in every channel, got {std}")
        put("std", std)
        names = [str(i) for i in range(n)] if self.class_names is None else self.class_names
        if not isinstance(names, list | tuple) or not all(isinstance(s, str) for s in names):
            raise InputError(f"model spec field 'class_names' must be a list of strings, got {names!r}")
        if len(names) != n:
            raise InputError(
                f"model spec field 'class_names' has {len(names)} names but num_classes is {n}; give one name per class"
            )
        put("class_names", list(names))
        put("metrics", _json_dict("metrics", self.metrics))
        put("extra", _json_dict("extra", self.extra))
        if not isinstance(self.stealkit_version, str):
            raise InputError(
                f"model spec field 'stealkit_version' must be a string, got {self.stealkit_version!r}"
            )

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        *,
        class_names: list[str] | None = None,
        metrics: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> ModelSpec:
        """Describe a model made by :func:`~stealkit.models.build_model` (it remembers how it was built)."""
        if not isinstance(model, Classifier):
            raise InputError(
                f"ModelSpec.from_model needs a model made by stealkit.models.build_model, got {type(model).__name__}; "
                "write the ModelSpec yourself"
            )
        return cls(
            arch=model.arch,
            input_shape=model.input_shape,  # type: ignore[arg-type]
            num_classes=model.num_classes,
            kwargs=dict(model.arch_kwargs),
            mean=model.normalize.mean.flatten().tolist(),
            std=model.normalize.std.flatten().tolist(),
            class_names=class_names,
            metrics=dict(metrics or {}),
            extra=dict(extra or {}),
        )

    def build_args(self) -> dict[str, Any]:
        """Keyword arguments for :func:`~stealkit.models.build_model` (besides ``arch``)."""
        return {
            "input_shape": self.input_shape,
            "num_classes": self.num_classes,
            "mean": self.mean,
            "std": self.std,
            **self.kwargs,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, with a ``format`` tag first."""
        d: dict[str, Any] = {"format": SPEC_FORMAT}
        for f in dataclasses.fields(self):
            d[f.name] = copy.deepcopy(getattr(self, f.name))
        d["input_shape"] = list(self.input_shape)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        if not isinstance(data, dict):
            raise InputError(f"a model spec must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        fmt = data.pop("format", SPEC_FORMAT)
        if fmt != SPEC_FORMAT:
            raise InputError(
                f"model spec format is {fmt!r}; this stealkit ({__version__}) reads {SPEC_FORMAT!r}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(
                f"model spec has unknown field(s) {', '.join(unknown)}; valid fields are: {', '.join(sorted(names))} "
                "(put free metadata under 'extra')"
            )
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise InputError(f"model spec is missing required field(s): {', '.join(missing)}")
        # JSON has no null defaults for these: absent means default, explicit null is an error.
        for key in ("kwargs", "metrics", "extra", "stealkit_version"):
            if key in data and data[key] is None:
                raise InputError(f"model spec field {key!r} is null; remove it or give a value")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelSpec:
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"model spec is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
