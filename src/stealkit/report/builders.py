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
    headline = {k: summary[k] for k in HEADLINE_KEYS if k in summary and not isinstance(summary[k], dict | list)}
    if not headline:
        headline = {k: v for k, v in summary.items() if isinstance(v, int | float | str) and not isinstance(v, bool)}
    return render_report(f"stealkit {command}", headline, build_sections(run), config=config,
                         facts=header_facts(config, summary))


def _setting(config: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` found in the run's settings (top level, or one level down, e.g. ``study``)."""
    settings = config.get("config") or {}
    scopes = [settings, *(v for v in settings.values() if isinstance(v, dict))]
    for name in names:
        for scope in scopes:
            if scope.get(name) not in (None, "", [], {}):
                return scope[name]
    return None


def header_facts(config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """What heads every page: what was attacked, through which access, the ledger against the budget."""
    facts: dict[str, Any] = {}
    victim = _setting(config, "victim", "victims", "model") or summary.get("victim")
    if victim is not None:
        facts["victim"] = victim
    dataset = _setting(config, "dataset", "datasets") or summary.get("dataset")
    if dataset is not None:
        facts["data set"] = dataset
    mode = _setting(config, "mode")
    if mode is not None:
        access = {"label": "labels only", "topk": "top-k labels and scores", "probs": "probabilities",
                  "logits": "logits"}.get(str(mode), str(mode))
        if _setting(config, "explain") or _setting(config, "use_gradients"):
            access += " and explanations"
        facts["access"] = access
    queries = summary.get("queries")
    budget = _setting(config, "budget")
    if isinstance(queries, dict):
        spent = ", ".join(f"{v:,} {k}" for k, v in queries.items() if isinstance(v, int) and v)
        facts["queries (from the ledger)"] = (spent or "none") + (f" of a budget of {budget:,}"
                                                                 if isinstance(budget, int) else "")
    elif isinstance(queries, int):
        facts["queries (from the ledger)"] = f"{queries:,}" + (f" of a budget of {budget:,}"
                                                               if isinstance(budget, int) else "")
    if config.get("device"):
        facts["device"] = config["device"]
    return facts


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
    uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="accuracy / fidelity on the test split",
                    logx=len(xs) > 2 and xs[-1] / max(xs[0], 1) >= 10, hlines=hl, ylim=(0, 1.02))
    return [Section("Accuracy against queries", tables=[("", curve)],
                    figures=[Figure(uri, "Accuracy and fidelity of the extracted model on the test split")])]


def train_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """The training curve (loss, and accuracy where logged, per epoch) and the model's test accuracy."""
    history = summary.get("history") or run.records()
    sections = generic_sections(run, config, {k: v for k, v in summary.items() if k != "history"})
    if history and "epoch" in history[0]:
        xs = [h["epoch"] for h in history]
        series = {k: (xs, [h.get(k) for h in history]) for k in history[0]
                  if k not in ("epoch", "lr") and all(isinstance(h.get(k), int | float) for h in history)}
        if series:
            uri = line_plot(series, xlabel="epoch", ylabel="training loss", fit=True)
            sections.append(Section("Training curve", tables=[("", history)],
                                    figures=[Figure(uri, "Training loss per epoch")]))
    return sections
