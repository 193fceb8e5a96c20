"""Turn a run directory into ``report.html``. Commands register a builder; others get the generic page.

A builder takes the :class:`~stealkit.rundir.RunDir` and returns sections; the page frame (title, summary
table, configuration) is shared. ``stealkit report RUN_DIR`` re-renders any run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stealkit.report.html import Figure, Section, render_report
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir

SectionBuilder = Callable[[RunDir, dict[str, Any], dict[str, Any]], list[Section]]
_BUILDERS: dict[str, SectionBuilder] = {}

#: summary keys shown in the box at the top of every report, in this order, when present
HEADLINE_KEYS = ("method", "victim_accuracy", "accuracy", "fidelity", "queries", "asr", "seed")


def register_builder(command_prefix: str) -> Callable[[SectionBuilder], SectionBuilder]:
    """Register the section builder for runs whose ``command`` starts with ``command_prefix``."""

    def deco(fn: SectionBuilder) -> SectionBuilder:
        _BUILDERS[command_prefix] = fn
        return fn

    return deco


def _builder(command: str) -> SectionBuilder:
    return next((b for p, b in sorted(_BUILDERS.items(), key=lambda kv: -len(kv[0])) if command.startswith(p)),
                generic_sections)


def build_sections(run: RunDir) -> list[Section]:
    """The sections of a run's report (without the page frame), e.g. to embed in a combined report."""
    config = run.load_config()
    summary = run.load_summary() if run.summary_path.exists() else {}
    return _builder(str(config.get("command", "")))(run, config, summary)


def build_report(run: RunDir) -> str:
    config = run.load_config()
    summary = run.load_summary() if run.summary_path.exists() else {}
    command = str(config.get("command", ""))
    headline = {k: summary[k] for k in HEADLINE_KEYS if k in summary}
    return render_report(f"stealkit {command}", headline or summary, _builder(command)(run, config, summary),
                         config=config)


def generic_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    scalars = {k: v for k, v in summary.items() if isinstance(v, int | float | str) or v is None}
    sections = [Section("Summary", tables=[("", [scalars])])] if scalars else []
    if summary.get("curve"):
        sections.extend(curve_sections(summary["curve"], summary.get("victim_accuracy")))
    return sections


def curve_sections(curve: list[dict[str, Any]], victim_accuracy: float | None, *, label: str = "student") -> list[Section]:
    xs = [p["queries"] for p in curve]
    series = {f"{label} accuracy": (xs, [p["accuracy"] for p in curve])}
    if all(p.get("fidelity") is not None for p in curve):
        series[f"{label} fidelity"] = (xs, [p["fidelity"] for p in curve])
    hl = {"victim accuracy": victim_accuracy} if victim_accuracy is not None else None
    uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="test split",
                    logx=len(xs) > 2 and xs[-1] / max(xs[0], 1) >= 10, hlines=hl, ylim=(0, 1.02))
    return [Section("Accuracy against queries", tables=[("", curve)],
                    figures=[Figure(uri, "Accuracy and fidelity of the extracted model on the test split")])]


@register_builder("extract")
def extraction_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    return curve_sections(summary.get("curve", []), summary.get("victim_accuracy"))
