"""Knockoff Nets' adaptive policy (Orekondy et al. 2019): distinct picks, exhausted actions, the ledger."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache
from stealkit.extract.surrogate_data.knockoff import KnockoffConfig, kmeans_actions, knockoff_select
from stealkit.extract.surrogate_data.surrogate import make_student_loss
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("mode", ["probs", "label", "logits"])
@pytest.mark.parametrize("n", [7, 30, 40])
def test_picks_are_distinct_and_charged_once(tiny_model, mode, n):
    x = torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    actions = torch.arange(40) % 4
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode)
    cache = AnswerCache(oracle, x)
    picked, trace = knockoff_select(cache, n, make_student=lambda: TinyNet(seed=3),
                                    loss_fn=make_student_loss("auto", mode), config=KnockoffConfig(step_batch=6),
                                    actions=actions, seed=0)
    assert picked.numel() == n == picked.unique().numel()
    assert oracle.ledger.total == n == cache.n_answered
    assert sum(trace["queries_per_action"]) == n
    assert abs(sum(trace["final_policy"]) - 1) < 1e-3


def test_exhausted_actions_are_skipped(tiny_model):
    x = torch.rand(12, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    actions = torch.tensor([0] * 2 + [1] * 10)  # action 0 runs dry after two picks
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs")
    picked, trace = knockoff_select(AnswerCache(oracle, x), 12, make_student=lambda: TinyNet(seed=3),
                                    loss_fn=make_student_loss("kl", "probs"), config=KnockoffConfig(step_batch=5),
                                    actions=actions, seed=1)
    assert sorted(picked.tolist()) == list(range(12)) and trace["queries_per_action"] == [2, 10]


def test_kmeans_actions_and_errors(tiny_model):
    x = torch.cat([torch.zeros(10, 1, 4, 4), torch.ones(10, 1, 4, 4)])
    labels = kmeans_actions(x, 2, seed=0, size=2)
    assert labels[:10].unique().numel() == 1 and labels[10:].unique().numel() == 1 and labels[0] != labels[-1]
    oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs")
    with pytest.raises(InputError):
        knockoff_select(AnswerCache(oracle, x), 5, make_student=lambda: TinyNet(seed=3),
                        loss_fn=make_student_loss("kl", "probs"), config=KnockoffConfig(),
                        actions=torch.zeros(3, dtype=torch.long))
    with pytest.raises(InputError):
        KnockoffConfig(rewards=("fun",))
