"""Student losses shared by the extraction methods."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from stealkit.extract.targets import answer_probs
from stealkit.oracle import OutputMode

#: a student loss ``fn(student_logits, victim_answers)``
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def soft_cross_entropy_rows(student_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-row cross-entropy against soft targets (rows renormalised, so top-k answers work)."""
    p = target_probs / target_probs.sum(dim=1, keepdim=True).clamp_min(1e-12)
    return -(p * F.log_softmax(student_logits, dim=1)).sum(dim=1)


def soft_cross_entropy(student_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against soft targets, the batch mean of :func:`soft_cross_entropy_rows`: KL up to a constant."""
    return soft_cross_entropy_rows(student_logits, target_probs).mean()


def loss_for_mode(mode: str) -> LossFn:
    """The natural student loss for what the oracle returns: CE on labels, soft CE otherwise."""
    parsed = OutputMode.parse(mode)
    if parsed is OutputMode.LABEL:
        return lambda logits, y: F.cross_entropy(logits, y.long())
    if parsed is OutputMode.LOGITS:
        return lambda logits, z: soft_cross_entropy(logits, answer_probs(z, parsed, logits.shape[1]))
    return soft_cross_entropy  # probs and top-k answers: soft_cross_entropy renormalises their rows
