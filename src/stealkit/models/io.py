"""Save and load zoo models as ``model.safetensors`` (weights) + ``model.json`` (a :class:`ModelSpec`).

Nothing here ever unpickles. Pickle-based files (``torch.save`` checkpoints, ``.pkl``) can run arbitrary code
when loaded, so they are refused by name (``.pt``, ``.pth``, ``.pkl``, ``.pickle``, ``.ckpt``, ``.bin``) and by
content (a pickle protocol byte ``0x80`` or the zip signature ``PK\\x03\\x04`` of torch's format).
Both files are written atomically (temporary file, then rename), so a crash never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file
from torch import nn

from stealkit import __version__
from stealkit.errors import InputError, UnsafeFileError
from stealkit.fsutil import atomic_path, atomic_write_json, default_file_mode
from stealkit.models.layers import Classifier
from stealkit.models.spec import ModelSpec
from stealkit.models.zoo import build_model

__all__ = [
    "PICKLE_SUFFIXES", "SPEC_NAME", "WEIGHTS_NAME", "build_from_spec", "load_model", "save_model", "write_weights"
]

WEIGHTS_NAME = "model.safetensors"
SPEC_NAME = "model.json"
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin"})
_ZIP_MAGIC = b"PK\x03\x04"
_HOW_TO_CONVERT = (
    "Pickle-based files (torch.save checkpoints, .pkl) can run arbitrary code when loaded, so stealkit never "
    "unpickles. To convert a file you trust: in a trusted session, load it yourself (e.g. "
    "model.load_state_dict(torch.load(path, weights_only=True))) and call "
    "stealkit.models.save_model(model, spec, out_dir), which writes model.safetensors + model.json."
)


def build_from_spec(spec: ModelSpec) -> Classifier:
    """Build the (freshly initialised) model a :class:`ModelSpec` describes."""
    if not isinstance(spec, ModelSpec):
        raise InputError(f"build_from_spec needs a ModelSpec, got {type(spec).__name__}")
    return build_model(spec.arch, **spec.build_args())


def _refuse(path: Path, why: str) -> UnsafeFileError:
    return UnsafeFileError(f"refusing to load {path}: {why}. {_HOW_TO_CONVERT}")


def _check_suffix(path: Path) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise _refuse(path, f"'{path.suffix}' files are pickles")


def _is_safetensors(data: bytes) -> bool:
    """Structural check: 8-byte little-endian header length, then a JSON object that fits in the file."""
    if len(data) < 10:
        return False
    n = int.from_bytes(data[:8], "little")
    return data[8:9] == b"{" and 8 + n <= len(data)


def _sniff(path: Path, data: bytes, *, safetensors: bool) -> None:
    """Refuse pickles and zip (torch.save) archives by their first bytes, whatever the file is called.

    A safetensors file starts with its header length, whose low byte can be 0x80; such a file passes only if
    the rest of it has the safetensors layout (and it is then parsed by safetensors, never unpickled).
    """
    if data.startswith(_ZIP_MAGIC):
        raise _refuse(path, "it is a zip archive (torch.save's format), which holds a pickle")
    if data[:1] == b"\x80" and not (safetensors and _is_safetensors(data)):
        raise _refuse(path, "its content is a pickle (it starts with the pickle protocol byte 0x80)")


def _read(path: Path, what: str, *, safetensors: bool) -> bytes:
    _check_suffix(path)
    if not path.is_file():
        raise InputError(
            f"{what} {path} does not exist; a saved model is a directory holding {SPEC_NAME} and {WEIGHTS_NAME} "
            "(written by stealkit.models.save_model)"
        )
    data = path.read_bytes()
    _sniff(path, data, safetensors=safetensors)
    return data


def _resolve(path: str | os.PathLike[str]) -> tuple[Path | None, Path]:
    """(spec path, weights path) for a model directory, its ``.json`` or its ``.safetensors`` (spec path
    ``None``: a lone ``.safetensors`` whose header holds the spec)."""
    p = Path(path)
    _check_suffix(p)
    if p.is_dir():
        spec, weights = p / SPEC_NAME, p / WEIGHTS_NAME
        if not spec.exists():
            pickles = sorted(q.name for q in p.iterdir() if q.suffix.lower() in PICKLE_SUFFIXES)
            if pickles:
                raise _refuse(p, f"it holds no {SPEC_NAME}, only pickle files ({', '.join(pickles[:5])})")
        return spec, weights
    if p.suffix == ".json":
        weights = p.with_suffix(".safetensors")
        return p, weights if weights.exists() else p.parent / WEIGHTS_NAME
    if p.suffix == ".safetensors":
        spec = p.with_suffix(".json")
        if spec.exists() or p.name == WEIGHTS_NAME:
            return (spec if spec.exists() else p.parent / SPEC_NAME), p
        return None, p  # a single file (``stealkit export``): the spec is in its header
    if not p.exists():
        raise InputError(
            f"model path {p} does not exist; pass the directory written by stealkit.models.save_model "
            f"(holding {SPEC_NAME} and {WEIGHTS_NAME}) or one of those two files"
        )
    if p.is_file():
        with open(p, "rb") as fh:
            _sniff(p, fh.read(16), safetensors=False)
    raise InputError(
        f"cannot load {p}: expected a model directory, a .json spec or a .safetensors file "
        "(as written by stealkit.models.save_model)"
    )


def _describe(spec: ModelSpec) -> str:
    return (
        f"arch={spec.arch}, input_shape={list(spec.input_shape)}, num_classes={spec.num_classes}, "
        f"kwargs={spec.kwargs}"
    )


def _check_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], spec: ModelSpec, source: str
) -> None:
    """Raise ``InputError`` unless ``state`` has exactly ``expected``'s keys and shapes."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k} {list(state[k].shape)} (spec needs {list(expected[k].shape)})"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
        if items:
            more = f" and {len(items) - 5} more" if len(items) > 5 else ""
            problems.append(f"{label}: {', '.join(items[:5])}{more}")
    if problems:
        raise InputError(
            f"the weights in {source} don't match the spec ({_describe(spec)}): {'; '.join(problems)}. "
            "Were they saved from a different architecture or options? Save a model together with its spec "
            "using stealkit.models.save_model."
        )


def _check_normalization(state: Mapping[str, torch.Tensor], spec: ModelSpec, source: str) -> None:
    for name in ("mean", "std"):
        want = torch.tensor(getattr(spec, name), dtype=torch.float32)
        got = state[f"normalize.{name}"].detach().to("cpu", torch.float32).flatten()
        if not torch.equal(got, want):
            raise InputError(
                f"the normalisation {name} in {source} is {got.tolist()} but the spec says {want.tolist()}; "
                "make the spec's mean/std match the model (ModelSpec.from_model does this)"
            )


def _meta_model(spec: ModelSpec) -> Classifier:
    """The spec's model with shapes only (no memory, no initialisation, no use of the random generator)."""
    with torch.device("meta"):
        return build_from_spec(spec)


def save_model(model: nn.Module, spec: ModelSpec, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``out_dir/model.safetensors`` and ``out_dir/model.json``, each atomically; return ``out_dir``.

    The model's state_dict must match what ``spec`` builds (same keys and shapes, same mean/std), so the
    pair can always be loaded back with :func:`load_model`.
    """
    if not isinstance(spec, ModelSpec):
        raise InputError(
            f"save_model needs a ModelSpec, got {type(spec).__name__}; ModelSpec.from_model(model) makes one"
        )
    if not isinstance(model, nn.Module):
        raise InputError(f"save_model needs a torch.nn.Module, got {type(model).__name__}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"cannot save the model into {out}: it exists and is not a directory; choose a directory"
        )
    tensors = _checked_tensors(model, spec)
    with atomic_path(out / WEIGHTS_NAME) as tmp:
        _write_tensors(tensors, spec, tmp)
    atomic_write_json(out / SPEC_NAME, spec.to_dict())
    return out


def _checked_tensors(model: nn.Module, spec: ModelSpec) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    _check_state(state, _meta_model(spec).state_dict(), spec, "the model being saved")
    _check_normalization(state, spec, "the model being saved")
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def _write_tensors(tensors: dict[str, torch.Tensor], spec: ModelSpec, path: str | os.PathLike[str]) -> None:
    metadata = {"format": "pt", "stealkit_version": __version__, "stealkit_spec": spec.to_json()}
    save_file(tensors, str(path), metadata=metadata)
    # safetensors creates the file anew (0600): give it the mode of any file the user writes (the umask
    # applies), as docs/architecture.md says of every file stealkit writes
    os.chmod(path, default_file_mode())
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def write_weights(model: nn.Module, spec: ModelSpec, path: str | os.PathLike[str]) -> None:
    """Write the model's weights to ``path`` as safetensors, the spec in the header (not atomic: callers
    write to a temporary path). Such a file loads alone with :func:`load_model`."""
    _write_tensors(_checked_tensors(model, spec), spec, path)


def _header_spec(data: bytes) -> dict | None:
    """The spec stored in a safetensors header's metadata by :func:`save_model`, if any."""
    try:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        text = (header.get("__metadata__") or {}).get("stealkit_spec")
        return json.loads(text) if isinstance(text, str) else None
    except (ValueError, AttributeError):
        return None


def load_model(
    path: str | os.PathLike[str], *, device: str | torch.device = "cpu"
) -> tuple[Classifier, ModelSpec]:
    """Load a model saved by :func:`save_model`; ``path`` is its directory, ``.json`` or ``.safetensors``.

    Rebuilds the architecture from the spec, loads the weights strictly and returns ``(model, spec)`` with the
    model in eval mode on ``device``. Never unpickles: pickle/zip files raise :class:`UnsafeFileError`.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"unknown device {device!r}: {exc}; use e.g. 'cpu' or 'cuda'") from exc
    spec_path, weights_path = _resolve(path)
    data = _read(weights_path, "model weights", safetensors=True) if spec_path is None else b""
    if spec_path is None:
        if _header_spec(data) is None:
            raise InputError(f"{weights_path} has no {weights_path.with_suffix('.json').name} beside it and no "
                             "stealkit spec in its header; pass the model directory or the spec")
        spec_path, spec_bytes = weights_path, json.dumps(_header_spec(data)).encode()
    else:
        spec_bytes = _read(spec_path, "model spec", safetensors=False)
    try:
        spec = ModelSpec.from_json(spec_bytes)
    except InputError as exc:
        raise InputError(f"{spec_path}: {exc}") from exc
    data = data or _read(weights_path, "model weights", safetensors=True)
    try:
        tensors = safetensors_load(data)
    except (SafetensorError, ValueError, OSError) as exc:
        raise InputError(
            f"{weights_path} is not a readable safetensors file ({exc}); re-save the model"
        ) from exc
    stored = _header_spec(data)
    if stored is not None:
        for key in ("arch", "input_shape", "num_classes", "kwargs"):
            if stored.get(key) != spec.to_dict()[key]:
                raise InputError(
                    f"{spec_path} and {weights_path} come from different saves ({key}: {spec.to_dict()[key]!r} in "
                    f"the spec, {stored.get(key)!r} with the weights); save them again together with save_model"
                )
    try:
        model = _meta_model(spec)
    except InputError as exc:
        raise InputError(f"{spec_path}: {exc}") from exc
    expected = model.state_dict()
    _check_state(tensors, expected, spec, str(weights_path))
    _check_normalization(tensors, spec, str(weights_path))
    tensors = {k: v.to(expected[k].dtype) for k, v in tensors.items()}
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.to(dev).eval(), spec
