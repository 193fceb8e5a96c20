"""Turn a run directory into ``report.html``: the page frame and the sections every kind of run shares.

Which sections a run gets is decided by one table, :data:`stealkit.report.kinds.BUILDERS`, keyed by the run
kind that ``config.json`` records (its ``command``). ``stealkit report RUN_DIR`` and the run itself both go
through :func:`build_report`, so a re-rendered page is the page the run wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stealkit.report.html import Figure, Section, render_report
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir

SectionBuilder = Callable[[RunDir, dict[str, Any], dict[str, Any]], list[Section]]

#: summary keys shown in the box at the top of every report, in this order, when present
HEADLINE_KEYS = ("method", "victim_accuracy", "accuracy", "fidelity", "queries", "asr", "seed")


def build_sections(run: RunDir) -> list[Section]:
    """The sections of a run's report (without the page frame), e.g. to embed in a combined report."""
    from stealkit.report.kinds import builder_for

    config = run.load_config()
    summary = run.load_summary() if run.summary_path.exists() else {}
    kind = str(config.get("command", ""))
    builder, known = builder_for(kind)
    sections = builder(run, config, summary)
    if not known:
        note = Section("About this page", paragraphs=[
            f"This run's kind ({kind or 'not recorded'}) is not known to this version of stealkit: the generic "
            "page is shown."])
        sections = [note, *sections]
    return sections


def build_report(run: RunDir) -> str:
    """The whole page of a run, with the sections its kind's builder makes."""
    config = run.load_config()
    summary = run.load_summary() if run.summary_path.exists() else {}
    command = str(config.get("command", ""))
    headline = {k: summary[k] for k in HEADLINE_KEYS if k in summary}
    return render_report(f"stealkit {command}", headline or summary, build_sections(run), config=config)


def write_report(run: RunDir) -> None:
    """Build the run's page and write it atomically to ``run.report_path``."""
    run.write_report(build_report(run))


def generic_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """A summary table of the scalar results, and the accuracy curve when the summary has one."""
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
