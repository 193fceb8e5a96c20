"""Self-supervised pretraining of the student on the unlabelled pool: rotation prediction (RotNet).

Gidaris, Singh & Komodakis, *Unsupervised Representation Learning by Predicting Image Rotations*, ICLR 2018,
Section 2 (2.1-2.2): a network learns features by predicting which of the four rotations ``{0, 90, 180,
270}`` degrees was applied to an image; every image of the batch is shown in all four rotations (Sec. 2.2,
"feeding all four rotated copies simultaneously") and the loss is the cross entropy of the 4-way prediction
(eq. 1-3). Jagielski et al. (*High Accuracy and High Fidelity Extraction of Neural Networks*, USENIX Security
2020, Section 5.2) use this rotation loss on the attacker's unqueried pool for extraction.

Here it runs **before any query**: the student (the extraction's own architecture, seeded as usual) gets a
4-way rotation head on its penultimate features (the input of its last ``nn.Linear``) and is trained on the
whole pool for ``epochs`` epochs (SGD, one-cycle, as the attack); the head is then dropped and every student
of the attack -- the round substitutes of active selection and the final student -- starts from these weights
(the last linear layer keeps its seeded initialisation: rotation never trains it). No victim query is made.

The weights are saved (safetensors + JSON with the settings and a fingerprint of the pool, JSON written last)
and, when asked to reuse them, loaded instead of recomputed -- refused if they were made with other settings
or another pool, so a resumed run never continues from weights computed differently.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.active import last_linear
from stealkit.fsutil import atomic_path, atomic_write_json
from stealkit.train import TrainConfig, fit

log = logging.getLogger(__name__)

PRETRAIN_FORMAT = "stealkit-rotation-pretrain/1"


@dataclass(frozen=True)
class RotationConfig:
    """RotNet pretraining settings. ``epochs``: passes over the pool (each image in its four rotations), raised
    where needed so that training takes at least ``min_steps`` steps (a small pool, e.g. digits' few hundred
    images, gets more epochs). ``batch_size``: images per step before rotation (4x as many rotated copies).
    ``lr``: maximum SGD learning rate of the one-cycle schedule. ``freeze``: after pretraining train only the
    student's last linear layer on the answers (a linear probe) instead of fine-tuning all of it (not part of
    the pretraining: the same weights serve both)."""

    epochs: int = 5
    batch_size: int = 128
    lr: float = 0.1
    min_steps: int = 300
    freeze: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0 or self.min_steps < 0:
            raise InputError("rotation epochs and batch_size must be >= 1, lr > 0 and min_steps >= 0")

    def epochs_for(self, pool_size: int) -> int:
        """Epochs over a pool of ``pool_size`` images: ``epochs``, or enough for ``min_steps`` steps."""
        return max(self.epochs, math.ceil(self.min_steps / math.ceil(pool_size / self.batch_size)))

    def identity(self) -> dict[str, Any]:
        """What the pretrained weights depend on (``freeze`` is applied after, to the same weights)."""
        return {k: v for k, v in asdict(self).items() if k != "freeze"}


class _RotationNet(nn.Module):
    """The student with a 4-way rotation head on its penultimate features (the last linear layer's input)."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__()
        linear = last_linear(student)
        self.student, self.head = student, nn.Linear(linear.in_features, 4)
        self._feats: list[torch.Tensor] = []
        linear.register_forward_hook(lambda _m, inp, _o: self._feats.append(inp[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._feats.clear()
        self.student(x)
        return self.head(self._feats[-1].flatten(1))


def rotations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The four rotations of every image of ``x`` ``[B, C, H, W]`` (square images) and their labels 0..3."""
    if x.shape[-1] != x.shape[-2]:
        raise InputError(f"rotation pretraining needs square images, got {x.shape[-2]}x{x.shape[-1]}")
    views = torch.cat([torch.rot90(x, k, dims=(2, 3)) for k in range(4)])
    labels = torch.arange(4, device=x.device).repeat_interleave(x.shape[0])
    return views, labels


def pretrain_rotation(student: nn.Module, pool: torch.Tensor, config: RotationConfig, *, seed: int = 0,
                      device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train ``student`` in place to predict the rotation of the pool's images (Gidaris et al., Sec. 2);
    returns a record of the pretraining (epochs, seconds, last loss, rotation accuracy on the last epoch)."""
    net = _RotationNet(student).to(device)
    correct = [0, 0]

    def rotation_loss(model: nn.Module, xb: torch.Tensor, _t: torch.Tensor, _g: torch.Generator) -> torch.Tensor:
        views, labels = rotations(xb)
        logits = model(views)
        correct[0] += int((logits.argmax(1) == labels).sum())
        correct[1] += int(labels.numel())
        return F.cross_entropy(logits, labels)

    epochs = config.epochs_for(pool.shape[0])
    tc = TrainConfig(epochs=epochs, batch_size=config.batch_size, optimizer="sgd", lr=config.lr,
                     momentum=0.9, weight_decay=5e-4, schedule="onecycle", seed=seed)

    def epoch_done(epoch: int, _rec: dict[str, float]) -> None:
        if epoch < epochs:  # the last epoch's accuracy is what is reported
            correct[0] = correct[1] = 0

    t0 = time.perf_counter()
    history = fit(net, pool, torch.zeros(pool.shape[0]), tc, batch_loss=rotation_loss, device=device,
                  desc="rotation pretraining", on_epoch=epoch_done)
    return {"method": "rotation", "epochs": epochs, "pool": int(pool.shape[0]),
            "seconds": round(time.perf_counter() - t0, 2), "loss": history[-1]["loss"],
            "rotation_accuracy": round(correct[0] / max(correct[1], 1), 4)}


def pool_fingerprint(pool: torch.Tensor) -> list[float]:
    """A cheap fingerprint of the pool (size and two pixel sums): weights are reused only for the same pool."""
    flat = pool.double().flatten(1)
    weights = torch.arange(1, flat.shape[0] + 1, dtype=torch.float64)
    return [float(pool.shape[0]), round(float(flat.sum()), 3), round(float((flat.sum(1) * weights).sum()), 1)]


def pretrained_weights(path: Path | None, make_student: Callable[[], nn.Module], pool: torch.Tensor,
                       config: RotationConfig, *, seed: int, reuse: bool,
                       device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The student's rotation-pretrained ``state_dict`` and the pretraining record.

    With ``reuse`` and weights already at ``path`` (``NAME.safetensors`` + ``NAME.json``) they are loaded, after
    checking they were made with the same settings, seed and pool; otherwise they are computed and saved there
    (``path=None``: computed, not saved).
    """
    from safetensors.torch import load_file, save_file

    settings = {"format": PRETRAIN_FORMAT, "rotation": config.identity(), "seed": seed,
                "pool": pool_fingerprint(pool)}
    meta_path = path.with_suffix(".json") if path is not None else None
    if reuse and path is not None and meta_path is not None and meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if {k: meta.get(k) for k in settings} != settings:
            raise InputError(f"{path} holds pretrained weights made with other settings or another pool "
                             f"({ {k: meta.get(k) for k in settings} }), not {settings}: resume with the same "
                             "--pool, --seed and --set rotation.* values")
        log.info("rotation pretraining: reusing %s", path)
        return load_file(str(path)), {**meta["record"], "reused": True}
    student = make_student()
    record = pretrain_rotation(student, pool, config, seed=seed, device=device)
    state = {k: v.detach().cpu().contiguous() for k, v in student.state_dict().items()}
    if path is None or meta_path is None:
        return state, record
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))
    atomic_write_json(meta_path, {**settings, "record": record})
    log.info("rotation pretraining: %s", record)
    return state, record


def from_pretrained(make_student: Callable[[], nn.Module], state: dict[str, torch.Tensor],
                    freeze: bool = False) -> Callable[[], nn.Module]:
    """A student factory whose students start from ``state``; with ``freeze`` only the last linear layer
    trains (the rest has ``requires_grad=False``)."""

    def make() -> nn.Module:
        student = make_student()
        student.load_state_dict(state)
        if freeze:
            head = {id(p) for p in last_linear(student).parameters()}
            for p in student.parameters():
                p.requires_grad_(id(p) in head)
        return student

    return make
