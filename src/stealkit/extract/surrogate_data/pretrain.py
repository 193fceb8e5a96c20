"""Self-supervised pretraining of the student on the unlabelled pool, before any query: shared machinery.

Jagielski et al. (*High Accuracy and High Fidelity Extraction of Neural Networks*, USENIX Security 2020,
Section 5.2) show that an extraction attacker with an unlabelled pool gains most at small budgets from what it
learns on that pool without the victim. Here the student (the extraction's own architecture, seeded as usual)
is first trained on the whole pool with a self-supervised task -- rotation prediction
(:mod:`stealkit.extract.surrogate_data.rotation_pretrain`) or SimCLR's contrastive loss (:mod:`stealkit.extract.surrogate_data.simclr_pretrain`)
-- through a small head on its penultimate features (the input of its last ``nn.Linear``); the head is then
dropped and every student of the attack (the round substitutes of active selection and the final student)
starts from these weights; the last linear layer keeps its seeded initialisation. No victim query is made.

This module holds the settings, the head and the training loop the pretext tasks share; saving, reusing and
loading the weights into the attack's students is :mod:`stealkit.extract.surrogate_data.pretrained_weights`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import last_linear
from stealkit.train import BatchLoss, TrainConfig, fit

Pretrain = Literal["none", "rotation", "simclr"]
PRETRAINS = ("none", "rotation", "simclr")


@dataclass(frozen=True)
class PretrainConfig:
    """Pretraining settings. ``epochs``: passes over the pool, raised where needed so that training takes at
    least ``min_steps`` steps (a small pool, e.g. digits' few hundred images, gets more epochs). ``batch_size``:
    pool images per step (rotation shows each in 4 rotations, SimCLR in 2 views). ``lr``: maximum SGD learning
    rate of the one-cycle schedule. ``temperature``: SimCLR's NT-Xent temperature. ``freeze``: after
    pretraining train only the student's last linear layer on the answers (a linear probe) instead of
    fine-tuning all of it (applied after pretraining: the same weights serve both). ``finetune_lr``: the peak
    learning rate of every student that starts from the pretrained weights (the round substitutes and the final
    student), in place of the attack's ``lr`` (``None``: the attack's); 0.05, chosen on the validation split
    (docs/surrogate-active.md, fifth pass): at the attack's 0.1 a 30-step fine-tune (digits, 50 answers)
    diverged on one seed; pretrained features want a gentler fine-tune than a fresh student (Kumar et al.,
    *Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution*, ICLR 2022).
    ``probe_epochs``: their LP-FT: the first ``probe_epochs`` of the student's epochs train only its last linear
    layer (a linear probe on the pretrained features), the rest fine-tune everything; the epochs and the
    schedule are the attack's (no extra training); 0 (off) by default, as validated. ``warm_max_per_class``:
    the students start from the pretrained weights only when the query budget is at most this many queries per
    class (``None``: always); above it the pretrained features only choose the cold start's queries and every
    student starts fresh, as the plain attack's (default 10: on the validation split the pretrained start
    helps at about 10 queries per class and costs accuracy at 100, docs/surrogate-active.md, fourth and fifth
    passes). With a random cold start above that budget nothing is pretrained at all."""

    epochs: int = 5
    batch_size: int = 128
    lr: float = 0.1
    min_steps: int = 300
    temperature: float = 0.5
    freeze: bool = False
    finetune_lr: float | None = 0.05
    probe_epochs: int = 0
    warm_max_per_class: int | None = 10

    def __post_init__(self) -> None:
        if self.warm_max_per_class is not None and self.warm_max_per_class < 0:
            raise InputError(f"pretraining.warm_max_per_class must be >= 0 or none, got {self.warm_max_per_class}")
        if self.probe_epochs < 0:
            raise InputError(f"pretraining.probe_epochs must be >= 0, got {self.probe_epochs}")
        if self.finetune_lr is not None and not (self.finetune_lr > 0 and math.isfinite(self.finetune_lr)):
            raise InputError(f"pretraining.finetune_lr must be a positive learning rate or none, got {self.finetune_lr}")
        if self.epochs < 1 or self.batch_size < 2 or not self.lr > 0 or self.min_steps < 0 or not self.temperature > 0:
            raise InputError("pretraining epochs must be >= 1, batch_size >= 2, lr and temperature > 0, "
                             "min_steps >= 0")

    def epochs_for(self, pool_size: int) -> int:
        """Epochs over a pool of ``pool_size`` images: ``epochs``, or enough for ``min_steps`` steps."""
        return max(self.epochs, math.ceil(self.min_steps / math.ceil(pool_size / self.batch_size)))

    def train_config(self, pool_size: int, seed: int) -> TrainConfig:
        return TrainConfig(epochs=self.epochs_for(pool_size), batch_size=self.batch_size, optimizer="sgd",
                           lr=self.lr, momentum=0.9, weight_decay=5e-4, schedule="onecycle", seed=seed)

    def warm_start(self, budget: int, num_classes: int) -> bool:
        """Whether the students of an attack with ``budget`` queries start from the pretrained weights."""
        return self.warm_max_per_class is None or budget <= self.warm_max_per_class * num_classes

    def identity(self, method: str) -> dict[str, Any]:
        """What the pretrained weights depend on (not ``freeze``, ``finetune_lr``, ``probe_epochs`` or
        ``warm_max_per_class``, which act after pretraining; ``temperature`` only for SimCLR)."""
        skip = {"freeze", "finetune_lr", "probe_epochs", "warm_max_per_class"} | ({"temperature"} if method != "simclr" else set())
        return {k: v for k, v in asdict(self).items() if k not in skip}


class WithHead(nn.Module):
    """The student with a pretraining ``head`` on its penultimate features (the last linear layer's input)."""

    def __init__(self, student: nn.Module, head: Callable[[int], nn.Module]) -> None:
        super().__init__()
        linear = last_linear(student)
        self.student, self.head = student, head(linear.in_features)
        self._feats: list[torch.Tensor] = []
        linear.register_forward_hook(lambda _m, inp, _o: self._feats.append(inp[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._feats.clear()
        self.student(x)
        return self.head(self._feats[-1].flatten(1))


def fit_pretext(net: nn.Module, pool: torch.Tensor, tc: TrainConfig, batch_loss: BatchLoss, counts: list[int],
                *, desc: str, device: str | torch.device) -> tuple[float, float]:
    """Train ``net`` on the pool's images with a self-supervised ``batch_loss`` (which adds to ``counts`` =
    [right, total] of its pretext predictions); returns the last epoch's loss and pretext accuracy."""

    def epoch_done(epoch: int, _rec: dict[str, float]) -> None:
        if epoch < tc.epochs:  # the last epoch's accuracy is what is reported
            counts[0] = counts[1] = 0

    history = fit(net, pool, torch.zeros(pool.shape[0]), tc, batch_loss=batch_loss, device=device, desc=desc,
                  on_epoch=epoch_done)
    return history[-1]["loss"], round(counts[0] / max(counts[1], 1), 4)
