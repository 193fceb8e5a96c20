"""Find the model a user points at: a model directory, an extraction run directory (its ``student/``), or a
TorchScript/ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.models.foreign_meta import foreign_format, split_victim
from stealkit.models.io import SPEC_NAME, WEIGHTS_NAME

__all__ = ["STUDENT_DIR", "has_gradients", "load_any_model", "load_substitute", "locate_model_dir"]

#: where ``stealkit extract`` saves the stolen model inside its run directory
STUDENT_DIR = "student"


def locate_model_dir(path: str | Path, *, what: str = "model") -> Path:
    """``path`` if it is a model directory, ``path/student`` if it is an extraction run directory."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {p} does not exist; expected a model directory ({SPEC_NAME} + {WEIGHTS_NAME}) "
                         f"or an extraction run directory (holding {STUDENT_DIR}/)")
    if p.is_dir():
        if (p / SPEC_NAME).exists() or (p / WEIGHTS_NAME).exists():
            return p
        if (p / STUDENT_DIR / SPEC_NAME).exists():
            return p / STUDENT_DIR
        run = " (a run directory without a student/: only `stealkit extract` runs save one)" if (
            p / "config.json").exists() else ""
        raise InputError(f"{what} {p} is neither a model directory (holding {SPEC_NAME} and {WEIGHTS_NAME}) nor an "
                         f"extraction run directory (holding {STUDENT_DIR}/{SPEC_NAME}){run}")
    return p


def load_any_model(path: str | Path, *, device: str | torch.device = "cpu",
                   what: str = "model") -> tuple[nn.Module, Any]:
    """``(model, spec)`` for a model directory, an extraction run directory (its ``student/``), or an ONNX or
    TorchScript file (optionally ``FILE?input_shape=...``, see :mod:`stealkit.models.foreign_meta`).

    ``spec`` is a :class:`~stealkit.models.ModelSpec` or a :class:`~stealkit.models.foreign_meta.ForeignMeta`;
    both have ``input_shape``, ``num_classes``, ``class_names``, ``extra``, ``arch`` and ``metrics``.
    """
    file = split_victim(str(path))[0]
    if foreign_format(file) is not None:
        from stealkit.models.foreign import load_foreign

        return load_foreign(str(path), device=device)
    from stealkit.models.io import load_model

    return load_model(locate_model_dir(file, what=what), device=device)


def has_gradients(spec: Any) -> bool:
    """Whether a model loaded by :func:`load_any_model` gives input gradients (ONNX, run by onnxruntime, does not)."""
    return getattr(spec, "format", None) != "onnx"


def load_substitute(path: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """A white-box model to craft on: a model or extraction run directory, or a TorchScript file.

    ONNX files are refused: onnxruntime gives no gradients, which gradient-based transfer attacks need.
    """
    if foreign_format(split_victim(str(path))[0]) == "onnx":
        raise InputError(f"substitute {path} is ONNX: onnxruntime gives no gradients, which transfer attacks need; "
                         "pass a model directory, an extraction run directory or a TorchScript (.pt) file")
    return load_any_model(path, device=device, what="substitute")[0]
