"""Runs people can compare: log a finished run directory to TensorBoard or MLflow (``--track``).

What is logged, for every run a command wrote: its settings (flattened ``config.json``), the ledger's query
counts, the scalar results of ``summary.json``, and every curve in it (``curve``, ``extraction``, ... lists of
points with a ``queries`` or ``epoch`` step) as step-indexed metrics, so runs and sweep trials line up in the
tools the field already uses. The run directory stays the source of truth; tracking reads it after the command
has finished. Both back ends are optional extras (``pip install 'stealkit[track]'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stealkit.errors import InputError
from stealkit.rundir import RunDir

BACKENDS = ("tensorboard", "mlflow")
_STEP_KEYS = ("queries", "epoch", "n", "iteration", "step")


def flat_settings(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become their text."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_settings(v, key + "."))
        else:
            out[key] = v if isinstance(v, int | float | str | bool) or v is None else str(v)
    return out


def scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers (nested dicts flattened, e.g. ``queries.predict``), booleans and lists left out."""
    return {k: float(v) for k, v in flat_settings(summary).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def curves(summary: dict[str, Any]) -> Iterator[tuple[str, str, int | float, float]]:
    """``(curve, metric, step, value)`` for every point of every list of step-indexed dicts in the summary."""
    for name, points in summary.items():
        if not isinstance(points, list) or not points or not isinstance(points[0], dict):
            continue
        step_key = next((k for k in _STEP_KEYS if k in points[0]), None)
        if step_key is None:
            continue
        for p in points:
            step = p.get(step_key)
            if not isinstance(step, int | float) or isinstance(step, bool):  # e.g. the audit's per-kind query counts
                continue
            for metric, value in p.items():
                if metric != step_key and isinstance(value, int | float) and not isinstance(value, bool):
                    yield name, metric, step, float(value)


def log_run(run: RunDir, backend: str) -> str:
    """Log one run directory to ``backend``; returns where it went."""
    if backend not in BACKENDS:
        raise InputError(f"unknown tracking back end {backend!r}; choose from {', '.join(BACKENDS)}")
    config = run.load_config()
    summary = run.load_summary() if run.summary_path.exists() else {}
    return (_tensorboard if backend == "tensorboard" else _mlflow)(run, config, summary)


def _tensorboard(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> str:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise InputError("--track tensorboard needs the tensorboard package: pip install 'stealkit[track]'") from None
    log_dir = run.path / "tensorboard"
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        settings = flat_settings({"command": config.get("command"), "seed": config.get("seed"),
                                  **(config.get("config") or {})})
        writer.add_text("settings", "\n".join(f"    {k} = {v}" for k, v in settings.items()))
        for key, value in scalars(summary).items():
            writer.add_scalar(f"summary/{key}", value, 0)
        for name, metric, step, value in curves(summary):
            writer.add_scalar(f"{name}/{metric}", value, int(step))
    finally:
        writer.close()
    return str(log_dir)


def _mlflow(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> str:
    try:
        import mlflow
    except ImportError:
        raise InputError("--track mlflow needs the mlflow package: pip install 'stealkit[track]' (it logs to "
                         "$MLFLOW_TRACKING_URI, by default ./mlruns)") from None
    with mlflow.start_run(run_name=f"{config.get('command')} {run.path.name}") as active:
        params = flat_settings({"command": config.get("command"), "seed": config.get("seed"),
                                **(config.get("config") or {})})
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.log_metrics(scalars(summary))
        for name, metric, step, value in curves(summary):
            mlflow.log_metric(f"{name}.{metric}", value, step=int(step))
        if run.report_path.exists():
            mlflow.log_artifact(str(run.report_path))
        return f"mlflow run {active.info.run_id}"
