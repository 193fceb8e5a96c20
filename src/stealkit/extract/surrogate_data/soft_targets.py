"""Soft, sharpened teacher targets on the unqueried pool (``ssl="soft"``): MixMatch's label guessing.

Jagielski et al. (*High Accuracy and High Fidelity Extraction of Neural Networks*, USENIX Security 2020,
Section 5.2) train the extraction student on the attacker's unlabelled pool with MixMatch (Berthelot et al.,
*MixMatch: A Holistic Approach to Semi-Supervised Learning*, NeurIPS 2019). This module takes MixMatch's
*label guessing* (Section 3.2): instead of FixMatch's hard, thresholded pseudo-label
(:mod:`stealkit.extract.surrogate_data.semi_supervised`), each pool image ``u`` gets a soft target

* ``q_bar = (1/K) sum_k softmax(teacher(alpha_k(u)))`` -- the mean teacher's prediction averaged over ``K``
  (``views``) weak views (MixMatch eq. 6; the teacher is the EMA of the student, as in FixMatch's remedies),
  distribution-aligned to the victim's answers when ``align`` is on (ReMixMatch Sec. 3.2);
* sharpened with temperature ``T`` (``sharpen``): ``t_i = q_bar_i^(1/T) / sum_j q_bar_j^(1/T)`` (eq. 7);

and the student is trained on a *strong* view against it with soft cross-entropy, each image weighted by the
teacher's confidence ``max_i q_bar_i`` instead of being kept or dropped at a threshold:
``l_u = mean_b max(q_bar_b) * H(t_b, s(A(u_b)))``. The queried images keep the extraction loss on the
victim's own answers (KL on probabilities, cross-entropy on labels; ``make_student_loss``), so with
probability answers both terms are soft. Differences from MixMatch: no MixUp between labelled and unlabelled
batches, cross-entropy rather than the squared error on the unlabelled term (with the confidence weight in
place of MixMatch's ramped ``lambda_u`` alone), FixMatch's strong view for the student.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.surrogate_data.semi_supervised import (
    DistributionAlignment,
    FixMatchConfig,
    FixMatchLoss,
    strong_view,
    weak_view,
)


def sharpen(q: torch.Tensor, temperature: float) -> torch.Tensor:
    """MixMatch's sharpening (eq. 7): ``q^(1/T)`` renormalised over the classes."""
    p = q.clamp_min(1e-12).pow(1.0 / temperature)
    return p / p.sum(dim=1, keepdim=True)


@torch.no_grad()
def guess_targets(teacher: nn.Module, u: torch.Tensor, config: FixMatchConfig, gen: torch.Generator,
                  device: str | torch.device = "cpu", align: DistributionAlignment | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sharpened soft targets of the pool images ``u`` and the teacher's confidence in each."""
    q = torch.stack([torch.softmax(teacher(weak_view(u, config, gen).to(device)), dim=1)
                     for _ in range(config.views)]).mean(0)
    if align is not None:
        q = align(q)
    return sharpen(q, config.sharpen), q.max(dim=1).values


def soft_unlabelled_loss(model: nn.Module, u: torch.Tensor, config: FixMatchConfig, gen: torch.Generator,
                         device: str | torch.device = "cpu", *, teacher: nn.Module | None = None,
                         align: DistributionAlignment | None = None) -> torch.Tensor:
    """``l_u`` of the module doc: confidence-weighted soft cross-entropy on a strong view of ``u``."""
    targets, confidence = guess_targets(teacher if teacher is not None else model, u, config, gen, device, align)
    log_p = F.log_softmax(model(strong_view(u, config, gen).to(device)), dim=1)
    return (confidence * -(targets * log_p).sum(dim=1)).mean()


class SoftTargetLoss(FixMatchLoss):
    """:class:`FixMatchLoss` (warm-up, mean teacher, alignment, ``mu`` pool images per answer) with the soft,
    sharpened, confidence-weighted targets of the module doc as its unlabelled term."""

    def unlabelled(self, model: nn.Module, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return soft_unlabelled_loss(model, u, self.config, gen, self.device,
                                    teacher=self.teacher.model if self.teacher is not None else None,
                                    align=self.align)
