"""Victims from the files users have: ONNX (run by onnxruntime) and TorchScript (``torch.jit.load``).

Each loads as a :class:`ForeignClassifier`, an ``nn.Module`` that takes stealkit's pixels (float32 NCHW in
[0, 1]) and returns logits ``[B, K]``, so :class:`~stealkit.oracle.LocalOracle` answers it unchanged and the
ledger counts exactly as for a zoo model. What the file's metadata or the flags say about the input (shape,
value range, normalisation; see :mod:`stealkit.models.foreign_meta`) is applied inside the module.

Safety: a ``.pt`` is loaded only if it is a TorchScript archive (a zip holding ``code/`` and
``constants.pkl``). ``torch.save`` checkpoints, which need Python's unpickler and can run any code, are refused
before anything is read by torch. An ONNX model runs in onnxruntime, which gives no gradients: it answers
predictions (label, top-k, probs, logits) but cannot explain.
"""

from __future__ import annotations

import logging
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError, StealkitError, UnsafeFileError
from stealkit.models.foreign_meta import (
    KEYS,
    META_FILE,
    ForeignMeta,
    foreign_format,
    parse_options,
    split_victim,
)

__all__ = ["ForeignClassifier", "OnnxRunner", "is_foreign", "load_foreign", "load_onnx", "load_torchscript"]

log = logging.getLogger(__name__)

_ZIP_MAGIC = b"PK\x03\x04"
_ONNX_DTYPES = {"tensor(float)": torch.float32, "tensor(double)": torch.float64, "tensor(float16)": torch.float16}
_TO_TORCHSCRIPT = (
    "In a trusted session, load it yourself and save it as TorchScript "
    "(torch.jit.save(torch.jit.script(model), 'model.pt'), or torch.jit.trace(model, example_batch)) or export "
    "it to ONNX (torch.onnx.export), then pass that file; stealkit never unpickles"
)


def is_foreign(victim: str | Path) -> bool:
    """Whether ``victim`` names an ONNX or TorchScript file (by suffix)."""
    return foreign_format(str(victim)) is not None


class ForeignClassifier(nn.Module):
    """A foreign model behind stealkit's convention: pixels in [0, 1] in, logits out.

    ``body`` gets the pixels mapped onto ``meta.value_range`` and normalised by ``meta.mean``/``meta.std``
    (if given); a ``probs`` output is turned into log-probabilities (logits up to a constant per image).
    """

    def __init__(self, body: nn.Module, meta: ForeignMeta) -> None:
        super().__init__()
        self.body = body
        self.meta = meta
        self.input_shape = tuple(meta.input_shape)
        self.num_classes = int(meta.num_classes)
        lo, hi = meta.value_range
        self._affine = (float(lo), float(hi - lo)) if (lo, hi) != (0.0, 1.0) else None
        self.mean: torch.Tensor | None
        self.std: torch.Tensor | None
        if meta.mean is not None and meta.std is not None:
            c = self.input_shape[0]
            mean = torch.tensor(meta.mean * (c if len(meta.mean) == 1 else 1), dtype=torch.float32)
            std = torch.tensor(meta.std * (c if len(meta.std) == 1 else 1), dtype=torch.float32)
            if mean.numel() != c or std.numel() != c:
                raise InputError(f"{meta.path}: normalize has {mean.numel()} mean / {std.numel()} std values for "
                                 f"{c} channel(s); give one value, or one per channel")
            self.register_buffer("mean", mean.view(1, c, 1, 1))
            self.register_buffer("std", std.view(1, c, 1, 1))
        else:
            self.mean = self.std = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.input_shape:
            raise InputError(f"{self.meta.path} expects input of shape [B, {', '.join(map(str, self.input_shape))}]"
                             f" (pixels in [0, 1]), got {list(x.shape)}")
        z = x
        if self._affine is not None:
            z = z * self._affine[1] + self._affine[0]
        if self.mean is not None and self.std is not None:
            z = (z - self.mean) / self.std
        out = self.body(z)
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != x.shape[0]:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InputError(f"{self.meta.path}: the model returned {got}; expected one tensor [B, classes]")
        out = out.float()
        if self.meta.output == "probs":
            out = torch.log(out.clamp_min(torch.finfo(torch.float32).tiny))
        return out


class OnnxRunner(nn.Module):
    """Runs an onnxruntime session as a module: no gradients; the answer lands on the input's device."""

    def __init__(self, session: Any, path: str, *, input_name: str, output_name: str, dtype: torch.dtype,
                 flat: bool, batch: int | None) -> None:
        super().__init__()
        self.session = session
        self.path = path
        self.input_name = input_name
        self.output_name = output_name
        self.dtype = dtype
        self.flat = flat
        self.batch = batch  # a fixed batch size baked into the graph, else None

    def __deepcopy__(self, memo: dict[int, Any]) -> OnnxRunner:
        """A copy sharing the (read-only, thread-safe) session, which cannot be pickled."""
        return OnnxRunner(self.session, self.path, input_name=self.input_name, output_name=self.output_name,
                          dtype=self.dtype, flat=self.flat, batch=self.batch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise InputError(f"{self.path} is an ONNX victim: onnxruntime gives no gradients, so it cannot explain "
                             "or be a white-box substitute; use a TorchScript or stealkit model for that")
        arr = x.detach().to("cpu", self.dtype)
        if self.flat:
            arr = arr.reshape(arr.shape[0], -1)
        n = arr.shape[0]
        step = self.batch or max(1, n)
        outs = []
        for i in range(0, n, step):
            chunk = arr[i : i + step]
            if self.batch and chunk.shape[0] < self.batch:  # pad a fixed-batch graph's last chunk
                pad = torch.zeros(self.batch - chunk.shape[0], *chunk.shape[1:], dtype=chunk.dtype)
                chunk = torch.cat([chunk, pad])
            try:
                (out,) = self.session.run([self.output_name], {self.input_name: chunk.contiguous().numpy()})
            except Exception as exc:  # onnxruntime raises its own (non-torch) exception types
                raise InputError(f"{self.path}: onnxruntime failed on a batch of shape {list(chunk.shape)}: "
                                 f"{str(exc).splitlines()[0]}") from None
            outs.append(torch.from_numpy(out)[: min(step, n - i)])
        return torch.cat(outs).to(x.device)


def _resolve_meta(path: Path, fmt: str, file_meta: dict[str, Any], flags: dict[str, str], *,
                  graph_shape: tuple[int, int, int] | None = None, flat_size: int | None = None) -> ForeignMeta:
    """Merge what the file says and what the flags say (flags win); the input shape must be known."""
    stored = parse_options({k: v for k, v in file_meta.items() if k in KEYS}, where=f"{path} (metadata)")
    given = parse_options(flags, where="--" + "/--".join(k.replace("_", "-") for k in flags) if flags else "")
    merged = {**stored, **given}
    shape = merged.get("input_shape", graph_shape)
    if shape is None:
        raise InputError(
            f"{path}: its input shape is unknown: neither the file's metadata (input_shape) nor a flag says; "
            "pass --input-shape C,H,W (e.g. 1,28,28), or append ?input_shape=C,H,W to the file name"
        )
    if graph_shape is not None and tuple(shape) != graph_shape:
        raise InputError(f"{path}: the graph takes images of shape {list(graph_shape)} but input_shape says "
                         f"{list(shape)}; fix the metadata or --input-shape")
    if flat_size is not None and shape[0] * shape[1] * shape[2] != flat_size:
        raise InputError(f"{path}: the graph takes flat vectors of {flat_size} values but input_shape {list(shape)} "
                         f"has {shape[0] * shape[1] * shape[2]}; fix --input-shape")
    assumed = tuple(k for k in ("value_range", "normalize") if k not in merged)
    if assumed:
        log.warning("%s: neither its metadata nor a flag gives %s; assuming pixels in [0, 1] and no normalisation "
                    "outside the model (pass --value-range / --normalize if it expects otherwise)",
                    path, " or ".join(assumed))
    norm = merged.get("normalize")
    extra = {k: v for k, v in merged.items() if k in ("dataset", "split_seed")}
    return ForeignMeta(
        path=str(path), format=fmt, input_shape=tuple(shape),  # type: ignore[arg-type]
        num_classes=int(merged.get("num_classes", 0)), value_range=merged.get("value_range", (0.0, 1.0)),
        mean=norm[0] if norm else None, std=norm[1] if norm else None, output=merged.get("output", "logits"),
        class_names=list(merged.get("class_names", [])), extra=extra, assumed=assumed,
    )


def _finish(body: nn.Module, meta: ForeignMeta, num_classes: int | None, device: torch.device) -> ForeignClassifier:
    """Wrap, run one probe batch to learn/check the class count, and return the module in eval mode."""
    model = ForeignClassifier(body, meta).to(device).eval()
    try:
        with torch.inference_mode():
            out = model(torch.full((2, *meta.input_shape), 0.5, device=device))
    except InputError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise InputError(f"{meta.path}: the model failed on a batch of shape [2, {', '.join(map(str, meta.input_shape))}]"
                         f": {str(exc).strip().splitlines()[-1][:300]}; check --input-shape") from None
    k = int(out.shape[1])
    for claimed, who in ((meta.num_classes, "num_classes"), (num_classes, "the graph's output")):
        if claimed and claimed != k:
            raise InputError(f"{meta.path}: {who} says {claimed} classes but the model returns {k}; "
                             "fix the metadata or --num-classes")
    if k < 2:
        raise InputError(f"{meta.path}: the model returns {k} value(s) per image; a classifier needs >= 2 classes")
    model.meta = meta.with_classes(k)
    model.num_classes = k
    return model


def _torch_device(device: str | torch.device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"unknown device {device!r}: {exc}; use e.g. 'cpu' or 'cuda'") from None


def _check_torchscript_file(path: Path) -> None:
    """Refuse anything but a TorchScript archive before torch reads a byte of it."""
    if not path.is_file():
        raise InputError(f"TorchScript file {path} does not exist")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:1] == b"\x80":
        raise UnsafeFileError(f"refusing to load {path}: it is a pickle (torch.save's legacy format), not "
                              f"TorchScript. {_TO_TORCHSCRIPT}")
    if head != _ZIP_MAGIC:
        raise InputError(f"{path} is not a TorchScript archive (a zip file written by torch.jit.save)")
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"{path} is not a readable TorchScript archive: {exc}") from None
    has_code = any("/code/" in n for n in names)
    has_constants = any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in names)
    if not (has_code and has_constants):
        raise UnsafeFileError(f"refusing to load {path}: it is a torch.save checkpoint (a pickled object), not "
                              f"TorchScript. {_TO_TORCHSCRIPT}")


def load_torchscript(path: str | Path, *, device: str | torch.device = "cpu",
                     flags: dict[str, str] | None = None) -> tuple[ForeignClassifier, ForeignMeta]:
    """Load a TorchScript classifier with ``torch.jit.load`` (never ``torch.load``); metadata from the
    ``stealkit.json`` extra file, overridden by ``flags``."""
    import json

    p = Path(path)
    dev = _torch_device(device)
    _check_torchscript_file(p)
    extra = {META_FILE: ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            body = torch.jit.load(str(p), map_location=dev, _extra_files=extra)
    except (RuntimeError, ValueError) as exc:
        raise InputError(f"{p}: torch.jit.load could not read it ({str(exc).strip().splitlines()[0][:200]})") from None
    raw = extra[META_FILE]
    file_meta: dict[str, Any] = {}
    if raw:
        try:
            file_meta = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{p}: its {META_FILE} extra file is not JSON ({exc})") from None
        if not isinstance(file_meta, dict):
            raise InputError(f"{p}: its {META_FILE} extra file must hold a JSON object")
    meta = _resolve_meta(p, "torchscript", file_meta, flags or {})
    model = _finish(body, meta, None, dev)
    return model, model.meta


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise StealkitError("ONNX victims need onnxruntime: pip install 'stealkit[interop]'") from None
    return onnxruntime


def _providers(ort: Any, device: torch.device) -> list[str]:
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("this onnxruntime has no CUDA provider (pip install onnxruntime-gpu); the ONNX model runs on "
                    "the CPU and its answers are moved to %s", device)
    return ["CPUExecutionProvider"]


def _static(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def load_onnx(path: str | Path, *, device: str | torch.device = "cpu",
              flags: dict[str, str] | None = None) -> tuple[ForeignClassifier, ForeignMeta]:
    """Open an ONNX classifier in onnxruntime (CUDA provider when ``device`` is a GPU and it exists)."""
    ort = _onnxruntime()
    p = Path(path)
    dev = _torch_device(device)
    if not p.is_file():
        raise InputError(f"ONNX file {p} does not exist")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(p), opts, providers=_providers(ort, dev))
    except Exception as exc:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
        raise InputError(f"{p} is not an ONNX model onnxruntime can load: {str(exc).splitlines()[0][:300]}") from None
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise InputError(f"{p}: the graph has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); stealkit "
                         "expects one image tensor [batch, C, H, W]")
    inp = inputs[0]
    if inp.type not in _ONNX_DTYPES or len(inp.shape) not in (2, 4):
        raise InputError(f"{p}: its input {inp.name!r} is {inp.type} of shape {inp.shape}; stealkit expects an "
                         "image tensor of floats [batch, C, H, W] (or flat [batch, C*H*W] with --input-shape)")
    file_meta = dict(session.get_modelmeta().custom_metadata_map)
    outs = [o for o in session.get_outputs() if o.type in _ONNX_DTYPES and len(o.shape) == 2]
    wanted = file_meta.get("output_name")
    if wanted:
        outs = [o for o in session.get_outputs() if o.name == wanted]
    if not outs:
        raise InputError(f"{p}: no output is a float tensor [batch, classes] "
                         f"(outputs: {', '.join(f'{o.name} {o.type} {o.shape}' for o in session.get_outputs())})")
    dims = [_static(d) for d in inp.shape]
    graph_shape = tuple(dims[1:]) if len(dims) == 4 and all(dims[1:]) else None
    flat_size = dims[1] if len(dims) == 2 else None
    meta = _resolve_meta(p, "onnx", file_meta, flags or {}, graph_shape=graph_shape,  # type: ignore[arg-type]
                         flat_size=flat_size)
    runner = OnnxRunner(session, str(p), input_name=inp.name, output_name=outs[0].name,
                        dtype=_ONNX_DTYPES[inp.type], flat=len(dims) == 2, batch=dims[0])
    model = _finish(runner, meta, _static(outs[0].shape[1]), dev)
    return model, model.meta


def load_foreign(victim: str | Path, *, device: str | torch.device = "cpu",
                 flags: dict[str, str] | None = None) -> tuple[ForeignClassifier, ForeignMeta]:
    """Load ``FILE.onnx`` / ``FILE.pt`` (optionally ``FILE?key=value&...``, see
    :mod:`stealkit.models.foreign_meta`) as a :class:`ForeignClassifier`."""
    path, options = split_victim(str(victim))
    options = {**options, **(flags or {})}
    fmt = foreign_format(path)
    if fmt == "onnx":
        return load_onnx(path, device=device, flags=options)
    if fmt == "torchscript":
        return load_torchscript(path, device=device, flags=options)
    raise InputError(f"{path}: expected an ONNX (.onnx) or TorchScript (.pt) file")
