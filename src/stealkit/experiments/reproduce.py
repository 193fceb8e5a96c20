"""``stealkit reproduce``: run every paper study at a scale and write one report, the papers beside ours.

The studies are the TOML configs in ``experiments/reproduce/<scale>/`` (``small``: CPU scale, all of it within
90 minutes on 2 cores; ``full``: the papers' own settings, for GPUs and clusters). Each config's ``paper``
table lists the results it reproduces::

    [[paper.rows]]
    result = "CoDFe substitute accuracy, MNIST, probabilities"
    paper = "91%"
    ours = "final.accuracy"        # a dotted path into the last step's summary.json
    settings = "digits, 200k queries"

A restarted reproduction skips every finished step (see :mod:`stealkit.experiments.runner`).
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.experiments.config import ExperimentConfig, load_config
from stealkit.experiments.runner import run_experiment
from stealkit.fsutil import atomic_write_json, atomic_write_text
from stealkit.rundir import RunDir, environment

log = logging.getLogger(__name__)
SCALES = ("small", "full")


def config_paths(scale: str) -> list[Path]:
    if scale not in SCALES:
        raise InputError(f"unknown scale {scale!r}; expected one of {SCALES}")
    root = resources.files("stealkit.experiments") / "reproduce" / scale
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml"))


def lookup(summary: dict[str, Any], path: str) -> Any:
    """``lookup({"a": [{"b": 1}]}, "a.0.b") == 1``; ``None`` when the path is absent."""
    node: Any = summary
    for part in path.removeprefix("final.").split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def reproduce(scale: str, out: str | Path, *, only: tuple[str, ...] = (), force: bool = False) -> dict[str, Any]:
    out = Path(out)
    configs = [load_config(p) for p in config_paths(scale)]
    if only:
        unknown = set(only) - {c.name for c in configs}
        if unknown:
            raise InputError(f"unknown studies {sorted(unknown)}; available: {[c.name for c in configs]}")
        configs = [c for c in configs if c.name in only]
    t0 = time.perf_counter()
    studies = []
    for cfg in configs:
        s0 = time.perf_counter()
        outcomes = run_experiment(cfg, out / cfg.name, force=force)
        final = outcomes[-1].summary
        studies.append({
            "name": cfg.name,
            "description": cfg.description,
            "dir": str(out / cfg.name),
            "seconds": round(time.perf_counter() - s0, 1),
            "step_seconds": {o.id: round(o.seconds, 1) for o in outcomes},
            "queries": final.get("queries"),
            "rows": [{**row, "ours": _fmt_ours(lookup(final, str(row.get("ours", ""))), row)}
                     for row in cfg.paper.get("rows", [])],
            "final_step": str(outcomes[-1].out),
        })
    summary = {"scale": scale, "wall_seconds": round(time.perf_counter() - t0, 1), "studies": studies,
               "stealkit_version": __version__, **environment()}
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "report.html", render(summary, configs))
    return summary


def _fmt_ours(value: Any, row: dict[str, Any]) -> Any:
    if isinstance(value, float) and row.get("percent", True) and 0 <= value <= 1:
        return f"{100 * value:.1f}%"
    return value


def render(summary: dict[str, Any], configs: list[ExperimentConfig]) -> str:
    from stealkit.report.builders import build_sections
    from stealkit.report.html import Section, render_report

    top_rows = []
    sections: list[Section] = []
    for study in summary["studies"]:
        for row in study["rows"]:
            top_rows.append({"study": study["name"], "result": row.get("result"), "paper": row.get("paper"),
                             "ours": row.get("ours"), "settings": row.get("settings", "")})
        head = Section(
            study["name"],
            paragraphs=[study["description"] or "",
                        f"Wall time {study['seconds']} s (steps: {study['step_seconds']}); "
                        f"queries {study['queries']}; run directory <code>{study['dir']}</code>."],
            tables=[("The paper beside ours", [{k: r.get(k) for k in ("result", "paper", "ours", "settings")}
                                                for r in study["rows"]])] if study["rows"] else [],
        )
        sections.append(head)
        try:
            for sec in build_sections(RunDir(study["final_step"])):
                sec.title = f"{study['name']}: {sec.title}"
                sections.append(sec)
        except Exception as exc:  # a study's own report must not break the combined one
            log.warning("could not build the sections of %s: %s", study["name"], exc)
    overview = Section("Overview", paragraphs=[
        f"Scale <b>{summary['scale']}</b>, total wall time {summary['wall_seconds']} s, "
        f"commit <code>{summary.get('git_commit')}</code>, torch {summary.get('torch')}, "
        f"{summary.get('threads')} threads."], tables=[("Every paper result beside ours", top_rows)])
    headline = {"studies": len(summary["studies"]), "wall_seconds": summary["wall_seconds"],
                "scale": summary["scale"]}
    return render_report("stealkit reproduce", headline, [overview, *sections])
