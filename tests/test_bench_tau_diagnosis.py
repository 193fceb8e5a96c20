"""benchmarks/tau_diagnosis.py: its gradient-norm hooks read the training without changing it."""

from __future__ import annotations

import math

import pytest
import torch

import stealkit.train as train_mod
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet, load_benchmark


def test_hooked_students_train_bitwise_alike_and_record_every_steps_norm(tiny_model, monkeypatch):
    torch.set_num_threads(1)
    bench = load_benchmark("tau_diagnosis")
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    clip_norms: list[float] = []
    inner = train_mod.clip_gradients

    def spy(params, max_norm):  # type: ignore[no-untyped-def]
        clip_norms.append(inner(params, max_norm))
        return clip_norms[-1]

    monkeypatch.setattr(train_mod, "clip_gradients", spy)
    config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, tau=2.0, grad_clip=1e9)
    students, steps = [], []
    for hooked in (False, True):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=37)
        make = bench.with_grad_norms(lambda: TinyNet(seed=5), steps) if hooked else (lambda: TinyNet(seed=5))
        r = extract_surrogate(oracle, pool, make_student=make, config=config)
        assert oracle.ledger.total == 37
        students.append(torch.cat([p.detach().flatten() for p in r.student.parameters()]))
    assert torch.equal(students[0], students[1])
    assert len(steps) == math.ceil(37 / 8) * 3 == len(clip_norms) // 2
    assert steps == pytest.approx(clip_norms[len(steps):], rel=1e-5)  # the norm the clip sees, step for step
