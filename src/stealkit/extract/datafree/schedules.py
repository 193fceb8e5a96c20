"""Learning-rate schedules of the data-free attacks, as factors of the base rate at ``progress`` in [0, 1]."""

from __future__ import annotations

import math

import torch


def multistep_factor(progress: float, milestones: tuple[float, ...], gamma: float) -> float:
    """``gamma ** (number of milestones passed)`` at ``progress`` in [0, 1] (DFME: 0.3 at 10/30/50%)."""
    return gamma ** sum(progress >= m for m in milestones)


def cosine_factor(progress: float) -> float:
    """Cosine annealing from 1 to 0 over the run (MAZE)."""
    return 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr
