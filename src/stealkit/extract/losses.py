"""Student losses shared by the extraction methods."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

#: a student loss ``fn(student_logits, victim_answers)``
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def soft_cross_entropy(student_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against soft targets (rows renormalised, so top-k answers work): KL up to a constant."""
    p = target_probs / target_probs.sum(dim=1, keepdim=True).clamp_min(1e-12)
    return -(p * F.log_softmax(student_logits, dim=1)).sum(dim=1).mean()


def loss_for_mode(mode: str):  # noqa: ANN201 - returns a loss function
    """The natural student loss for what the oracle returns: CE on labels, soft CE otherwise."""
    if mode == "label":
        return lambda logits, y: F.cross_entropy(logits, y.long())
    if mode == "logits":
        return lambda logits, z: soft_cross_entropy(logits, torch.softmax(z, dim=1))
    return soft_cross_entropy
