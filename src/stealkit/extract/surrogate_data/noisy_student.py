"""Self-training on the unqueried pool: a noisy, born-again student (no extra query).

Xie, Luong, Hovy and Le, *Self-training with Noisy Student improves ImageNet classification* (CVPR 2020,
Sec. 2, Algorithm 1): (1) train a teacher on the labelled data; (2) let the teacher, *not noised*, predict soft or
hard pseudo-labels on the unlabelled images (optionally kept only where it is confident, Sec. 2 "data
filtering"); (3) train an equal-or-larger student, *noised*, on the labelled and pseudo-labelled images together;
(4) iterate with the student as the new teacher. Furlanello et al., *Born-Again Neural Networks* (ICML 2018,
Sec. 3): the student has the teacher's very architecture, starts afresh, and learns both the true targets and the
teacher's output distribution; a sequence of such generations.

Here the labelled data are the victim's cached answers and the unlabelled data the pool images that were never
queried:

* the teacher is the attack's student as today (``epochs`` on the answers, the same loss, smoothing, MixUp);
* its predictions on the clean unqueried images (eval mode, no noise) are computed once per round; ``targets``
  ``soft`` keeps the probability vectors, ``hard`` their argmax; images whose top probability is below
  ``threshold`` are dropped (0: all kept);
* a fresh student of the same architecture trains for the same ``epochs`` over the answers with the same
  labelled loss (weight 1, as today), and at every step also on ``mu`` times as many unqueried images, drawn
  with the loop's generator, each seen through noise and trained towards the teacher's target with weight
  ``weight`` (soft cross entropy, or cross entropy on hard labels). The noise is the input augmentation this data
  allows (``noise``: FixMatch's ``weak`` view -- a shift, flips only on flip-invariant data -- or its ``strong``
  view -- a larger shift, brightness/contrast, Gaussian noise, Cutout; :mod:`stealkit.extract.surrogate_data.semi_supervised`);
  the zoo's conv students have no dropout or stochastic depth, so the paper's model noise is absent;
* ``rounds`` such students, each the next one's teacher.

The answers are the cached ones (:class:`~stealkit.extract.answer_cache.AnswerCache`): no image is queried twice
and none beyond the budget. The pool pass is extra attacker compute, like FixMatch's. When every pool image was
queried (nothing left unlabelled) there is nothing to self-train on: the rounds are skipped and the teacher is the
result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.losses import soft_cross_entropy
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig, strong_view, weak_view

BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
Targets = Literal["soft", "hard"]
Noise = Literal["none", "weak", "strong"]


@dataclass(frozen=True)
class NoisyStudentConfig:
    """``rounds``: students trained after the teacher (0: off, the plain attack). ``targets``: ``soft`` (the
    teacher's probabilities) or ``hard`` (its argmax). ``threshold``: keep only the unqueried images where the
    teacher's top probability is at least this (0: all). ``weight``: the pool term's weight (the answers keep 1).
    ``mu``: pool images per answered image in each step. ``noise``: the student's view of the pool images
    (``none``, ``weak``, ``strong``; FixMatch's views, their settings from ``fixmatch``)."""

    rounds: int = 0
    targets: Targets = "soft"
    threshold: float = 0.0
    weight: float = 1.0
    mu: int = 3
    noise: Noise = "strong"

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise InputError(f"noisy_student.rounds must be >= 0 (0: off), got {self.rounds}")
        if self.targets not in ("soft", "hard"):
            raise InputError(f"noisy_student.targets must be soft or hard, got {self.targets!r}")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold < 1.0):
            raise InputError(f"noisy_student.threshold must be in [0, 1), got {self.threshold}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise InputError(f"noisy_student.weight must be a finite number >= 0, got {self.weight}")
        if self.mu < 1:
            raise InputError(f"noisy_student.mu must be >= 1, got {self.mu}")
        if self.noise not in ("none", "weak", "strong"):
            raise InputError(f"noisy_student.noise must be none, weak or strong, got {self.noise!r}")


@torch.no_grad()
def teacher_targets(teacher: nn.Module, images: torch.Tensor, config: NoisyStudentConfig, *, batch: int = 512,
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's targets on clean ``images`` (eval mode: no noise) and the indices kept by ``threshold``:
    soft probability rows or hard labels."""
    teacher.eval()
    probs = torch.cat([torch.softmax(teacher(images[i:i + batch].to(device)), dim=1).cpu()
                       for i in range(0, images.shape[0], batch)]) if images.shape[0] else torch.empty(0, 0)
    keep = torch.nonzero(probs.max(dim=1).values >= config.threshold).flatten() if probs.numel() else \
        torch.empty(0, dtype=torch.long)
    targets = probs[keep] if config.targets == "soft" else probs[keep].argmax(dim=1)
    return targets, keep


class PoolDistillLoss:
    """A ``batch_loss``: the labelled loss as today plus ``weight`` times the loss on ``mu`` times as many pool
    images (drawn with the loop's generator), noised, against the teacher's ``targets``."""

    def __init__(self, labelled: BatchLoss, images: torch.Tensor, targets: torch.Tensor,
                 config: NoisyStudentConfig, views: FixMatchConfig, device: str | torch.device = "cpu") -> None:
        self.labelled, self.images, self.targets = labelled, images, targets
        self.config, self.views, self.device = config, views, device

    def noised(self, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if self.config.noise == "weak":
            return weak_view(u, self.views, gen)
        if self.config.noise == "strong":
            return strong_view(u, self.views, gen)
        return u

    def __call__(self, model: nn.Module, idx: torch.Tensor, target: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:
        loss = self.labelled(model, idx, target, gen)
        pick = torch.randint(0, self.images.shape[0], (self.config.mu * idx.shape[0],), generator=gen)
        out = model(self.noised(self.images[pick], gen).to(self.device))
        t = self.targets[pick].to(self.device)
        pool = F.cross_entropy(out, t) if self.config.targets == "hard" else soft_cross_entropy(out, t)
        return loss + self.config.weight * pool


TrainFn = Callable[[nn.Module, Callable[[BatchLoss], BatchLoss], bool], None]


def noisy_student_rounds(teacher: nn.Module, images: torch.Tensor, indices: torch.Tensor,
                         make_student: Callable[[], nn.Module], train: TrainFn, config: NoisyStudentConfig,
                         views: FixMatchConfig, *, score: Callable[[nn.Module], dict[str, Any]] | None = None,
                         device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Run ``config.rounds`` rounds after ``teacher`` (already trained on the answers). ``images``: the whole
    pool (the cache's images); ``indices``: those answered; the others are the unlabelled set.
    ``train(student, wrap, last)`` trains a fresh student on the answers with ``wrap`` around its labelled loss
    (``last``: the final round, whose epochs are scored). Returns the final student and a trace; a round with
    no image to learn from (none unqueried, or none confident) ends the rounds with the teacher as the result
    (``trace["skipped"]``)."""
    t0 = time.perf_counter()
    unqueried = torch.ones(images.shape[0], dtype=torch.bool)
    unqueried[indices.cpu()] = False
    pool = images[unqueried]
    trace: dict[str, Any] = {"rounds": config.rounds, "targets": config.targets, "noise": config.noise,
                             "unqueried": int(pool.shape[0]), "kept": [], "teachers": []}
    for r in range(config.rounds):
        targets, keep = teacher_targets(teacher, pool, config, device=device)
        trace["kept"].append(int(keep.numel()))
        if score is not None:
            trace["teachers"].append(score(teacher))
        if keep.numel() == 0:  # nothing unlabelled (or nothing confident): the teacher stays the result
            trace["skipped"] = "no unqueried image" if pool.shape[0] == 0 else "no confident teacher prediction"
            break
        student = make_student()
        kept = pool[keep]
        train(student, lambda labelled, k=kept, t=targets: PoolDistillLoss(labelled, k, t, config, views, device),
              r == config.rounds - 1)
        teacher = student
    trace["seconds"] = round(time.perf_counter() - t0, 2)
    return teacher, trace
