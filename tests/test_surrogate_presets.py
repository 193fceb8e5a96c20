"""What a run with each preset of ``stealkit extract surrogate`` does (``auto``, the default, and ``paper``): the
images it asks, the optimiser steps, batch sizes and peak learning rate of its student, whether FixMatch trains on
the unqueried pool, and the loss settings it ends with. Tiny victim (3 classes), so 10 answers per class is 30."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from stealkit.extract.surrogate_data.presets import PRESET_NAMES
from stealkit.extract.surrogate_data.surrogate import resolve_config
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

POOL = torch.rand(240, 1, 4, 4, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Asked(nn.Module):
    """The victim, keeping every image it was really asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.asked = TinyNet(seed=3), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.asked.append(x.clone())
        return self.net(x)


class Student(TinyNet):
    """Logs the batch size of every forward pass it makes in training mode."""

    sizes: list[int] = []  # a class attribute: shared by copies (FixMatch's mean teacher)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            Student.sizes.append(int(x.shape[0]))
        return super().forward(x)


def run(preset: str, mode: str, budget: int, **fields: Any) -> dict[str, Any]:
    """One run of ``preset`` as the command resolves it; what it did (the final student's optimiser only)."""
    from stealkit.extract.surrogate_data.surrogate import extract_surrogate

    victim = Asked().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=budget)
    victim.asked.clear()
    resolved, config = resolve_config(preset, budget, 3, mode=mode, seed=4, **fields)
    steps: dict[int, list[float]] = {}  # per optimiser: the learning rate of each step

    def on_step(opt: torch.optim.Optimizer, *_: Any) -> None:
        steps.setdefault(id(opt), []).append(opt.param_groups[0]["lr"])

    def make() -> nn.Module:
        Student.sizes = []  # the last student built is the final one
        return Student(seed=5)

    handle = register_optimizer_step_post_hook(on_step)
    try:
        r = extract_surrogate(oracle, POOL, make_student=make, config=config)
    finally:
        handle.remove()
    lrs = list(steps.values())[-1]
    asked = torch.cdist(torch.cat(victim.asked).flatten(1), POOL.flatten(1)).argmin(dim=1)
    order = torch.randperm(POOL.shape[0], generator=torch.Generator().manual_seed(4))
    return {"resolved": resolved, "steps": len(lrs), "peak_lr": max(lrs), "sizes": Student.sizes,
            "asked": asked.tolist(), "first_of_shuffle": sorted(asked.tolist()) == sorted(order[:budget].tolist()),
            "queries": r.queries["predict"], "ledger": oracle.ledger.total, "extra": r.extra, "config": config}


def test_there_are_two_presets():
    assert PRESET_NAMES == ("auto", "paper")


@pytest.mark.parametrize("mode", ["label", "topk", "logits"])
def test_auto_below_ten_per_class_trains_fixmatch_on_the_unqueried_pool_with_smoothing(mode):
    """5 answers per class: random queries; every epoch cycles the answers to a third of the pool (80 of 15 at
    batch 64: 2 steps), and FixMatch's strong views of 3x as many pool images join after the warm-up."""
    did = run("auto", mode, 15)
    assert did["resolved"] == "semi+label_smoothing=0.1" and did["first_of_shuffle"]
    assert did["queries"] == did["ledger"] == 15 == len(did["asked"])
    assert did["steps"] == 30 * 2 and did["peak_lr"] == pytest.approx(0.1, rel=0.01)
    assert 3 * 64 in did["sizes"]  # FixMatch's unlabelled term: mu = 3 pool images per answered one
    assert did["extra"]["ssl"] == "fixmatch"
    assert did["extra"]["label_smoothing"] == (0.1 if mode == "label" else 0.0)  # the cross entropy only


def test_auto_from_ten_per_class_with_labels_trains_plain_equal_batches_with_smoothing():
    """15 per class at batch 16: three equal batches of 15 (not 16, 16, 13), 30 epochs, no pool term, smoothing."""
    did = run("auto", "label", 45, batch_size=16)
    assert did["resolved"] == "plain+batching=equal" and did["first_of_shuffle"] and did["queries"] == 45
    assert did["steps"] == 90 and did["sizes"] == [15] * 90 and did["peak_lr"] == pytest.approx(0.1, rel=0.01)
    assert did["extra"]["label_smoothing"] == 0.1 and did["extra"]["ssl"] == "none"


@pytest.mark.slow
def test_auto_with_probabilities_trains_three_thousand_steps_at_tau_two_and_lr_005():
    """5 answers per class with probabilities: no FixMatch; at least 3,000 steps (one batch an epoch: 3,000 epochs),
    peak learning rate 0.05, temperature 2, gradients clipped at 5; still exactly 15 queries."""
    did = run("auto", "probs", 15)
    assert did["resolved"] == "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000"
    assert did["steps"] == 3000 == did["extra"]["steps"] and set(did["sizes"]) == {15}
    assert did["peak_lr"] == pytest.approx(0.05, rel=0.01) and did["extra"]["tau"] == 2.0 and did["extra"]["grad_clip"] == 5.0
    assert did["queries"] == did["ledger"] == 15 and did["first_of_shuffle"]


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_auto_from_twenty_per_class_asks_half_at_random_and_the_rest_by_margin(mode):
    """22 per class: 33 random answers, then four rounds of the round substitute's smallest margins; the ledger is
    the budget."""
    did = run("auto", mode, 66, **({"settings": {"min_steps": 0}} if mode == "probs" else {}))
    rounds = did["extra"]["active"]
    assert rounds["strategy"] == "margin" and rounds["sizes"] == [33, 9, 8, 8, 8]
    assert did["queries"] == did["ledger"] == 66 == len(set(did["asked"])) and not did["first_of_shuffle"]


@pytest.mark.parametrize("mode,budget", [("label", 15), ("label", 45), ("probs", 15), ("probs", 66)])
def test_paper_is_dfme_appendix_a_at_every_budget(mode, budget):
    """Random queries (the seed's first images), 30 epochs at SGD 0.1 one-cycle with a ragged last batch, tau 1, no
    smoothing, no pool term, no selection, no step floor, whatever the budget and answer kind."""
    did = run("paper", mode, budget, batch_size=16)
    batches = -(-budget // 16)
    assert did["resolved"] == "paper" and did["first_of_shuffle"] and did["queries"] == did["ledger"] == budget
    assert did["steps"] == 30 * batches and did["peak_lr"] == pytest.approx(0.1, rel=0.01)
    assert did["sizes"][:batches] == [16] * (budget // 16) + ([budget % 16] if budget % 16 else [])
    assert did["extra"]["tau"] == 1.0 and did["extra"]["label_smoothing"] == 0.0 and did["extra"]["ssl"] == "none"
    assert did["extra"]["grad_clip"] == 0.0 and "active" not in did["extra"]
