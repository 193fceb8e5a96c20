"""Gradient-norm clipping (``grad_clip``): off is the loop as it was, on bounds every step, no query is added."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import stealkit.train as train_mod
from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.grad_clip import clip_gradients
from stealkit.oracle import LocalOracle
from stealkit.train import TrainConfig, fit
from tests.conftest import TinyNet
from tests.test_surrogate_batching import _old_fit, _params


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_clip_rescales_only_a_gradient_above_the_threshold_and_keeps_its_direction():
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([6.0, 0.0]), torch.tensor([8.0])  # joint norm 10
    assert clip_gradients([a, b], 2.5) == pytest.approx(10.0)
    assert torch.allclose(a.grad, torch.tensor([1.5, 0.0])) and torch.allclose(b.grad, torch.tensor([2.0]))
    assert math.hypot(*a.grad.tolist(), *b.grad.tolist()) == pytest.approx(2.5)
    before = [a.grad.clone(), b.grad.clone()]
    assert clip_gradients([a, b], 3.0) == pytest.approx(2.5)  # below: untouched, bitwise
    assert torch.equal(a.grad, before[0]) and torch.equal(b.grad, before[1])
    assert clip_gradients([nn.Parameter(torch.zeros(1))], 1.0) == 0.0  # no gradient: nothing to do


def test_off_is_the_loop_without_clipping_bitwise(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(45, 1, 4, 4, generator=gen), torch.randint(0, 3, (45,), generator=gen)
    config = TrainConfig(epochs=3, batch_size=16, optimizer="sgd", schedule="onecycle", seed=4)
    assert config.grad_clip == 0.0 and SurrogateConfig().grad_clip == 0.0

    def never(*_: object) -> float:
        raise AssertionError("clip_gradients called with grad_clip=0")

    monkeypatch.setattr(train_mod, "clip_gradients", never)
    ref, got = TinyNet(seed=2), TinyNet(seed=2)
    _old_fit(ref, x, y, config)
    fit(got, x, y, config)
    assert torch.equal(_params(ref), _params(got))


class _Spy:
    """Wraps ``clip_gradients``: records each step's norm before and after."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []
        self.inner = train_mod.clip_gradients

    def __call__(self, params, max_norm: float) -> float:  # type: ignore[no-untyped-def]
        params = list(params)
        norm = self.inner(params, max_norm)
        self.before.append(norm)
        self.after.append(float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params]))))
        return norm


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_clipping_bounds_every_step_changes_the_student_and_spends_exactly_the_budget(tiny_model, monkeypatch,
                                                                                      mode):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    students = []
    for clip in (0.0, 0.05):
        spy = _Spy()
        monkeypatch.setattr(train_mod, "clip_gradients", spy)
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, tau=2.0, grad_clip=clip)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        assert r.extra["grad_clip"] == clip
        if clip == 0:
            assert spy.before == []  # off: never called
        else:
            assert len(spy.before) == math.ceil(37 / 8) * 3  # every step of the student's training
            assert any(b > clip for b in spy.before)  # the threshold bit
            assert all(a <= clip * (1 + 1e-5) for a in spy.after)
        students.append(torch.cat([p.detach().flatten() for p in r.student.parameters()]))
    assert not torch.allclose(students[0], students[1])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "high", True])
def test_a_bad_threshold_is_one_input_error(bad):
    with pytest.raises(InputError, match="grad_clip must be a gradient norm >= 0"):
        SurrogateConfig(grad_clip=bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="grad_clip"):
        TrainConfig(grad_clip=bad)  # type: ignore[arg-type]


def test_cli_refuses_a_bad_threshold_in_one_line_before_the_victim_is_opened(tmp_path, capsys):
    from stealkit.cli import main

    out = tmp_path / "run"
    victim = tmp_path / "not-a-model"  # exists (a missing path is refused first, when the options are parsed)
    victim.mkdir()
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim), "--budget", "10",
               "--set", "grad_clip=-2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "grad_clip must be a gradient norm >= 0" in err and "not-a-model" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
