"""The student's SGD in surrogate extraction (DFME A.2): learning rate and schedule (``--lr``, ``--schedule``)."""

from __future__ import annotations

import json

import pytest
import torch

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from stealkit.settings import apply_settings
from stealkit.train import TrainConfig
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_the_default_is_the_attacks_sgd_exactly_at_batch_64():
    """SGD one-cycle at 0.1 (A.2), at the batch every validated default used (64)."""
    tc = SurrogateConfig(seed=3).train_config()
    assert tc == TrainConfig(epochs=30, batch_size=64, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4,
                             schedule="onecycle", seed=3)


@pytest.mark.parametrize("settings,lr,schedule", [
    ({}, 0.1, "onecycle"), ({"lr": 0.03}, 0.03, "onecycle"), ({"schedule": "constant"}, 0.1, "none"),
    ({"schedule": "step", "lr": 0.05}, 0.05, "step")])
def test_the_learning_rate_and_schedule_reach_training(settings, lr, schedule):
    config = apply_settings(SurrogateConfig(), settings, who="surrogate")
    tc = config.train_config()
    assert (tc.optimizer, tc.learning_rate, tc.schedule) == ("sgd", lr, schedule)
    assert config.peak_lr == lr


def test_the_default_run_is_bitwise_the_explicit_sgd_run(tiny_model):
    pool = torch.rand(50, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    params = []
    for settings in ({}, {"lr": 0.1, "schedule": "cyclic"}):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=30)
        config = SurrogateConfig(epochs=2, batch_size=8, seed=4, **settings)  # type: ignore[arg-type]
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=6), config=config)
        params.append(torch.cat([p.flatten() for p in r.student.parameters()]))
    assert torch.equal(params[0], params[1])


def test_bad_training_settings_are_one_input_error():
    with pytest.raises(InputError, match="schedule"):
        SurrogateConfig(schedule="cosine")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="lr"):
        SurrogateConfig(lr=0.0)
    with pytest.raises(InputError, match="optimizer"):  # Adam was measured and not adopted: removed
        apply_settings(SurrogateConfig(), {"optimizer": "adam"}, who="surrogate")


@pytest.fixture(scope="module")
def victim_dir(tmp_path_factory):
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("victim")
    train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, lr=0.01, seed=0), out=out,
                 arch_kwargs={"hidden": 16})
    return out


@pytest.mark.parametrize("extra,lr", [([], 0.05), (["--mode", "label"], 0.1), (["--preset", "paper"], 0.1),
                                      (["--lr", "0.01"], 0.01)])
def test_the_cli_records_the_learning_rate_in_config_json(victim_dir, tmp_path, extra, lr):
    """The default with probability answers (the CLI's default mode) peaks at 0.05; labels and ``paper`` at 0.1;
    an explicit ``--lr`` wins."""
    from stealkit.cli import main

    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "100", "--epochs", "1",
               "--set", "min_steps=0", "--student", "mlp2", "--student-arg", "hidden=8", "--out", str(out), *extra])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())["config"]["surrogate"]
    assert SurrogateConfig(lr=cfg["lr"]).peak_lr == lr and "optimizer" not in cfg
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lr"] == lr
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"]
