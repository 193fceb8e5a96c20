"""Supervised training: optimisers, learning-rate schedules and one loop for victims and students.

Schedules: ``step`` (x0.2 at 30/60/80% of training, DFME appendix A.2), ``onecycle`` (the cyclic schedule of
A.2, Smith's one-cycle), ``cosine`` and ``none``; all stepped per batch. Targets may be class labels (cross
entropy) or anything a custom ``loss_fn(logits, target_batch)`` understands (soft labels, logits).
Gaussian data augmentation (``noise_sigma``) is the noise training of Cohen et al. / Li et al.
Batching (``batching``): ``ragged`` cuts each epoch's permutation into batches of ``batch_size`` and a last
batch of whatever is left; ``equal`` cuts it into as many batches (``ceil(n / batch_size)``, so the same steps
per epoch and the same schedule) whose sizes differ by at most one (:func:`epoch_batches`).
Gradient-norm clipping (``grad_clip``; 0: off, the loop unchanged): each step's gradient rescaled to at most that
norm (Pascanu et al. ICML 2013 Sec. 3.2; :mod:`stealkit.grad_clip`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.grad_clip import check_grad_clip, clip_gradients
from stealkit.progress import note, progress

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: a whole batch's loss from the model itself: ``fn(model, x_batch, target_batch, generator)``
BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
Schedule = Literal["step", "onecycle", "cosine", "none"]
OptimizerName = Literal["sgd", "adam"]
Batching = Literal["ragged", "equal"]
BATCHINGS: tuple[str, ...] = ("ragged", "equal")


@dataclass(frozen=True)
class TrainConfig:
    """How to train. ``lr=None`` picks 0.1 for SGD and 1e-3 for Adam."""

    epochs: int = 10
    batch_size: int = 128
    optimizer: OptimizerName = "adam"
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: Schedule = "cosine"
    seed: int = 0
    noise_sigma: float = 0.0
    max_steps: int | None = None
    batching: Batching = "ragged"
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise InputError(f"epochs and batch_size must be positive, got {self.epochs}, {self.batch_size}")
        if self.optimizer not in ("sgd", "adam"):
            raise InputError(f"unknown optimizer {self.optimizer!r}; expected 'sgd' or 'adam'")
        if self.schedule not in ("step", "onecycle", "cosine", "none"):
            raise InputError(f"unknown schedule {self.schedule!r}; expected step, onecycle, cosine or none")
        if self.noise_sigma < 0:
            raise InputError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        check_batching(self.batching)
        check_grad_clip(self.grad_clip)

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (0.1 if self.optimizer == "sgd" else 1e-3)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def make_optimizer(params: object, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,  # type: ignore[arg-type]
            lr=config.learning_rate,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            nesterov=config.momentum > 0,
        )
    return torch.optim.Adam(params, lr=config.learning_rate, weight_decay=config.weight_decay)  # type: ignore[arg-type]


def make_scheduler(
    opt: torch.optim.Optimizer, schedule: Schedule, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A per-step scheduler over ``total_steps`` steps."""
    total_steps = max(1, total_steps)
    if schedule == "none":
        return None
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)
    if schedule == "onecycle":
        max_lrs = [g["lr"] for g in opt.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lrs, total_steps=total_steps + 1)
    milestones = [0.3, 0.6, 0.8]

    def factor(step: int) -> float:
        frac = step / total_steps
        return 0.2 ** sum(frac >= m for m in milestones)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def check_batching(batching: object) -> None:
    """One :class:`InputError` for anything but ``ragged`` or ``equal``."""
    if batching not in BATCHINGS:
        raise InputError(f"unknown batching {batching!r}; expected ragged or equal")


def epoch_batches(perm: torch.Tensor, batch_size: int, batching: Batching = "ragged") -> list[torch.Tensor]:
    """An epoch's permutation ``perm`` cut into batches: ``ragged``, ``batch_size`` each and the rest last (e.g.
    200 at 64: 64, 64, 64, 8); ``equal``, the same number of batches, ``ceil(n / batch_size)``, whose sizes differ
    by at most one, the larger first (200 at 64: 50 x 4; 1,000 at 64: 8 x 63 and 8 x 62). Every index once."""
    n = perm.numel()
    if batching == "equal":
        return list(torch.tensor_split(perm, math.ceil(n / batch_size))) if n else []
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def fit(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    config: TrainConfig,
    *,
    loss_fn: LossFn = cross_entropy,
    desc: str = "train",
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    device: str | torch.device = "cpu",
    batch_loss: BatchLoss | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` on ``(x, target)`` in place; returns one ``{"epoch", "loss", "lr"}`` per epoch.

    ``batch_loss`` replaces ``loss_fn(model(x), target)`` (and the Gaussian augmentation) for objectives that
    need the model itself, such as stability training or adversarial training; it draws its randomness from
    the loop's generator, so a seeded run is reproducible.
    """
    if x.shape[0] != target.shape[0]:
        raise InputError(f"{x.shape[0]} inputs but {target.shape[0]} targets")
    if x.shape[0] == 0:
        raise InputError("no training data: the query budget or the pool is empty")
    gen = torch.Generator().manual_seed(config.seed)
    model.to(device).train()
    opt = make_optimizer(model.parameters(), config)
    n = x.shape[0]
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    sched = make_scheduler(opt, config.schedule, total)
    history: list[dict[str, float]] = []
    step = 0
    bar = progress(total=total, desc=desc, unit="step")
    for epoch in range(config.epochs):
        note(bar, epoch=f"{epoch + 1}/{config.epochs}")
        perm = torch.randperm(n, generator=gen)
        running, seen = 0.0, 0
        for idx in epoch_batches(perm, config.batch_size, config.batching):
            if step >= total:
                break
            xb, tb = x[idx].to(device), target[idx].to(device)
            if batch_loss is not None:
                loss = batch_loss(model, xb, tb, gen)
            else:
                if config.noise_sigma > 0:
                    xb = xb + torch.randn(xb.shape, generator=gen).to(device) * config.noise_sigma
                loss = loss_fn(model(xb), tb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                clip_gradients(model.parameters(), config.grad_clip)
            opt.step()
            if sched is not None:
                sched.step()
            running += float(loss.detach()) * idx.numel()
            seen += idx.numel()
            step += 1
            bar.update(1)
        rec = {"epoch": epoch + 1, "loss": running / max(seen, 1), "lr": opt.param_groups[0]["lr"]}
        history.append(rec)
        note(bar, loss=f"{rec['loss']:.4f}")
        if on_epoch is not None:
            on_epoch(epoch + 1, rec)
        if step >= total:
            break
    bar.close()
    model.eval()
    return history
