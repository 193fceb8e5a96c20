"""Pretrained weights of the student: computed once, saved, reused on resume, loaded into every student.

The weights of :mod:`stealkit.extract.surrogate_data.pretrain`'s self-supervised pretraining (rotation prediction,
:mod:`stealkit.extract.surrogate_data.rotation_pretrain`; SimCLR, :mod:`stealkit.extract.surrogate_data.simclr_pretrain`) are saved as
safetensors + JSON (the method, settings, seed and a fingerprint of the pool; JSON written last) and, when asked
to reuse them, loaded instead of recomputed -- refused if they were made with other settings or another pool, so
a resumed run never continues from weights computed differently.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import last_linear
from stealkit.extract.surrogate_data.pretrain import PRETRAINS, Pretrain, PretrainConfig
from stealkit.extract.surrogate_data.rotation_pretrain import pretrain_rotation
from stealkit.extract.surrogate_data.simclr_pretrain import pretrain_simclr
from stealkit.fsutil import atomic_path, atomic_write_json

log = logging.getLogger(__name__)

PRETRAIN_FORMAT = "stealkit-pretrain/1"


def pool_fingerprint(pool: torch.Tensor) -> list[float]:
    """A cheap fingerprint of the pool (size and two pixel sums): weights are reused only for the same pool."""
    flat = pool.double().flatten(1)
    weights = torch.arange(1, flat.shape[0] + 1, dtype=torch.float64)
    return [float(pool.shape[0]), round(float(flat.sum()), 3), round(float((flat.sum(1) * weights).sum()), 1)]


def run_pretraining(method: Pretrain, student: nn.Module, pool: torch.Tensor, config: PretrainConfig, *,
                    seed: int, flip: bool, device: str | torch.device) -> dict[str, Any]:
    """Train ``student`` in place with ``method``'s self-supervised loss on ``pool``; returns its record."""
    if method == "rotation":
        return pretrain_rotation(student, pool, config, seed=seed, device=device)
    if method == "simclr":
        return pretrain_simclr(student, pool, config, seed=seed, flip=flip, device=device)
    raise InputError(f"unknown pretraining {method!r}; expected one of {', '.join(PRETRAINS)}")


def pretrained_weights(path: Path | None, method: Pretrain, make_student: Callable[[], nn.Module],
                       pool: torch.Tensor, config: PretrainConfig, *, seed: int, reuse: bool, flip: bool = False,
                       device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The student's pretrained ``state_dict`` and the pretraining record.

    With ``reuse`` and weights already at ``path`` (``NAME.safetensors`` + ``NAME.json``) they are loaded, after
    checking they were made with the same method, settings, seed and pool; otherwise they are computed and
    saved there (``path=None``: computed, not saved).
    """
    from safetensors.torch import load_file, save_file

    settings = {"format": PRETRAIN_FORMAT, "method": method, "settings": config.identity(method), "seed": seed,
                "flip": flip if method == "simclr" else None, "pool": pool_fingerprint(pool)}
    meta_path = path.with_suffix(".json") if path is not None else None
    if reuse and path is not None and meta_path is not None and meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if {k: meta.get(k) for k in settings} != settings:
            raise InputError(f"{path} holds pretrained weights made with other settings or another pool "
                             f"({ {k: meta.get(k) for k in settings} }), not {settings}: resume with the same "
                             "--pretrain, --pool, --seed and --set pretraining.* values")
        log.info("%s pretraining: reusing %s", method, path)
        return load_file(str(path)), {**meta["record"], "reused": True}
    student = make_student()
    record = run_pretraining(method, student, pool, config, seed=seed, flip=flip, device=device)
    state = {k: v.detach().cpu().contiguous() for k, v in student.state_dict().items()}
    log.info("%s pretraining: %s", method, record)
    if path is None or meta_path is None:
        return state, record
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))
    atomic_write_json(meta_path, {**settings, "record": record})
    return state, record


def from_pretrained(make_student: Callable[[], nn.Module], state: dict[str, torch.Tensor],
                    freeze: bool = False) -> Callable[[], nn.Module]:
    """A student factory whose students start from ``state``; with ``freeze`` only the last linear layer
    trains (the rest has ``requires_grad=False``)."""

    def make() -> nn.Module:
        student = make_student()
        student.load_state_dict(state)
        if freeze:
            train_only_head(student, True)
        return student

    return make


def train_only_head(student: nn.Module, only: bool) -> None:
    """Let only the last linear layer train (``only``), or every layer again."""
    head = {id(p) for p in last_linear(student).parameters()}
    for p in student.parameters():
        p.requires_grad_(not only or id(p) in head)
