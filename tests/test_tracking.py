"""``--track``: a run's settings, ledger counts and curves reach TensorBoard / MLflow as step-indexed metrics."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from stealkit.cli import main
from stealkit.tracking import curves, flat_settings, scalars


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    out = tmp_path_factory.mktemp("victim")
    train_victim("digits", "mlp2", TrainConfig(epochs=2, batch_size=64, seed=0), out=out, arch_kwargs={"hidden": 8})
    return out


def _extract(victim: Path, out: Path, *extra: str) -> dict:
    assert main(["-q", *extra, "extract", "baseline", "--victim", str(victim), "--budget", "60",
                 "--checkpoints", "30,60", "--student", "mlp2", "--student-arg", "hidden=8", "--epochs", "2",
                 "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def test_curves_and_scalars_read_every_step_indexed_list() -> None:
    summary = {"accuracy": 0.5, "flag": True, "queries": {"predict": 60},
               "curve": [{"queries": 30, "accuracy": 0.4, "fidelity": None}, {"queries": 60, "accuracy": 0.5}],
               "notes": ["x"]}
    assert list(curves(summary)) == [("curve", "accuracy", 30, 0.4), ("curve", "accuracy", 60, 0.5)]
    assert scalars(summary) == {"accuracy": 0.5, "queries.predict": 60.0}
    assert flat_settings({"a": {"b": [1, 2]}}) == {"a.b": "[1, 2]"}


def test_track_tensorboard_logs_the_curve_from_the_ledger(victim: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("STEALKIT_TRACK", raising=False)
    out = tmp_path / "run"
    summary = _extract(victim, out, "--track", "tensorboard")
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    points = events.Scalars("curve/accuracy")
    assert [p.step for p in points] == [p["queries"] for p in summary["curve"]] == [30, 60]
    assert [round(p.value, 4) for p in points] == [round(p["accuracy"], 4) for p in summary["curve"]]
    assert events.Scalars("summary/queries.predict")[0].value == 60


def test_track_mlflow_logs_params_metrics_and_the_report(victim: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list] = {"params": [], "metrics": [], "metric": [], "artifact": []}

    class Active:
        info = types.SimpleNamespace(run_id="abc")

        def __enter__(self) -> Active:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    fake = types.SimpleNamespace(
        start_run=lambda run_name: Active(), log_params=lambda p: calls["params"].append(p),
        log_metrics=lambda m: calls["metrics"].append(m),
        log_metric=lambda k, v, step: calls["metric"].append((k, v, step)),
        log_artifact=lambda path: calls["artifact"].append(path))
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    monkeypatch.delenv("STEALKIT_TRACK", raising=False)
    out = tmp_path / "run"
    summary = _extract(victim, out, "--track", "mlflow")
    assert calls["params"][0]["command"] == "extract baseline" and calls["params"][0]["budget"] == "60"
    assert calls["metrics"][0]["queries.predict"] == 60.0
    steps = [(k, s) for k, _, s in calls["metric"] if k == "curve.accuracy"]
    assert steps == [("curve.accuracy", p["queries"]) for p in summary["curve"]]
    assert calls["artifact"] == [str(out / "report.html")]


def test_track_without_the_package_is_one_clear_line(victim: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import fails
    monkeypatch.delenv("STEALKIT_TRACK", raising=False)
    assert main(["-q", "--track", "mlflow", "extract", "baseline", "--victim", str(victim), "--budget", "30",
                 "--checkpoints", "30", "--student", "mlp2", "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    assert "pip install 'stealkit[track]'" in capsys.readouterr().err
