"""The student's optimiser in surrogate extraction (``optimizer=sgd|adam``, ``schedule=constant``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from stealkit.settings import apply_settings
from stealkit.train import TrainConfig
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Seen(nn.Module):
    """The victim, keeping every image it was asked about."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.asked = model, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.asked.append(x.clone())
        return self.model(x)


def test_the_default_is_the_attacks_sgd_exactly():
    """What the default trains with is what the attack built before the option existed: SGD one-cycle at 0.1."""
    tc = SurrogateConfig(seed=3).train_config()
    assert tc == TrainConfig(epochs=30, batch_size=128, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4,
                             schedule="onecycle", seed=3)


@pytest.mark.parametrize("settings,optimizer,lr,schedule", [
    ({}, "sgd", 0.1, "onecycle"),
    ({"optimizer": "adam"}, "adam", 1e-3, "onecycle"),
    ({"optimizer": "adam", "lr": 0.01}, "adam", 0.01, "onecycle"),
    ({"optimizer": "adam", "schedule": "constant"}, "adam", 1e-3, "none"),
    ({"lr": 0.03}, "sgd", 0.03, "onecycle"),
])
def test_the_learning_rate_defaults_by_optimiser(settings, optimizer, lr, schedule):
    config = apply_settings(SurrogateConfig(), settings, who="surrogate")
    tc = config.train_config()
    assert (tc.optimizer, tc.learning_rate, tc.schedule) == (optimizer, lr, schedule)
    assert config.peak_lr == lr


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_adam_spends_exactly_the_budget_and_changes_only_training(tiny_model, mode):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    runs: dict[str, list[tuple[torch.Tensor, list[torch.Tensor], int]]] = {}
    for name, settings in (("sgd", {}), ("adam", {"optimizer": "adam"}), ("adam", {"optimizer": "adam"}),
                           ("adam-constant", {"optimizer": "adam", "schedule": "constant"})):
        victim = Seen(tiny_model)
        oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, **settings)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        assert r.extra["optimizer"] == settings.get("optimizer", "sgd")
        assert r.extra["lr"] == (1e-3 if settings else 0.1)
        runs.setdefault(name, []).append((torch.cat([p.flatten() for p in r.student.parameters()]), victim.asked,
                                          r.extra["cache_hits"]))
    (sgd, asked_sgd, hits_sgd), = runs["sgd"]
    (adam, asked_adam, hits_adam), (again, _, _) = runs["adam"]
    (const, asked_const, hits_const), = runs["adam-constant"]
    assert not torch.allclose(sgd, adam) and not torch.allclose(adam, const)  # the student changes
    assert torch.equal(adam, again)  # seeded: bitwise repeatable
    for asked in (asked_adam, asked_const):  # the same images asked, in the same batches: no extra answer
        assert len(asked) == len(asked_sgd) and all(torch.equal(a, b) for a, b in zip(asked, asked_sgd, strict=True))
    assert hits_sgd == hits_adam == hits_const  # and looked up as often from the cache


def test_the_default_run_is_bitwise_the_explicit_sgd_run(tiny_model):
    pool = torch.rand(50, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    params = []
    for settings in ({}, {"optimizer": "sgd", "lr": 0.1, "schedule": "cyclic"}):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode="probs", budget=30)
        config = SurrogateConfig(epochs=2, batch_size=8, seed=4, **settings)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=6), config=config)
        params.append(torch.cat([p.flatten() for p in r.student.parameters()]))
    assert torch.equal(params[0], params[1])


def test_a_bad_optimiser_is_one_input_error():
    with pytest.raises(InputError, match="optimizer"):
        SurrogateConfig(optimizer="rmsprop")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="optimizer"):
        apply_settings(SurrogateConfig(), {"optimizer": "rmsprop"}, who="surrogate")
    with pytest.raises(InputError, match="schedule"):
        SurrogateConfig(schedule="cosine")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="lr"):
        SurrogateConfig(optimizer="adam", lr=0.0)


@pytest.fixture(scope="module")
def victim_dir(tmp_path_factory):
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("victim")
    train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, lr=0.01, seed=0), out=out,
                 arch_kwargs={"hidden": 16})
    return out


@pytest.mark.parametrize("extra,optimizer,lr", [([], "sgd", 0.05), (["--mode", "label"], "sgd", 0.1),
                                                (["--preset", "plain"], "sgd", 0.1),
                                                (["--set", "optimizer=adam"], "adam", 1e-3),
                                                (["--set", "optimizer=adam", "--lr", "0.01"], "adam", 0.01)])
def test_the_cli_records_the_optimiser_in_config_json(victim_dir, tmp_path, extra, optimizer, lr):
    """The default with probability answers (the CLI's default mode) from 10 per class peaks at 0.05 with SGD
    (tenth pass); labels and ``plain`` at SGD's 0.1; Adam at its own 1e-3 unless ``--lr`` says otherwise."""
    from stealkit.cli import main

    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "100", "--epochs", "1",
               "--student", "mlp2", "--student-arg", "hidden=8", "--out", str(out), *extra])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())["config"]["surrogate"]
    assert cfg["optimizer"] == optimizer and SurrogateConfig(optimizer=optimizer, lr=cfg["lr"]).peak_lr == lr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["optimizer"], summary["lr"]) == (optimizer, lr)
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"]


def test_a_bad_optimiser_from_the_cli_is_one_line(victim_dir, tmp_path, capsys):
    from stealkit.cli import main

    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "100",
               "--set", "optimizer=rmsprop", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "optimizer" in err and "sgd" in err and len(err.strip().splitlines()) == 1
