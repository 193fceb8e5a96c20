"""Victims from the files users have: ONNX (run by onnxruntime) and TorchScript (``torch.jit.load``).

Each loads as a :class:`ForeignClassifier`, an ``nn.Module`` that takes stealkit's pixels (float32 NCHW in
[0, 1]) and returns logits ``[B, K]``, so :class:`~stealkit.oracle.LocalOracle` answers it unchanged and the
ledger counts exactly as for a zoo model. What the file's metadata or the flags say about the input (shape,
value range, normalisation; see :mod:`stealkit.models.foreign_meta`) is applied inside the module. A graph whose
input is flat ``[batch, d]`` with no image shape declared takes a vector of ``d`` features: the module then takes
the model's raw features, and the victim is opened behind a feature-range map (:mod:`stealkit.oracle.tabular`).

Safety: a ``.pt`` is loaded only if it is a TorchScript archive (a zip holding ``code/`` and
``constants.pkl``). ``torch.save`` checkpoints, which need Python's unpickler and can run any code, are refused
before anything is read by torch. An ONNX model runs in onnxruntime, which gives no gradients: it answers
predictions (label, top-k, probs, logits) but cannot explain.

What the output is: logits, or probabilities (a graph ending in a softmax, which stealkit turns into logits by
taking their log). The file's metadata (``output``) or the flag (``--output``, folded into the victim string as
``?output=``) says; when neither does, the model is *probed* once when it is opened: it is run on
:data:`PROBE_ROWS` seeded uniform images (pixels in [0, 1], so in the model's own input range after the value
range is applied), outside any query ledger (it is the owner's file, not an attack). Rows that are all
non-negative and sum to 1 (within :data:`PROBE_TOLERANCE`) are probabilities; anything else is logits. The
decision and who made it (``metadata``, ``flag``, ``probe``) are logged as one line and kept in
:class:`ForeignMeta` (``output``, ``output_source``). A declared output that the probe contradicts is obeyed with
a warning, except ``probs`` for a model returning negative values, which is refused (there is no log of them).

ONNX outputs: the first float tensor ``[batch, classes]`` is used (so for a scikit-learn model converted by
skl2onnx, which returns ``label`` then ``probabilities``, the probabilities); metadata ``output_name`` names
another. Failing that, a skl2onnx ``ZipMap`` output (a sequence of ``{class: probability}`` maps) is read with
the classes in the order of their keys, sorted (numbers numerically, names as strings: the order of
scikit-learn's ``classes_``), checked against the graph's label output when it has one; the keys become the class
names unless the metadata gives them.
"""

from __future__ import annotations

import logging
import warnings
import zipfile
from dataclasses import replace
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

__all__ = [
    "PROBE_ROWS",
    "PROBE_TOLERANCE",
    "ZIPMAP_FIX",
    "ForeignClassifier",
    "OnnxRunner",
    "is_foreign",
    "load_foreign",
    "load_onnx",
    "load_torchscript",
    "looks_like_probs",
]

log = logging.getLogger(__name__)

_ZIP_MAGIC = b"PK\x03\x04"
#: the probe batch run once when a file is opened: its size, its seed, and how far from 1 a row of
#: probabilities may sum (float32 softmax rows sum to 1 within ~1e-6; float16 ones within ~1e-3)
PROBE_ROWS = 16
PROBE_SEED = 0
PROBE_TOLERANCE = 1e-4
_PROBE_TOLERANCE_HALF = 1e-2
ZIPMAP_FIX = ("re-export it with skl2onnx's options={id(clf): {'zipmap': False}} (to_onnx(clf, X, "
              "options=...)), which returns the probabilities as one float tensor [N, classes]")
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
        if len(self.input_shape) == 1 and (meta.value_range != (0.0, 1.0) or meta.mean is not None):
            raise InputError(f"{meta.path} takes a vector of {self.input_shape[0]} features: stealkit maps them with "
                             "feature ranges taken from your data, not --value-range / --normalize; drop those")
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
        out = self.raw(x).float()
        if self.meta.output == "probs":
            out = torch.log(out.clamp_min(torch.finfo(torch.float32).tiny))
        return out

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """stealkit's pixels ``x`` as the model takes them: mapped onto the value range, then normalised."""
        z = x
        if self._affine is not None:
            z = z * self._affine[1] + self._affine[0]
        if self.mean is not None and self.std is not None:
            z = (z - self.mean) / self.std
        return z

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """What the file's model returns for stealkit's pixels ``x`` (after the value range and normalisation),
        before any ``probs`` -> logits conversion: one tensor ``[B, K]`` in the model's own dtype."""
        if x.dim() != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise InputError(f"{self.meta.path} expects input of shape [B, {', '.join(map(str, self.input_shape))}]"
                             f", got {list(x.shape)}")
        out = self.body(self.prepare(x))
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != x.shape[0]:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InputError(f"{self.meta.path}: the model returned {got}; expected one tensor [B, classes]")
        return out


class OnnxRunner(nn.Module):
    """Runs an onnxruntime session as a module: no gradients; the answer lands on the input's device.

    ``zipmap``: the output is a sequence of ``{class: value}`` maps (skl2onnx's ``ZipMap``), returned as a tensor
    whose columns are the keys sorted (:attr:`classes`, learnt from the first answer and checked on every one)."""

    def __init__(self, session: Any, path: str, *, input_name: str, output_name: str, dtype: torch.dtype,
                 flat: bool, batch: int | None, zipmap: bool = False, label_name: str | None = None) -> None:
        super().__init__()
        self.session = session
        self.path = path
        self.input_name = input_name
        self.output_name = output_name
        self.dtype = dtype
        self.flat = flat
        self.batch = batch  # a fixed batch size baked into the graph, else None
        self.zipmap = zipmap
        self.label_name = label_name  # the graph's label output (checked against a ZipMap at load), if any
        self.classes: list[Any] | None = None  # a ZipMap's keys, in column order

    def __deepcopy__(self, memo: dict[int, Any]) -> OnnxRunner:
        """A copy sharing the (read-only, thread-safe) session, which cannot be pickled."""
        copy = OnnxRunner(self.session, self.path, input_name=self.input_name, output_name=self.output_name,
                          dtype=self.dtype, flat=self.flat, batch=self.batch, zipmap=self.zipmap,
                          label_name=self.label_name)
        copy.classes = None if self.classes is None else list(self.classes)
        return copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise InputError(f"{self.path} is an ONNX victim: onnxruntime gives no gradients, so it cannot explain "
                             "or be a white-box substitute; use a TorchScript or stealkit model for that")
        (out,) = self.run([self.output_name], x)
        return out.to(x.device)

    def run(self, names: list[str], x: torch.Tensor) -> list[Any]:
        """The outputs ``names`` for ``x``, in chunks of the graph's fixed batch size (if any): the main output
        as a tensor, any other as onnxruntime gives it (a numpy array)."""
        import numpy as np

        arr = x.detach().to("cpu", self.dtype)
        if self.flat:
            arr = arr.reshape(arr.shape[0], -1)
        n = arr.shape[0]
        step = self.batch or max(1, n)
        parts: list[list[Any]] = [[] for _ in names]
        for i in range(0, n, step):
            chunk = arr[i : i + step]
            if self.batch and chunk.shape[0] < self.batch:  # pad a fixed-batch graph's last chunk
                pad = torch.zeros(self.batch - chunk.shape[0], *chunk.shape[1:], dtype=chunk.dtype)
                chunk = torch.cat([chunk, pad])
            try:
                outs = self.session.run(names, {self.input_name: chunk.contiguous().numpy()})
            except Exception as exc:  # onnxruntime raises its own (non-torch) exception types
                raise InputError(f"{self.path}: onnxruntime failed on a batch of shape {list(chunk.shape)}: "
                                 f"{str(exc).splitlines()[0]}") from None
            for j, (name, out) in enumerate(zip(names, outs, strict=True)):
                if name == self.output_name:
                    out = self._from_zipmap(out) if self.zipmap else torch.from_numpy(out)
                elif isinstance(out, np.ndarray) and out.ndim > 1 and out.size == chunk.shape[0]:
                    out = out.reshape(-1)  # a label output shaped [1, N] (or [N, 1])
                parts[j].append(out[: min(step, n - i)])
        return [torch.cat(p) if isinstance(p[0], torch.Tensor) else np.concatenate(p) for p in parts]

    def _from_zipmap(self, rows: Any) -> torch.Tensor:
        """A ZipMap's ``[{class: value}, ...]`` as a tensor ``[N, K]``, columns in :attr:`classes` order."""
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and r for r in rows):
            raise InputError(f"{self.path}: its output {self.output_name!r} is not a list of {{class: probability}} "
                             f"maps; {ZIPMAP_FIX}")
        if self.classes is None:
            try:
                self.classes = sorted(rows[0])
            except TypeError:
                raise InputError(f"{self.path}: its ZipMap's class keys cannot be ordered ({list(rows[0])[:5]}); "
                                 f"{ZIPMAP_FIX}") from None
        keys = self.classes
        if any(len(r) != len(keys) for r in rows) or any(set(r) != set(keys) for r in rows):
            raise InputError(f"{self.path}: its ZipMap's maps do not all have the classes {keys[:10]}; {ZIPMAP_FIX}")
        return torch.tensor([[float(r[k]) for k in keys] for r in rows], dtype=torch.float32)


def _resolve_meta(path: Path, fmt: str, file_meta: dict[str, Any], flags: dict[str, str], *,
                  graph_shape: tuple[int, int, int] | None = None, flat_size: int | None = None) -> ForeignMeta:
    """Merge what the file says and what the flags say (flags win); the input shape must be known."""
    stored = parse_options({k: v for k, v in file_meta.items() if k in KEYS}, where=f"{path} (metadata)")
    given = parse_options(flags, where="--" + "/--".join(k.replace("_", "-") for k in flags) if flags else "")
    merged = {**stored, **given}
    shape = merged.get("input_shape", graph_shape)
    if shape is None and flat_size is not None:
        shape = (flat_size,)
        log.info("%s: the graph takes flat vectors of %d values and nothing gives an image shape: read as a vector "
                 "of %d features (pass --input-shape C,H,W if they are pixels)", path, flat_size, flat_size)
    if shape is None:
        raise InputError(
            f"{path}: its input shape is unknown: neither the file's metadata (input_shape) nor a flag says; "
            "pass --input-shape C,H,W (e.g. 1,28,28; D for a vector of D features), or append "
            "?input_shape=C,H,W to the file name"
        )
    if graph_shape is not None and tuple(shape) != graph_shape:
        raise InputError(f"{path}: the graph takes images of shape {list(graph_shape)} but input_shape says "
                         f"{list(shape)}; fix the metadata or --input-shape")
    size = 1
    for s in shape:
        size *= int(s)
    if flat_size is not None and size != flat_size:
        raise InputError(f"{path}: the graph takes flat vectors of {flat_size} values but input_shape {list(shape)} "
                         f"has {size}; fix --input-shape")
    assumed = tuple(k for k in ("value_range", "normalize") if k not in merged) if len(shape) == 3 else ()
    if assumed:
        log.warning("%s: neither its metadata nor a flag gives %s; assuming pixels in [0, 1] and no normalisation "
                    "outside the model (pass --value-range / --normalize if it expects otherwise)",
                    path, " or ".join(assumed))
    norm = merged.get("normalize")
    extra = {k: v for k, v in merged.items() if k in ("dataset", "split_seed", "feature_ranges")}
    source = "flag" if "output" in given else "metadata" if "output" in stored else "probe"
    return ForeignMeta(
        path=str(path), format=fmt, input_shape=tuple(shape),  # type: ignore[arg-type]
        num_classes=int(merged.get("num_classes", 0)), value_range=merged.get("value_range", (0.0, 1.0)),
        mean=norm[0] if norm else None, std=norm[1] if norm else None, output=merged.get("output", "logits"),
        output_source=source, class_names=list(merged.get("class_names", [])), extra=extra, assumed=assumed,
    )


def looks_like_probs(out: torch.Tensor) -> bool:
    """Whether every row of ``out`` ``[B, K]`` is a probability vector: no negative value (nor NaN) and a sum of
    1 within :data:`PROBE_TOLERANCE` (looser for a half-precision output)."""
    half = out.dtype in (torch.float16, torch.bfloat16)
    tol = _PROBE_TOLERANCE_HALF if half else PROBE_TOLERANCE
    z = out.detach().to("cpu", torch.float64)
    return bool(z.numel() and torch.isfinite(z).all() and (z >= 0).all()
                and ((z.sum(dim=1) - 1.0).abs() <= tol).all())


def probe_inputs(input_shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """The fixed probe batch: :data:`PROBE_ROWS` uniform images in [0, 1] (stealkit's pixels), seeded."""
    gen = torch.Generator().manual_seed(PROBE_SEED)
    return torch.rand(PROBE_ROWS, *input_shape, generator=gen).to(device)


def _decide_output(meta: ForeignMeta, raw: torch.Tensor) -> str:
    """``logits`` or ``probs``: what the metadata or flag declared (checked against the probe rows ``raw``), or,
    when neither did, what the probe rows are; one line is logged either way."""
    probs = looks_like_probs(raw)
    n = raw.shape[0]
    if meta.output_source == "probe":
        if probs:
            log.warning("%s: output read as probabilities (probed: its metadata does not say, and its %d probe rows "
                        "are all >= 0 and sum to 1); stealkit takes their log as logits. Pass --output logits to "
                        "override", meta.path, n)
            return "probs"
        log.info("%s: output read as logits (probed: its metadata does not say, and its %d probe rows are not "
                 "probabilities); pass --output probs to override", meta.path, n)
        return "logits"
    said = "--output" if meta.output_source == "flag" else "its metadata"
    if meta.output == "logits" and probs:
        log.warning("%s: output read as logits because %s says so, but its %d probe rows are all >= 0 and sum to 1 "
                    "(probabilities): its probs and top-k answers will be a softmax of probabilities, not the "
                    "model's; pass --output probs unless it really returns logits", meta.path, said, n)
    elif meta.output == "probs" and not probs:
        if bool((raw < 0).any()):
            raise InputError(f"{meta.path}: {said} says output=probs, but the model returns negative values (not "
                             "probabilities); pass --output logits")
        log.warning("%s: output read as probabilities because %s says so, but its %d probe rows do not all sum "
                    "to 1", meta.path, said, n)
    else:
        log.debug("%s: output read as %s (%s)", meta.path, "probabilities" if meta.output == "probs" else "logits",
                 said)
    return meta.output


def _finish(body: nn.Module, meta: ForeignMeta, num_classes: int | None, device: torch.device) -> ForeignClassifier:
    """Wrap, run the probe batch (outside any ledger) to learn/check the class count and decide what the output
    is (:func:`_decide_output`), and return the module in eval mode."""
    model = ForeignClassifier(body, meta).to(device).eval()
    try:
        with torch.inference_mode():
            raw = model.raw(probe_inputs(meta.input_shape, device))
    except InputError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise InputError(f"{meta.path}: the model failed on a batch of shape [{PROBE_ROWS}, "
                         f"{', '.join(map(str, meta.input_shape))}]: {str(exc).strip().splitlines()[-1][:300]}; "
                         "check --input-shape") from None
    k = int(raw.shape[1])
    for claimed, who in ((meta.num_classes, "num_classes"), (num_classes, "the graph's output")):
        if claimed and claimed != k:
            raise InputError(f"{meta.path}: {who} says {claimed} classes but the model returns {k}; "
                             "fix the metadata or --num-classes")
    if k < 2:
        raise InputError(f"{meta.path}: the model returns {k} value(s) per image; a classifier needs >= 2 classes")
    model.meta = replace(meta, output=_decide_output(meta, raw)).with_classes(k)
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
                         "expects one input: images [batch, C, H, W] or feature vectors [batch, d]")
    inp = inputs[0]
    if inp.type not in _ONNX_DTYPES or len(inp.shape) not in (2, 4):
        raise InputError(f"{p}: its input {inp.name!r} is {inp.type} of shape {inp.shape}; stealkit expects floats: "
                         "images [batch, C, H, W], or flat [batch, d] (feature vectors, or pixels with --input-shape)")
    file_meta = dict(session.get_modelmeta().custom_metadata_map)
    outputs = session.get_outputs()
    wanted = file_meta.get("output_name")
    outs = [o for o in outputs if o.name == wanted] if wanted else [
        o for o in outputs if o.type in _ONNX_DTYPES and len(o.shape) == 2] or [
        o for o in outputs if _is_zipmap(o.type)]
    if not outs or not (_is_zipmap(outs[0].type) or outs[0].type in _ONNX_DTYPES):
        raise InputError(f"{p}: no output is a float tensor [batch, classes] "
                         f"(outputs: {', '.join(f'{o.name} {o.type} {o.shape}' for o in outputs)})")
    out = outs[0]
    zipmap = _is_zipmap(out.type)
    labels = [o for o in outputs if o.type in ("tensor(int64)", "tensor(string)") and len(o.shape) == 1]
    dims = [_static(d) for d in inp.shape]
    graph_shape = tuple(dims[1:]) if len(dims) == 4 and all(dims[1:]) else None
    flat_size = dims[1] if len(dims) == 2 else None
    meta = _resolve_meta(p, "onnx", file_meta, flags or {}, graph_shape=graph_shape,  # type: ignore[arg-type]
                         flat_size=flat_size)
    runner = OnnxRunner(session, str(p), input_name=inp.name, output_name=out.name,
                        dtype=_ONNX_DTYPES[inp.type], flat=len(dims) == 2, batch=dims[0], zipmap=zipmap,
                        label_name=labels[0].name if zipmap and labels else None)
    if len(outputs) > 1:
        log.info("%s: answers are read from its output %r (%s; outputs: %s)", p, out.name,
                 "a ZipMap of {class: probability}" if zipmap else "a float tensor [batch, classes]",
                 ", ".join(o.name for o in outputs))
    model = _finish(runner, meta, None if zipmap else _static(out.shape[1]), dev)
    if zipmap:
        _check_zipmap(runner, model.meta, dev)
        if not meta.class_names:  # the map's keys are the class names (scikit-learn's classes_)
            model.meta = replace(model.meta, class_names=[str(k) for k in runner.classes or []])
    return model, model.meta


def _is_zipmap(onnx_type: str) -> bool:
    """skl2onnx's ZipMap output: ``seq(map(int64,tensor(float)))`` or ``seq(map(string,tensor(float)))``."""
    return onnx_type.replace(" ", "").startswith("seq(map(") and "tensor(float" in onnx_type


def _check_zipmap(runner: OnnxRunner, meta: ForeignMeta, device: torch.device) -> None:
    """A ZipMap's column order (the keys sorted) must agree with the graph's label output, where it has one:
    on every probe row with one clear top class, the label must be that class's key."""
    if runner.label_name is None:
        log.info("%s: ZipMap output read with classes in key order %s (no label output to check it against)",
                 meta.path, (runner.classes or [])[:10])
        return
    model = ForeignClassifier(runner, meta).to(device).eval()
    with torch.inference_mode():
        z = model.prepare(probe_inputs(meta.input_shape, device))
        values, labels = runner.run([runner.output_name, runner.label_name], z)
    keys = runner.classes or []
    if len(labels) != values.shape[0]:
        raise InputError(f"{meta.path}: this ONNX model returns a ZipMap (a list of {{class: probability}} maps) and "
                         f"a label output {runner.label_name!r} of {len(labels)} values for {values.shape[0]} images, "
                         f"so its class order cannot be checked; {ZIPMAP_FIX}")
    top2 = values.topk(2, dim=1)
    for row, (vals, idx) in enumerate(zip(top2.values.tolist(), top2.indices.tolist(), strict=True)):
        if vals[0] - vals[1] > 1e-6 and str(keys[idx[0]]) != str(labels[row]):
            raise InputError(f"{meta.path}: this ONNX model returns a ZipMap (a list of {{class: probability}} "
                             f"maps) whose top class ({keys[idx[0]]!r}) disagrees with its label output "
                             f"({labels[row]!r}), so its class order is unclear; {ZIPMAP_FIX}")


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
