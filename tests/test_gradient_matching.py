"""Gradient-matching reconstruction (Milli et al. 2019, Sec. 4): the joint loss, query accounting, errors."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.extract.explanations.gradient_matching import (
    GradMatchConfig,
    extract_gradient_matching,
    query_answers,
    train_reconstruction,
)
from stealkit.metrics import Evaluator, predict_labels
from stealkit.models import build_model
from stealkit.oracle import LocalExplanationOracle, LocalOracle


def _victim() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("logistic", input_shape=(1, 4, 4), num_classes=3)


@pytest.mark.slow
def test_gradient_loss_recovers_a_linear_model_from_few_queries() -> None:
    victim = _victim()
    x = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    oracle = LocalExplanationOracle(victim, (1, 4, 4), mode="probs")
    answers = query_answers(oracle, x, GradMatchConfig())
    # the victim's logit gradient of class c is its weight row (times 1/std): the maps must say so
    w = victim.net[1].weight.detach() / 0.5
    assert torch.allclose(answers.maps.flatten(1), w[answers.classes], atol=1e-6)  # type: ignore[union-attr]
    torch.manual_seed(0)
    student = train_reconstruction(build_model("logistic", input_shape=(1, 4, 4), num_classes=3), answers,
                                   GradMatchConfig(steps=150, lr=3e-2))
    ws = student.net[1].weight.detach() / 0.5
    seen = answers.classes.unique()
    assert float((ws[seen] - w[seen]).abs().max()) < 0.05 * float(w.abs().max())


def test_ledger_counts_membership_and_explanations_separately() -> None:
    victim = _victim()
    pool = torch.rand(30, 1, 4, 4)
    ev = Evaluator(pool, predict_labels(victim, pool), predict_labels(victim, pool))
    for grads, explain in ((True, 20), (False, 0)):
        oracle = LocalExplanationOracle(victim, (1, 4, 4), mode="probs")
        res = extract_gradient_matching(oracle, pool, make_student=lambda: build_model(
            "logistic", input_shape=(1, 4, 4), num_classes=3), evaluator=ev,
            config=GradMatchConfig(use_gradients=grads, steps=5), checkpoints=(5, 20))
        assert res.queries == {"predict": 20, "explain": explain}
        assert [p["queries_predict"] for p in res.curve] == [5, 20]


def test_smoothgrad_maps_are_requested() -> None:
    victim = _victim()
    oracle = LocalExplanationOracle(victim, (1, 4, 4), mode="probs")
    ans = query_answers(oracle, torch.rand(2, 1, 4, 4), GradMatchConfig(explanation="smoothgrad"))
    assert ans.maps is not None and oracle.ledger.as_dict() == {"predict": 2, "explain": 2}


def test_user_errors() -> None:
    victim = _victim()
    with pytest.raises(InputError, match="--mode probs"):
        query_answers(LocalExplanationOracle(victim, (1, 4, 4), mode="logits"), torch.rand(1, 1, 4, 4),
                      GradMatchConfig())
    with pytest.raises(InputError, match="no explanations"):
        query_answers(LocalOracle(victim, (1, 4, 4), mode="probs"), torch.rand(1, 1, 4, 4), GradMatchConfig())
    with pytest.raises(InputError):
        GradMatchConfig(explanation="lime")  # type: ignore[arg-type]
