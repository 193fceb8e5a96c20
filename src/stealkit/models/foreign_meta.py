"""What stealkit must know about a foreign model file (ONNX, TorchScript), and where it reads it from.

A zoo model carries its ``model.json``; an ONNX or TorchScript file carries, at best, string metadata
(ONNX ``metadata_props``; a TorchScript ``_extra_files`` entry named :data:`META_FILE` holding a JSON object).
Both use the keys of :data:`KEYS`; the same values can be given as CLI flags (``--input-shape``,
``--num-classes``, ``--value-range``, ``--normalize``, ``--output``), which are carried to the loader inside the victim string
as ``FILE?key=value&key=value`` (so ``config.json`` records them and a run can be repeated).

Syntax of the values (metadata and flags alike):

- ``input_shape``: ``C,H,W`` (e.g. ``1,28,28``), or a JSON list; one number ``D`` for a vector of D features
  (:mod:`stealkit.data.features`);
- ``feature_ranges``: a feature-vector model's declared ranges file (JSON ``{"lo": [...], "hi": [...]}``);
- ``num_classes``: an integer >= 2;
- ``value_range``: ``LO,HI``, the pixel range the model expects (stealkit's pixels in [0, 1] are mapped
  linearly onto it: ``0,255`` for a model fed bytes);
- ``normalize``: ``none``; ``MEAN,STD`` (one value for every channel); or ``M1,M2,M3/S1,S2,S3`` (per channel);
  or a JSON object ``{"mean": [...], "std": [...]}``: applied after the value range, before the model (for a
  model whose normalisation is not its first layer);
- ``output``: ``logits`` or ``probs`` (the model ends in a softmax; stealkit takes their log). When neither the
  metadata nor a flag (``--output``) says, the file is probed once when it is opened (see
  :mod:`stealkit.models.foreign`): rows that are probabilities are read as ``probs``, anything else as ``logits``;
  :attr:`ForeignMeta.output_source` records which of ``metadata``, ``flag`` or ``probe`` decided;
- ``class_names`` (JSON list or comma-separated), ``dataset``, ``split_seed``: optional.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.models.layers import valid_input_shape

__all__ = [
    "FLAG_KEYS",
    "KEYS",
    "META_FILE",
    "OUTPUT_SOURCES",
    "ONNX_SUFFIXES",
    "TORCHSCRIPT_SUFFIXES",
    "ForeignMeta",
    "foreign_format",
    "join_victim",
    "metadata_for",
    "split_victim",
]

META_FILE = "stealkit.json"
ONNX_SUFFIXES = frozenset({".onnx"})
TORCHSCRIPT_SUFFIXES = frozenset({".pt", ".pth", ".jit", ".ts", ".torchscript"})
#: metadata keys stealkit reads (and writes on export)
KEYS = ("input_shape", "num_classes", "value_range", "normalize", "output", "class_names", "dataset", "split_seed",
        "feature_ranges")
#: the keys a CLI flag can give (``--input-shape`` etc.)
FLAG_KEYS = ("input_shape", "num_classes", "value_range", "normalize", "output")
#: where :attr:`ForeignMeta.output` came from
OUTPUT_SOURCES = ("metadata", "flag", "probe")


def foreign_format(path: str | Path) -> str | None:
    """``"onnx"``, ``"torchscript"`` or ``None`` by the file's suffix (options after ``?`` ignored; a directory,
    whatever its name, is ``None``)."""
    file = Path(split_victim(str(path))[0])
    if file.is_dir():
        return None
    suffix = file.suffix.lower()
    if suffix in ONNX_SUFFIXES:
        return "onnx"
    if suffix in TORCHSCRIPT_SUFFIXES:
        return "torchscript"
    return None


def split_victim(victim: str) -> tuple[str, dict[str, str]]:
    """``"m.onnx?input_shape=1,28,28"`` -> ``("m.onnx", {"input_shape": "1,28,28"})``; other strings unchanged."""
    path, sep, query = victim.rpartition("?")
    if not sep or Path(path).suffix.lower() not in ONNX_SUFFIXES | TORCHSCRIPT_SUFFIXES:
        return victim, {}
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted({k for k, _ in pairs} - set(KEYS))
    if unknown:
        raise InputError(f"{victim}: unknown option(s) {', '.join(unknown)} after '?'; known: {', '.join(KEYS)}")
    return path, dict(pairs)


def join_victim(path: str, options: dict[str, str]) -> str:
    """The victim string carrying ``options`` (checked) for :func:`split_victim`."""
    if not options:
        return path
    fmt = foreign_format(path)
    if fmt is None:
        raise InputError(
            f"--{'/--'.join(k.replace('_', '-') for k in options)} only apply to an ONNX (.onnx) or TorchScript (.pt) "
            f"victim; {path} is neither (a model directory's model.json already says its shape and classes)"
        )
    parse_options(options, where="the command line")  # fail before any work
    base, old = split_victim(path)
    return base + "?" + urllib.parse.urlencode({**old, **options}, safe=",/")


def _numbers(text: str, what: str, where: str) -> list[float]:
    try:
        values = [float(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"{where}: {what} must be comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise InputError(f"{where}: {what} must be finite numbers, got {text!r}")
    return values


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _shape(value: Any, where: str) -> tuple[int, int, int]:
    value = _json_or_text(value)
    if isinstance(value, str):
        try:
            value = [int(t) for t in value.replace(" ", "").split(",") if t]
        except ValueError:
            raise InputError(f"{where}: input_shape must be C,H,W (e.g. 1,28,28), got {value!r}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    try:
        return valid_input_shape(value, features=True)
    except InputError as exc:
        raise InputError(f"{where}: {exc} (e.g. 1,28,28)") from None


def _classes(value: Any, where: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 2:
        raise InputError(f"{where}: num_classes must be an integer >= 2, got {value!r}")
    return n


def _range(value: Any, where: str) -> tuple[float, float]:
    value = _json_or_text(value)
    nums = [float(v) for v in value] if isinstance(value, list) else _numbers(str(value), "value_range", where)
    if len(nums) != 2 or not nums[0] < nums[1]:
        raise InputError(f"{where}: value_range must be LO,HI with LO < HI (e.g. 0,1 or 0,255), got {value!r}")
    return nums[0], nums[1]


def _normalize(value: Any, where: str) -> tuple[list[float], list[float]] | None:
    value = _json_or_text(value)
    if isinstance(value, dict):
        mean, std = value.get("mean"), value.get("std")
        if not isinstance(mean, list) or not isinstance(std, list):
            raise InputError(f"{where}: normalize as JSON must be {{\"mean\": [...], \"std\": [...]}}, got {value!r}")
        mean_l, std_l = _numbers(",".join(map(str, mean)), "mean", where), _numbers(",".join(map(str, std)), "std", where)
    else:
        text = str(value).strip()
        if text.lower() in ("none", ""):
            return None
        if "/" in text:
            m, _, s = text.partition("/")
            mean_l, std_l = _numbers(m, "normalize mean", where), _numbers(s, "normalize std", where)
        else:
            nums = _numbers(text, "normalize", where)
            if len(nums) != 2:
                raise InputError(
                    f"{where}: normalize must be none, MEAN,STD or M1,M2,M3/S1,S2,S3, got {text!r}"
                )
            mean_l, std_l = nums[:1], nums[1:]
    if any(s <= 0 for s in std_l):
        raise InputError(f"{where}: normalize std must be positive, got {std_l}")
    return mean_l, std_l


def _class_names(value: Any, where: str) -> list[str]:
    value = _json_or_text(value)
    if isinstance(value, str):
        value = [t.strip() for t in value.split(",")]
    if not isinstance(value, list):
        raise InputError(f"{where}: class_names must be a list of names, got {value!r}")
    return [str(v) for v in value]


_PARSERS = {"input_shape": _shape, "num_classes": _classes, "value_range": _range, "normalize": _normalize,
            "class_names": _class_names}


def parse_options(raw: dict[str, Any], *, where: str) -> dict[str, Any]:
    """Check and convert metadata/flag values; unknown keys are kept as they are (free metadata)."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _PARSERS:
            out[key] = _PARSERS[key](value, where)
        elif key == "output":
            if str(value) not in ("logits", "probs"):
                raise InputError(f"{where}: output must be 'logits' or 'probs', got {value!r}")
            out[key] = str(value)
        elif key == "split_seed":
            try:
                out[key] = int(str(value))
            except ValueError:
                raise InputError(f"{where}: split_seed must be an integer, got {value!r}") from None
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ForeignMeta:
    """What stealkit knows about a foreign model: the file, its format, and how to feed it.

    It plays the part a :class:`~stealkit.models.ModelSpec` plays for a zoo model (``input_shape``,
    ``num_classes``, ``class_names``, ``extra``), so code reading a victim's spec reads either.
    """

    path: str
    format: str
    input_shape: tuple[int, int, int]
    num_classes: int
    value_range: tuple[float, float] = (0.0, 1.0)
    mean: list[float] | None = None
    std: list[float] | None = None
    output: str = "logits"
    #: who said what ``output`` is: ``metadata`` (the file), ``flag`` (``--output`` or ``FILE?output=``) or
    #: ``probe`` (neither: the rows the model returned on a fixed probe batch when it was opened decided)
    output_source: str = "probe"
    class_names: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    assumed: tuple[str, ...] = ()  # keys neither the file nor a flag gave (defaults were used)

    @property
    def arch(self) -> str:
        """What stands where a zoo model names its architecture: the file's format (``onnx``, ``torchscript``)."""
        return self.format

    @property
    def metrics(self) -> dict[str, Any]:
        """A foreign file carries no stealkit metrics (a zoo model's ``model.json`` does)."""
        return {}

    def record(self) -> dict[str, Any]:
        """What a run's ``config.json`` should keep about how the file was read (beside the victim string)."""
        return {"format": self.format, "output": self.output, "output_source": self.output_source,
                "assumed": list(self.assumed)}

    def with_classes(self, num_classes: int) -> ForeignMeta:
        names = self.class_names or [str(i) for i in range(num_classes)]
        if len(names) != num_classes:
            raise InputError(
                f"{self.path}: class_names has {len(names)} names but the model has {num_classes} classes"
            )
        return replace(self, num_classes=num_classes, class_names=names)


def metadata_for(
    spec: Any, *, normalize: str = "none", value_range: str = "0,1", output: str = "logits"
) -> dict[str, str]:
    """String metadata (the keys of :data:`KEYS`) describing a zoo model for an exported file."""
    extra = getattr(spec, "extra", None) or {}
    meta = {
        "input_shape": ",".join(str(v) for v in spec.input_shape),
        "num_classes": str(spec.num_classes),
        "value_range": value_range,
        "normalize": normalize,
        "output": output,
        "class_names": json.dumps(list(getattr(spec, "class_names", None) or [])),
    }
    for key in ("dataset", "split_seed"):
        if extra.get(key) is not None:
            meta[key] = str(extra[key])
    return meta
