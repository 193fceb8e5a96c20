"""FixMatch's remedies against confirmation bias: warm-up ramp, mean teacher, distribution alignment."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.semi_supervised import (
    DistributionAlignment,
    FixMatchConfig,
    MeanTeacher,
    with_fixmatch,
)
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


def test_warmup_keeps_the_unlabelled_term_off_then_ramps_it_in():
    cfg = FixMatchConfig(warmup=0.2, lambda_u=2.0)
    assert cfg.ramp(0, 100) == 0.0 and cfg.ramp(20, 100) == 0.0
    assert cfg.ramp(30, 100) == pytest.approx(1.0)
    assert cfg.ramp(40, 100) == 2.0 == cfg.ramp(99, 100)
    assert FixMatchConfig(warmup=0.0).ramp(0, 100) == 1.0
    with pytest.raises(InputError, match="warmup"):
        FixMatchConfig(warmup=0.7)
    with pytest.raises(InputError, match="ema"):
        FixMatchConfig(ema=1.0)


def test_alignment_moves_pseudo_labels_towards_the_answers_marginal():
    align = DistributionAlignment(2, momentum=0.0)  # no memory: the last batch's marginals
    align.observe_answers(torch.tensor([0, 1, 0, 1]), 2)  # answers: balanced
    q = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4]])  # the teacher leans to class 0
    out = align(q)
    assert torch.allclose(out.sum(1), torch.ones(3))
    assert (out[:, 1] > q[:, 1]).all()  # mass moved to the under-predicted class
    assert int(out.argmax(1)[-1]) == 1  # the least confident one changes its pseudo-label
    align.observe_answers(torch.tensor([[0.25, 0.75]]), 2)  # probabilities are used as they are
    assert torch.allclose(align.answers, torch.tensor([0.25, 0.75]))


def test_mean_teacher_follows_the_student_slowly():
    student = nn.Linear(2, 2)
    teacher = MeanTeacher(student, decay=0.5)  # (1 + t) / (10 + t) < 0.5 at the first updates
    before = teacher.model.weight.clone()
    with torch.no_grad():
        student.weight.add_(1.0)
    teacher.update(student)  # t = 1: decay 2/11
    assert torch.allclose(teacher.model.weight, before + 9 / 11)
    teacher.updates = 100  # late: the configured decay
    with torch.no_grad():
        student.weight.add_(2.0 / 11)  # the student is now 1 + 2/11 above the start, the teacher 9/11
    teacher.update(student)
    assert torch.allclose(teacher.model.weight, before + 1.0)
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_align_needs_the_answers():
    with pytest.raises(InputError, match="align"):
        with_fixmatch(lambda m, i, t, g: torch.zeros(()), torch.rand(4, 1, 4, 4), FixMatchConfig(align=True))


def test_finish_makes_the_mean_teacher_the_result():
    model = TinyNet(seed=1)
    loss = with_fixmatch(lambda m, i, t, g: m(torch.rand(2, 1, 4, 4)).sum(), torch.rand(8, 1, 4, 4),
                         FixMatchConfig(ema=0.5, threshold=0.0, align=False), total_steps=2)
    gen = torch.Generator().manual_seed(0)
    loss(model, torch.arange(2), torch.zeros(2), gen)  # creates the teacher from the current weights
    start = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(2.0)
    loss.finish(model)  # first update, decay 2/11: teacher = start + 2 * 9/11
    assert all(torch.allclose(p, s + 18 / 11) for p, s in zip(model.parameters(), start, strict=True))


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_remedies_spend_exactly_the_budget(mode):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    oracle = LocalOracle(TinyNet(seed=3).eval(), (1, 4, 4), mode=mode, budget=20)
    fm = FixMatchConfig(warmup=0.2, ema=0.9, align=True)
    config = SurrogateConfig(epochs=3, batch_size=8, ssl="fixmatch", fixmatch=fm, seed=1)
    result = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 20 == result.extra["n_distinct"] == oracle.ledger.total
