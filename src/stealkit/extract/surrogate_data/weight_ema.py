"""The student's weights averaged over training: an exponential moving average used as the final student.

Tarvainen & Valpola, *Mean teachers are better role models*, NeurIPS 2017, Section 2: the teacher's weights
are an exponential moving average ``theta'_t = alpha * theta'_{t-1} + (1 - alpha) * theta_t`` of the
student's after every step, and the averaged model is the better predictor. Here there is no consistency
term: the average only replaces the student at the end of training (Polyak averaging), so it costs no extra
gradient step and no query. The decay warms up as in :class:`~stealkit.extract.surrogate_data.semi_supervised.MeanTeacher`
(``min(decay, (1 + t) / (10 + t))``), which this wraps; buffers (e.g. batch-norm statistics) are taken from
the student, since they are not trained by gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from stealkit.extract.surrogate_data.semi_supervised import MeanTeacher

BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


class WeightEMA:
    """Wraps a ``batch_loss``: before each step the average takes in the weights after the previous one;
    :meth:`finish` folds in the last step and copies the average into the model."""

    def __init__(self, batch_loss: BatchLoss, decay: float) -> None:
        self.batch_loss, self.decay = batch_loss, decay
        self.teacher: MeanTeacher | None = None

    def __call__(self, model: nn.Module, idx: torch.Tensor, target: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:
        if self.teacher is None:
            self.teacher = MeanTeacher(model, self.decay)
        else:
            self.teacher.update(model)
        return self.batch_loss(model, idx, target, gen)

    @torch.no_grad()
    def finish(self, model: nn.Module) -> None:
        if self.teacher is None:
            return
        self.teacher.update(model)
        for t, s in zip(self.teacher.model.buffers(), model.buffers(), strict=True):
            t.copy_(s)
        model.load_state_dict(self.teacher.model.state_dict())
