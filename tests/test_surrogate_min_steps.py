"""The student's step floor (``min_steps``): its epochs are raised at small budgets, nothing else changes."""

from __future__ import annotations

import math

import pytest
import torch

import stealkit.train as train_mod
from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import ActiveConfig
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, epoch_indices, extract_surrogate
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet
from tests.test_surrogate_batching import _params


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(("answers", "batch", "floor", "epochs"), [
    (100, 64, 1000, 500),   # 2 batches an epoch
    (1000, 64, 2000, 125),  # 16 batches
    (300, 64, 2000, 400),   # 5 batches
    (8000, 64, 2000, 30),   # 125 batches x 30 = 3,750 steps already: unchanged
    (100, 64, 0, 30),       # off
    (0, 64, 1000, 30),      # nothing answered: nothing to raise
])
def test_the_student_epochs_are_raised_to_the_floor_and_never_lowered(answers, batch, floor, epochs):
    config = SurrogateConfig(epochs=30, batch_size=batch, min_steps=floor)
    assert config.student_epochs(answers, 10_000) == epochs
    if floor and answers:
        assert epochs * math.ceil(answers / batch) >= floor  # at least the floor's steps ...
        if epochs > 30:  # ... and one epoch fewer would not be
            assert (epochs - 1) * math.ceil(answers / batch) < floor


def test_with_fixmatch_an_epoch_counts_the_labelled_images_cycled_over_the_pool():
    fm = FixMatchConfig(mu=7)
    config = SurrogateConfig(epochs=30, batch_size=64, min_steps=5000, ssl="fixmatch", fixmatch=fm)
    images = epoch_indices(torch.arange(100), 10_000, fm).numel()  # 1,429: the pool over mu
    assert images == math.ceil(10_000 / 7)
    assert config.student_epochs(100, 10_000) == math.ceil(5000 / math.ceil(images / 64)) == 218


@pytest.mark.parametrize("bad", [-1, -100])
def test_a_negative_floor_is_one_input_error(bad):
    with pytest.raises(InputError, match="min_steps must be >= 0"):
        SurrogateConfig(min_steps=bad)


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_the_floor_trains_the_student_as_the_raised_epochs_would_and_spends_exactly_the_budget(tiny_model, mode):
    """``min_steps=S`` is bitwise ``epochs=E`` with ``E`` the raised epochs; the queries are the budget's."""
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    students, spent = [], []
    for floor, epochs in ((40, 3), (0, 8)):  # 37 answers at batch 8: 5 batches an epoch, so 40 steps = 8 epochs
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=epochs, batch_size=8, seed=1, min_steps=floor)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        students.append(_params(r.student))
        spent.append(r.extra.get("epochs"))
    assert torch.equal(students[0], students[1])
    assert spent == [8, None]  # recorded when the floor acts


def test_the_floor_counts_steps_of_the_student_only_not_of_the_round_substitutes(tiny_model, monkeypatch):
    steps: list[int] = []
    inner = train_mod.fit

    def counting_fit(model, x, target, config, **kw):  # type: ignore[no-untyped-def]
        steps.append(config.epochs * math.ceil(x.shape[0] / config.batch_size))
        return inner(model, x, target, config, **kw)

    monkeypatch.setattr("stealkit.extract.surrogate_data.surrogate.fit", counting_fit)
    pool = torch.rand(80, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=40)
    config = SurrogateConfig(max_distinct=40, epochs=2, batch_size=8, seed=1, min_steps=50, select="margin",
                             active=ActiveConfig(initial=0.5, rounds=2, round_epochs=1))
    r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
    assert oracle.ledger.total == 40 == r.extra["n_distinct"]
    *rounds, student = steps
    assert student == 50 and r.extra["epochs"] == 10  # 40 answers at batch 8: 5 steps an epoch
    # the round substitutes train their own one epoch on what is answered so far (20, then 30 images)
    assert rounds == [math.ceil(20 / 8), math.ceil(30 / 8)]
