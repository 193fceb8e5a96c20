"""The student-training options of surrogate extraction: label smoothing and the schedule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate, make_student_loss
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_label_smoothing_is_the_mixed_target_cross_entropy():
    s = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 3, 1, 2, 0])
    target = 0.9 * F.one_hot(y, 4).float() + 0.1 / 4
    expected = -(target * F.log_softmax(s, 1)).sum(1).mean()
    assert torch.allclose(make_student_loss("auto", "label", label_smoothing=0.1)(s, y), expected, atol=1e-6)
    # probabilities with loss ce: the argmax label, smoothed alike; plain ce stays unsmoothed
    p = F.one_hot(y, 4).float() * 0.7 + 0.075
    assert torch.allclose(make_student_loss("ce", "probs", label_smoothing=0.1)(s, p), expected, atol=1e-6)
    assert not torch.allclose(make_student_loss("auto", "label")(s, y), expected, atol=1e-4)


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("settings", [{"label_smoothing": 0.1}, {"schedule": "step"}])
def test_training_options_spend_exactly_the_budget_and_change_the_student(tiny_model, mode, settings):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    students = []
    for extra in ({}, settings):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, **extra)  # type: ignore[arg-type]
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        students.append(torch.cat([p.flatten() for p in r.student.parameters()]))
    if mode == "probs" and "label_smoothing" in settings:  # the KL loss ignores it: the same student
        assert torch.equal(students[0], students[1]) and r.extra["label_smoothing"] == 0.0
    else:
        assert not torch.allclose(students[0], students[1])


def test_label_smoothing_waits_for_enough_answers_per_class(tiny_model):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    got = {}
    for cap, smoothing in ((29, 0.0), (29, 0.1), (30, 0.0), (30, 0.1)):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode="label", budget=cap)
        config = SurrogateConfig(epochs=2, batch_size=8, seed=1, label_smoothing=smoothing,
                                 label_smoothing_min_per_class=10)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == cap == oracle.ledger.total
        got[cap, smoothing] = (r.extra["label_smoothing"], torch.cat([p.flatten() for p in r.student.parameters()]))
    assert oracle.num_classes == 3  # 10 per class: from 30 answers
    assert got[29, 0.1][0] == 0.0 and torch.equal(got[29, 0.1][1], got[29, 0.0][1])
    assert got[30, 0.1][0] == 0.1 and not torch.allclose(got[30, 0.1][1], got[30, 0.0][1])


def test_bad_training_options_are_refused():
    with pytest.raises(InputError, match="label_smoothing"):
        SurrogateConfig(label_smoothing=1.0)
    with pytest.raises(InputError, match="min_per_class"):
        SurrogateConfig(label_smoothing_min_per_class=-1)
