"""What a decision-based attack starts from besides the victim: a stolen substitute's directory, or the
attacker's natural images (``--start-pool``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.oracle.victim import Victim, victim_splits


def load_start_pool(source: str, v: Victim, data_dir: str | None) -> torch.Tensor:
    """``--start-pool``: the attacker split of the victim's data set (``pool``) or images from a ``.npy`` /
    ``.safetensors`` file (no pickle); shape and range are checked by the attack (one-line errors)."""
    if source == "pool":
        return victim_splits(v, data_dir).attacker_pool.x
    path = Path(source)
    if not path.is_file():
        raise InputError(f"--start-pool {source}: expected 'pool' or a .npy / .safetensors file of images")
    if path.suffix == ".npy":
        import numpy as np

        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise InputError(f"--start-pool {source}: not a plain numeric .npy array ({e})") from None
        if arr.dtype.kind not in "fiub":
            raise InputError(f"--start-pool {source}: expected a numeric array, got dtype {arr.dtype}")
        return torch.from_numpy(arr.astype("float32"))
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except (SafetensorError, ValueError, OSError) as e:
            raise InputError(f"--start-pool {source}: not a readable safetensors file ({e})") from None
        if len(tensors) != 1 and "x" not in tensors:
            raise InputError(f"--start-pool {source}: expected one tensor or one named 'x', got {sorted(tensors)}")
        return (tensors["x"] if "x" in tensors else next(iter(tensors.values()))).float()
    raise InputError(f"--start-pool {source}: expected 'pool' or a .npy / .safetensors file, got {path.suffix!r}")


def load_model_substitute(path: str, v: Victim, device: str) -> nn.Module:
    """The substitute model at ``path``: a model directory, or an extraction run directory's ``student/``."""
    from stealkit.models import load_model
    from stealkit.models.io import SPEC_NAME

    p = Path(path)
    if not (p / SPEC_NAME).exists() and (p / "student" / SPEC_NAME).exists():
        p = p / "student"
    if not (p / SPEC_NAME).exists():
        raise InputError(f"--substitute {path}: expected a model directory (holding {SPEC_NAME}) or an extraction "
                         "run directory holding student/")
    model, spec = load_model(p, device=device)
    if tuple(spec.input_shape) != tuple(v.oracle.input_shape):
        raise InputError(f"--substitute {path} takes images of shape {list(spec.input_shape)}; the victim takes "
                         f"{list(v.oracle.input_shape)}")
    return model
