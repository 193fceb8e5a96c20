"""Sweeps: every point of a grid is an independent trial, run in local processes or as Ray tasks.

Ray is the distributed engine (:mod:`stealkit.raytasks`, shared with ``reproduce`` and the audit; ``--backend
ray``, optionally ``--address`` of an existing cluster); the local backend uses a process pool. Each trial runs single-threaded (``torch.set_num_threads(1)``) with its own
seed, so both backends give identical records for the same grid. Trials are ordinary experiment runs, so a
restarted sweep skips what is finished.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

from stealkit.errors import InputError
from stealkit.experiments.config import ExperimentConfig, parse_config
from stealkit.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)
Backend = Literal["local", "ray"]


def parse_grid(items: tuple[str, ...] | list[str]) -> dict[str, list[Any]]:
    """``["seed=0,1", "steal.budget=100,200"]`` -> ``{"seed": [0, 1], "steal.budget": [100, 200]}``."""
    from stealkit.settings import parse_value as _scalar

    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--grid expects KEY=V1,V2,..., got {item!r}")
        key, values = item.split("=", 1)
        vals = [_scalar(v.strip()) for v in values.split(",") if v.strip()]
        if not vals:
            raise InputError(f"--grid {key} has no values")
        grid[key.strip()] = vals
    return grid


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def trial_name(index: int, values: dict[str, Any]) -> str:
    label = "-".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())
    return f"trial-{index:03d}-" + re.sub(r"[^A-Za-z0-9_.=-]", "_", label)[:80]


def run_trial(config: dict[str, Any], values: dict[str, Any], out: str, device: str | None = None) -> dict[str, Any]:
    """Run one grid point (in whatever process the backend chose); returns its final summary."""
    import os

    import torch

    os.environ.setdefault("STEALKIT_QUIET", "1")
    torch.set_num_threads(1)
    from stealkit.experiments.runner import run_experiment

    cfg = parse_config(config)
    for k, v in values.items():
        cfg = cfg.with_value(k, v)
    outcomes = run_experiment(cfg, out, device=device)
    return {"values": values, "dir": out, "final": outcomes[-1].summary if outcomes else {}}


def run_sweep(config: ExperimentConfig, grid: dict[str, list[Any]], out: str | Path, *, backend: Backend = "local",
              address: str | None = None, workers: int = 2, device: str | None = None) -> list[dict[str, Any]]:
    """Run every grid point of ``config``; writes ``out/sweep.json``; returns the trials in grid order.

    ``device`` goes to every step that takes ``--device`` (a GPU is shared by the trials; on Ray each trial
    asks for ``1/workers`` of a GPU, so Ray makes it visible to the task)."""
    from stealkit.raytasks import check_backend

    check_backend(backend, address)
    if not grid:
        raise InputError("a sweep needs at least one --grid KEY=V1,V2")
    points = expand_grid(grid)
    for values in points:  # validate keys before starting anything
        for k, v in values.items():
            config.with_value(k, v)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(config.to_dict(), values, str(out / trial_name(i, values)), device) for i, values in enumerate(points)]
    if backend == "local":
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx) as pool:
            results = list(pool.map(run_trial, *zip(*jobs, strict=True)))
    elif backend == "ray":
        from stealkit.raytasks import gpu_fraction, run_all

        results = run_all(run_trial, jobs, address=address, workers=workers, gpus=gpu_fraction(device, workers))
    else:
        raise InputError(f"unknown backend {backend!r}; expected local or ray")
    atomic_write_json(out / "sweep.json", {"config": config.to_dict(), "grid": grid, "backend": backend,
                                           "device": device, "trials": results})
    atomic_write_text(out / "report.html", sweep_report(config, grid, results))
    return results


def sweep_report(config: ExperimentConfig, grid: dict[str, list[Any]], trials: list[dict[str, Any]]) -> str:
    """One page for a sweep: a row per trial (its grid values and final scalar results) and, for every curve
    the trials' final summaries hold, all trials on one plot."""
    from stealkit.report.html import Figure, Section, render_report
    from stealkit.report.plots import line_plot

    rows = [{**{f"{k}": v for k, v in t["values"].items()},
             **{k: v for k, v in t["final"].items() if isinstance(v, int | float | str) and not isinstance(v, bool)}}
            for t in trials]
    sections = [Section("Trials", tables=[("one row per grid point (final step's summary)", rows)])]
    for key in ("curve", "extraction", "extraction_label"):
        series = {}
        for t in trials:
            pts = t["final"].get(key)
            if isinstance(pts, list) and pts and isinstance(pts[0], dict) and "queries" in pts[0]:
                label = ", ".join(f"{k}={v}" for k, v in t["values"].items())
                series[f"accuracy {label}"] = ([p["queries"] for p in pts], [p["accuracy"] for p in pts])
        if series:
            xs = [x for v in series.values() for x in v[0]]
            uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="accuracy on the test split",
                            logx=len(set(xs)) > 2 and max(xs) / max(min(xs), 1) >= 10, ylim=(0, 1.02))
            sections.append(Section(f"Every trial's {key}", figures=[Figure(uri, f"{key}, one line per trial")]))
    return render_report(f"stealkit sweep {config.name}", {"trials": len(trials), "grid": grid}, sections,
                         config={"config": {"grid": grid, "experiment": config.to_dict()}})
