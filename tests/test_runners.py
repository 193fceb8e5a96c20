"""Each runner (the typed function a command calls) gives the command's run to the digit: on a tiny digits victim,
the runner and the command at the same seed write the same summary figures and spend the same ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stealkit.cli import main
from stealkit.oracle.victim import Target


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    for name, hidden, seed in (("victim", 16, 0), ("substitute", 8, 1)):
        train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, lr=0.01, seed=seed), out=root / name,
                     arch_kwargs={"hidden": hidden})
    return {"victim": root / "victim", "substitute": root / "substitute"}


def _scrub(value: Any) -> Any:
    """A summary without what differs between two identical runs: paths under the run directory and timings."""
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in ("student_dir", "seconds") and "time" not in k}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _same_run(cli: Path, runner: Path) -> dict[str, Any]:
    a, b = (json.loads((p / "summary.json").read_text()) for p in (cli, runner))
    assert _scrub(a) == _scrub(b)
    ca, cb = (json.loads((p / "config.json").read_text())["config"] for p in (cli, runner))
    assert ca == cb
    return a


def _cli(*args: str) -> None:
    assert main(["-q", *args]) == 0


def test_run_surrogate_is_the_command(models, tmp_path):
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate

    v = str(models["victim"])
    _cli("extract", "surrogate", "--victim", v, "--budget", "30", "--mode", "label", "--epochs", "1", "--student",
         "mlp2", "--student-arg", "hidden=8", "--seed", "2", "--out", str(tmp_path / "cli"))
    run = run_surrogate(Target(v, seed=2), 30, SurrogateOptions(mode="label", epochs=1, student="mlp2",
                                                                 student_kwargs={"hidden": 8}), out=tmp_path / "r")
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.queries == summary["queries"] == {"predict": 30, "explain": 0}
    assert run.preset_resolved == run.config["preset_resolved"] and isinstance(run.student, torch.nn.Module)


@pytest.mark.slow
def test_run_datafree_is_the_command(models, tmp_path):
    from stealkit.extract.datafree.run import DataFreeOptions, run_datafree

    v = str(models["victim"])
    _cli("extract", "dast", "--victim", v, "--budget", "200", "--mode", "label", "--student", "mlp2",
         "--student-arg", "hidden=8", "--batch-size", "20", "--ngf", "4", "--set", "nz=8", "--eval-every", "100",
         "--max-iterations", "2", "--seed", "1", "--out", str(tmp_path / "cli"))
    options = DataFreeOptions(student="mlp2", student_kwargs={"hidden": 8}, batch_size=20, ngf=4,
                              settings={"nz": 8}, eval_every=100, max_iterations=2)
    run = run_datafree("dast", Target(v, seed=1), 200, mode="label", options=options, out=tmp_path / "r")
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.queries == summary["queries"] and run.accuracy is not None


def test_run_gradient_matching_is_the_command(models, tmp_path):
    from stealkit.extract.explanations.run import GradMatchOptions, run_gradient_matching

    v = str(models["victim"])
    _cli("extract", "gradient-matching", "--victim", v, "--budget", "10", "--checkpoints", "5,10", "--student",
         "mlp2", "--student-arg", "hidden=8", "--steps", "20", "--out", str(tmp_path / "cli"))
    run = run_gradient_matching(Target(v), 10, checkpoints=(5, 10), out=tmp_path / "r",
                                options=GradMatchOptions(student="mlp2", student_kwargs={"hidden": 8}, steps=20))
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.queries == summary["queries"] == {"predict": 10, "explain": 10}


def test_run_exact_is_the_command_and_reads_a_given_victims_ledger(models, tmp_path):
    from stealkit.extract.explanations.run import open_exact, run_exact, spec_hidden

    v = str(models["victim"])
    _cli("extract", "exact", "--victim", v, "--out", str(tmp_path / "cli"))
    target = Target(v)
    victim = open_exact(target)
    assert spec_hidden(victim.spec) == 16
    run = run_exact(target, out=tmp_path / "r", victim=victim)
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.victim is victim and run.queries == summary["queries"] == victim.oracle.ledger.as_dict()


@pytest.mark.slow
def test_run_transfer_is_the_command_and_takes_a_module(models, tmp_path):
    from stealkit.evade.run import run_transfer
    from stealkit.models import load_model

    v, s = str(models["victim"]), str(models["substitute"])
    _cli("attack", "fgsm", "--substitute", s, "--victim", v, "--n", "20", "--seed", "3", "--out",
         str(tmp_path / "cli"))
    run = run_transfer(Target(v, seed=3), "fgsm", s, n=20, out=tmp_path / "r")
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.queries == summary["victim_queries"] and run.asr == summary["asr"]
    module = run_transfer(Target(v, seed=3), "fgsm", load_model(s)[0], n=20, out=tmp_path / "m")
    assert (module.queries, module.asr, module.attempts) == (run.queries, run.asr, run.attempts)


def test_run_decision_is_the_command(models, tmp_path):
    from stealkit.evade.run import run_decision

    v = str(models["victim"])
    _cli("attack", "hopskipjump", "--victim", v, "--n", "2", "--budget", "200", "--out", str(tmp_path / "cli"))
    run = run_decision(Target(v), "hopskipjump", n=2, budget=200, out=tmp_path / "r")
    summary = _same_run(tmp_path / "cli", tmp_path / "r")
    assert run.queries == summary["victim_queries"] and run.median_l2 == summary["median_norm_successful"]
    assert json.loads((tmp_path / "r" / "config.json").read_text())["config"]["preset"] == "tuned"


def test_a_module_target_opens_without_a_trace():
    from stealkit.errors import InputError

    target = Target(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), input_shape=(1, 8, 8))
    v = target.open(mode="label", budget=5)
    assert (v.num_classes, v.oracle.ledger.total) == (10, 0) and target.location == "<module Sequential>"
    assert target.with_seed(4).seed == 4
    with pytest.raises(InputError, match="input_shape"):
        Target(torch.nn.Linear(64, 10)).open()
