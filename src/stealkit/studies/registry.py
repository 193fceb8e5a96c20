"""The registry of studies: name -> module, and :func:`execute`, the one way a study becomes a run directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from stealkit.errors import InputError
from stealkit.report.builders import write_report
from stealkit.rundir import RunDir
from stealkit.studies import (
    codfe_figure2,
    codfe_transfer,
    defences,
    dfme_hypothesis1,
    dfme_logits,
    dfme_table4,
    explanations,
    stn_certify,
)

#: study name -> its module (see :mod:`stealkit.studies` for what every module holds)
STUDIES: Mapping[str, ModuleType] = {m.NAME: m for m in (
    dfme_table4, dfme_logits, dfme_hypothesis1, explanations, codfe_figure2, codfe_transfer, stn_certify, defences)}


def get(name: str) -> ModuleType:
    """The study called ``name``; an unknown name is an error that lists the known ones."""
    if name not in STUDIES:
        raise InputError(f"unknown study {name!r}; known studies: {', '.join(sorted(STUDIES))}")
    return STUDIES[name]


def execute(name: str, config: Any, out: str | Path, *, seed: int | None = None) -> tuple[RunDir, dict[str, Any]]:
    """Run study ``name`` with ``config`` into the run directory ``out``.

    ``config.json`` records the study's run kind and ``{"study": config}``; every record goes to
    ``records.jsonl`` as it is made; then ``summary.json`` and ``report.html`` are written.
    """
    study = get(name)
    if not isinstance(config, study.Config):
        raise InputError(f"study {name} takes a {study.Config.__name__}, got {type(config).__name__}")
    seed = getattr(config, "seed", None) if seed is None else seed
    run = RunDir(out).create(command=study.KIND, seed=seed, config={"study": config})
    summary = study.run(config, on_record=run.append_record)
    run.write_summary(summary)
    write_report(run)
    return run, summary
