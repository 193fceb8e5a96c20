"""MixUp of the answered images (Zhang, Cisse, Dauphin and Lopez-Paz, *mixup: Beyond Empirical Risk
Minimization*, ICLR 2018, Sec. 2).

The student trains on convex combinations of pairs of answered images, ``x = lam * x_i + (1 - lam) * x_j``,
against the same combination of their targets, with one ``lam ~ Beta(alpha, alpha)`` per batch and the pairs
formed by a random permutation of the batch (Sec. 2, "mixup"). The targets are the victim's answers, so no
image is queried for it and the budget is untouched:

* cross entropy (label answers, or ``--loss ce``): the mixed (smoothed) one-hot target. Cross entropy is linear
  in its target and label smoothing mixes the one-hot target with the uniform one linearly, so this is
  ``lam * CE(s, y_i) + (1 - lam) * CE(s, y_j)`` with the smoothing of the loss, computed that way;
* probability (top-k, logit) answers: the answer vectors themselves are mixed, ``lam * a_i + (1 - lam) * a_j``,
  and the student's loss (the tau-scaled KL, or L1 on the recovered logits) is taken against the mixture.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.losses import LossFn


def check_alpha(alpha: float) -> None:
    """``alpha`` is the Beta distribution's parameter; 0 turns MixUp off."""
    if not (math.isfinite(alpha) and alpha >= 0):
        raise InputError(f"mixup must be the Beta parameter alpha >= 0 (0: off), got {alpha}")


def mix_weight(alpha: float, gen: torch.Generator) -> float:
    """One ``lam ~ Beta(alpha, alpha)``, drawn from ``gen`` (so a seeded run repeats exactly)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return float(np.random.default_rng(seed).beta(alpha, alpha))


def mixup_loss(model: nn.Module, x: torch.Tensor, answers: torch.Tensor, loss_fn: LossFn, alpha: float,
               gen: torch.Generator, *, mix_answers: bool) -> torch.Tensor:
    """The student's loss on the mixed batch: ``mix_answers`` mixes the answer vectors (probabilities, logits),
    otherwise the two losses are weighted (cross entropy: the mixed one-hot target)."""
    lam = mix_weight(alpha, gen)
    perm = torch.randperm(x.shape[0], generator=gen).to(x.device)
    out = model(lam * x + (1.0 - lam) * x[perm])
    if mix_answers:
        return loss_fn(out, lam * answers + (1.0 - lam) * answers[perm])
    return lam * loss_fn(out, answers) + (1.0 - lam) * loss_fn(out, answers[perm])
