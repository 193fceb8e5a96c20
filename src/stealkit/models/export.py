"""Export a zoo model to ONNX, TorchScript or a single safetensors file, checked by loading the export back.

Every export carries the metadata of :mod:`stealkit.models.foreign_meta` (input shape, classes, value range
[0, 1], ``normalize=none`` since normalisation is the model's first layer, class names, data set), so
``--victim FILE`` and ``--substitute FILE`` read it without flags. The file is written in a temporary
directory beside the target, loaded back (onnxruntime, ``torch.jit.load`` or :func:`load_model`), its answers
compared with the model's on a seeded batch of random images, and only then renamed into place: a failed
check leaves no file.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit import __version__
from stealkit.errors import InputError, StealkitError
from stealkit.models.foreign_meta import META_FILE, ONNX_SUFFIXES, TORCHSCRIPT_SUFFIXES, metadata_for
from stealkit.models.layers import Classifier
from stealkit.models.spec import ModelSpec

__all__ = ["FORMATS", "TOLERANCE", "ExportResult", "export_model", "format_for"]

FORMATS = ("onnx", "torchscript", "safetensors")
#: largest max |difference| of logits accepted between a float32 export and the model
TOLERANCE = 1e-4
_SUFFIXES = {"onnx": ONNX_SUFFIXES, "torchscript": TORCHSCRIPT_SUFFIXES, "safetensors": frozenset({".safetensors"})}


@dataclass(frozen=True)
class ExportResult:
    path: Path
    format: str
    max_abs_diff: float
    checked_images: int
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "max_abs_diff": self.max_abs_diff,
                "checked_images": self.checked_images, "bytes": self.bytes}


def format_for(out: str | Path, fmt: str | None) -> str:
    """The export format: ``fmt`` if given (checked against the file's suffix), else read from the suffix."""
    suffix = Path(out).suffix.lower()
    if fmt is None:
        for name, suffixes in _SUFFIXES.items():
            if suffix in suffixes:
                return name
        raise InputError(f"cannot tell the format of {out} from its suffix; pass --format onnx|torchscript|"
                         "safetensors or name the file .onnx, .pt or .safetensors")
    if fmt not in FORMATS:
        raise InputError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if suffix not in _SUFFIXES[fmt]:
        raise InputError(f"a {fmt} export must be named {' or '.join(sorted(_SUFFIXES[fmt]))} (stealkit reads files "
                         f"by suffix), got {out}")
    return fmt


class _Plain(nn.Module):
    """A zoo model's computation without its Python-side shape check (what tracing records)."""

    def __init__(self, model: Classifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.net(self.model.normalize(x))


def _traceable(model: nn.Module) -> nn.Module:
    """What the exporters trace, in eval mode (a fresh wrapper is in training mode, and the ONNX exporter
    restores the mode it found on the wrapper to everything inside it: BatchNorm would use batch statistics)."""
    return (_Plain(model) if isinstance(model, Classifier) else model).eval()


def _metadata(spec: ModelSpec) -> dict[str, str]:
    return metadata_for(spec) | {"stealkit_version": __version__, "stealkit_spec": json.dumps(spec.to_dict())}


def _write_onnx(model: nn.Module, spec: ModelSpec, path: Path, example: torch.Tensor) -> None:
    try:
        import onnx
    except ImportError:
        raise StealkitError("ONNX export needs the onnx package: pip install 'stealkit[interop]'") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(_traceable(model), (example,), str(path), dynamo=False, input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=17)
    proto = onnx.load(str(path))
    for key, value in _metadata(spec).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


def _write_torchscript(model: nn.Module, spec: ModelSpec, path: Path, example: torch.Tensor) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notices
        traced = torch.jit.trace(_traceable(model), example, _store_inputs=False)
        torch.jit.save(traced, str(path), _extra_files={META_FILE: json.dumps(_metadata(spec))})


def _write_safetensors(model: nn.Module, spec: ModelSpec, path: Path, example: torch.Tensor) -> None:
    from stealkit.models.io import write_weights

    write_weights(model, spec, path)


def _reload(fmt: str, path: Path, device: torch.device) -> nn.Module:
    if fmt == "safetensors":
        from stealkit.models.io import load_model

        return load_model(path, device=device)[0]
    from stealkit.models.foreign import load_onnx, load_torchscript

    return (load_onnx if fmt == "onnx" else load_torchscript)(path, device=device)[0]


_WRITERS = {"onnx": _write_onnx, "torchscript": _write_torchscript, "safetensors": _write_safetensors}


def export_model(model: nn.Module, spec: ModelSpec, out: str | Path, fmt: str | None = None, *,
                 batch: int = 64, seed: int = 0, tolerance: float = TOLERANCE,
                 device: str | torch.device = "cpu") -> ExportResult:
    """Write ``model`` to ``out`` as ``fmt`` (default: by suffix); check it on ``batch`` seeded random images.

    The file is traced/written from a CPU copy of the model; the check runs the model and the reloaded export
    on ``device``. Raises :class:`StealkitError` (and writes nothing) if the max |logit difference| exceeds
    ``tolerance``.
    """
    out = Path(out)
    fmt = format_for(out, fmt)
    if out.is_dir():
        raise InputError(f"--out {out} is a directory; name the file to write (e.g. {out / ('model.' + fmt)})")
    if batch < 1:
        raise InputError(f"the check batch must hold at least one image, got {batch}")
    dev = torch.device(device)
    cpu_model = model.to("cpu").eval()
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, *spec.input_shape, generator=gen)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmpdir:
        tmp = Path(tmpdir) / out.name
        _WRITERS[fmt](cpu_model, spec, tmp, x[:2])
        model = cpu_model.to(dev).eval()
        with torch.no_grad():
            want = model(x.to(dev)).float()
            got = _reload(fmt, tmp, dev)(x.to(dev)).float()
        if got.shape != want.shape:
            raise StealkitError(f"the {fmt} export answers shape {list(got.shape)}, the model {list(want.shape)}; "
                                "nothing was written")
        diff = float((got - want).abs().max())
        if not diff <= tolerance:
            raise StealkitError(f"the {fmt} export differs from the model by {diff:.3g} (max |logit difference| on "
                                f"{batch} images, > {tolerance:g}); nothing was written")
        size = tmp.stat().st_size
        os.replace(tmp, out)
    return ExportResult(path=out, format=fmt, max_abs_diff=diff, checked_images=batch, bytes=size)
