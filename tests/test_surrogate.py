"""Surrogate-data extraction (DFME appendix A): losses, the distinct-sample cap, the answer cache, a digits run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache
from stealkit.extract.surrogate_data.knockoff import KnockoffConfig
from stealkit.extract.surrogate_data.surrogate import (
    SurrogateConfig,
    extract_surrogate,
    make_student_loss,
    resolve_loss,
)
from stealkit.metrics import Evaluator, predict_labels
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models: threads only add synchronisation


def _tiny_student() -> nn.Module:
    return TinyNet(seed=5)


@pytest.mark.parametrize("mode", ["probs", "logits", "label", "topk"])
@pytest.mark.parametrize("cap,budget,epochs", [(20, None, 3), (50, 30, 2), (None, 25, 4), (100, None, 1)])
def test_cap_cache_and_ledger_agree(tiny_model, mode, cap, budget, epochs):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode, top_k=2, budget=budget)
    config = SurrogateConfig(max_distinct=cap, epochs=epochs, batch_size=8, seed=1)
    result = extract_surrogate(oracle, pool, make_student=_tiny_student, config=config)
    expected = min(60, cap or 60, budget or 60)
    assert result.queries["predict"] == expected == result.extra["n_distinct"] == result.extra["queries_spent"]
    # every epoch after the first re-uses the cache: hits = (epochs - 1) * distinct
    assert result.extra["cache_hits"] == (epochs - 1) * expected


def test_cache_queries_each_image_once(tiny_model):
    x = torch.rand(10, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=10)
    cache = AnswerCache(oracle, x, query_batch=3)
    a = cache.get(torch.tensor([0, 1, 1, 2]))
    assert oracle.ledger.total == 3 and cache.n_answered == 3
    b = cache.get(torch.tensor([2, 1, 0, 9]))
    assert oracle.ledger.total == 4 and cache.hits == 4 and cache.misses == 4
    assert torch.equal(a[[0, 1, 3]], b[[2, 1, 0]])
    assert torch.allclose(cache.get(torch.arange(10)), torch.softmax(tiny_model(x), 1), atol=1e-6)
    assert oracle.ledger.total == 10


def test_loss_choice_follows_access():
    assert resolve_loss("auto", "label") == "ce" and resolve_loss("auto", "probs") == "kl"
    with pytest.raises(InputError, match="--loss ce"):
        resolve_loss("kl", "label")
    with pytest.raises(InputError):
        resolve_loss("l1", "topk")
    with pytest.raises(InputError):
        SurrogateConfig(schedule="linear")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        SurrogateConfig(tau=0)


def test_l1_on_recovered_logits_matches_centred_logits():
    z = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    s = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    from_probs = make_student_loss("l1", "probs")(s, torch.softmax(z, 1))
    from_centred = make_student_loss("l1", "logits")(s, z - z.mean(1, keepdim=True))
    assert float(from_probs) == pytest.approx(float(from_centred), rel=1e-5)


def test_pool_shape_and_budget_errors(tiny_model):
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=0)
    with pytest.raises(InputError, match="budget"):
        extract_surrogate(oracle, torch.rand(5, 1, 4, 4), make_student=_tiny_student, config=SurrogateConfig())
    with pytest.raises(InputError, match="shape"):
        extract_surrogate(oracle, torch.rand(5, 1, 8, 8), make_student=_tiny_student, config=SurrogateConfig())


@pytest.fixture(scope="module")
def digits_victim():
    from stealkit.data import load_splits
    from stealkit.models import build_model
    from stealkit.train import TrainConfig, fit

    splits = load_splits("digits", seed=0)
    torch.manual_seed(0)
    victim = build_model("mlp2", input_shape=(1, 8, 8), num_classes=10, hidden=32)
    fit(victim, splits.victim_train.x, splits.victim_train.y, TrainConfig(epochs=15, batch_size=64, lr=0.01, seed=0))
    return victim.eval(), splits


@pytest.mark.parametrize("mode,strategy", [
    ("probs", "random"),
    pytest.param("label", "random", marks=pytest.mark.slow),
    pytest.param("probs", "knockoff", marks=pytest.mark.slow),
])
def test_end_to_end_on_digits(digits_victim, mode, strategy):
    from stealkit.models import build_model

    victim, splits = digits_victim
    oracle = LocalOracle(victim, (1, 8, 8), mode=mode, budget=300)
    labels = predict_labels(victim, splits.test.x)
    evaluator = Evaluator(splits.test.x, splits.test.y, labels)
    assert evaluator.victim_accuracy > 0.9

    def make() -> nn.Module:
        torch.manual_seed(0)
        return build_model("mlp2", input_shape=(1, 8, 8), num_classes=10, hidden=32)

    config = SurrogateConfig(max_distinct=250, epochs=20, batch_size=32, tau=3.0, strategy=strategy,
                             knockoff=KnockoffConfig(step_batch=10), eval_every=5, seed=0)
    result = extract_surrogate(oracle, splits.attacker_pool.x, make_student=make, config=config,
                               evaluator=evaluator, pool_labels=splits.attacker_pool.y)
    assert result.queries == {"predict": 250, "explain": 0}
    assert result.fidelity is not None and result.fidelity > 0.8
    assert [p["epoch"] for p in result.curve] == [5, 10, 15, 20]
    assert all(p["queries"] == 250 for p in result.curve)
    summary = result.summary()
    assert summary["queries"]["predict"] == 250 and summary["method"].startswith("surrogate")
    if strategy == "knockoff":
        trace = summary["knockoff"]
        assert sum(trace["queries_per_action"]) == 250 and len(trace["final_policy"]) == 10
