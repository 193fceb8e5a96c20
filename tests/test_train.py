from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.train import TrainConfig, fit, make_optimizer, make_scheduler


def test_step_schedule_decays_at_30_60_80_percent():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = make_optimizer([p], TrainConfig(optimizer="sgd", lr=0.1))
    sched = make_scheduler(opt, "step", 100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[29] == pytest.approx(0.1)
    assert lrs[30] == pytest.approx(0.02) and lrs[60] == pytest.approx(0.004) and lrs[80] == pytest.approx(0.0008)


def test_onecycle_peaks_at_max_lr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = make_optimizer([p], TrainConfig(optimizer="sgd", lr=0.1))
    sched = make_scheduler(opt, "onecycle", 50)
    lrs = []
    for _ in range(50):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(lrs) == pytest.approx(0.1, rel=1e-3) and lrs[0] < 0.01 and lrs[-1] < 0.01


@pytest.mark.slow
def test_fit_learns_and_is_deterministic(tiny_model):
    from tests.conftest import TinyNet

    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, 4, 4, generator=g)
    y = (x.flatten(1).mean(1) > 0.5).long()
    cfg = TrainConfig(epochs=15, batch_size=32, seed=1)
    a, b = TinyNet(num_classes=2), TinyNet(num_classes=2)
    ha = fit(a, x, y, cfg)
    fit(b, x, y, cfg)
    assert ha[-1]["loss"] < ha[0]["loss"]
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("kw", [{"epochs": 0}, {"optimizer": "rmsprop"}, {"schedule": "linear"}, {"noise_sigma": -1}])
def test_bad_config(kw):
    with pytest.raises(InputError):
        TrainConfig(**kw)


def test_empty_data_refused(tiny_model):
    with pytest.raises(InputError, match="no training data"):
        fit(tiny_model, torch.empty(0, 1, 4, 4), torch.empty(0, dtype=torch.long), TrainConfig())
