"""Report sections of extraction runs: the accuracy curve, and what each family of methods adds to it.

Which kind of run gets which builder is the table in :mod:`stealkit.report.kinds`.
"""

from __future__ import annotations

from typing import Any

from stealkit.report.builders import curve_sections
from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir


def extraction_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """Accuracy and fidelity of the student against the ledger's query count."""
    return curve_sections(summary.get("curve", []), summary.get("victim_accuracy"))


def datafree_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    from stealkit.report.plots import image_grid

    sections = curve_sections(summary.get("curve", []), summary.get("victim_accuracy"))
    losses = summary.get("losses") or []
    if losses:
        keys = [k for k in losses[0] if k.startswith("loss")]
        xs = [r["iteration"] for r in losses]
        uri = line_plot({k: (xs, [r.get(k) for r in losses]) for k in keys}, xlabel="round (iteration)",
                        ylabel="loss")
        sections.append(Section("Losses against rounds", paragraphs=[
            "Mean losses per logged block of iterations (CoDFe Figure 3 plots the substitute's loss)."],
            figures=[Figure(uri, "Training losses against rounds")]))
    samples_path = run.path / "samples.safetensors"
    if samples_path.exists():
        from safetensors.torch import load_file

        samples = load_file(str(samples_path))["samples"].numpy()
        sections.append(Section("Generator samples", paragraphs=[
            "Images from the generator at the end of the attack (DFME appendix C, Figure 7)."],
            figures=[Figure(image_grid(samples, ncols=8), f"{len(samples)} synthetic queries")]))
    timing = {k: summary.get(k) for k in ("iterations", "planned_iterations", "cost_per_iteration", "seconds",
                                          "replayed_queries", "variant") if k in summary}
    if timing:
        sections.append(Section("Run", tables=[("", [timing])]))
    return sections


def surrogate_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    curve = summary.get("curve", [])
    settings = {k: summary.get(k) for k in ("strategy", "mode", "loss", "tau", "schedule", "n_distinct",
                                            "cache_hits")}
    settings |= {k: summary[k] for k in ("select", "ssl", "seconds") if k in summary}  # newer runs only
    sections = [Section("Setting", paragraphs=[
        "Surrogate-data extraction (Truong et al. 2021, appendix A): every distinct image is queried once and "
        "its answer cached; later epochs re-use the cache, so the ledger's count is the number of distinct "
        "images answered."], tables=[("", [settings])])]
    if curve:
        xs = [p["epoch"] for p in curve]
        series = {"accuracy": (xs, [p["accuracy"] for p in curve])}
        if all(p.get("fidelity") is not None for p in curve):
            series["fidelity"] = (xs, [p["fidelity"] for p in curve])
        va = summary.get("victim_accuracy")
        uri = line_plot(series, xlabel="epoch", ylabel="accuracy / fidelity on the test split", ylim=(0, 1.02),
                        hlines={"victim accuracy": va} if va is not None else None)
        sections.append(Section("Training", tables=[("", curve)],
                                figures=[Figure(uri, "Student accuracy and fidelity by epoch (queries fixed)")]))
    if summary.get("knockoff"):
        tr = summary["knockoff"]
        rows = [{"action": a, "queries": q, "final policy": p}
                for a, q, p in zip(tr["actions"], tr["queries_per_action"], tr["final_policy"], strict=False)]
        sections.append(Section("Knockoff Nets policy", tables=[("queries per action (pool class)", rows)]))
    elif len({p.get("queries") for p in curve}) > 1:
        sections += curve_sections(curve, summary.get("victim_accuracy"))
    if summary.get("active"):
        sections.append(_active_section(summary["active"], curve[-1] if curve else None,
                                        summary.get("victim_accuracy")))
    if summary.get("comparison"):
        sections += _comparison_sections(summary["comparison"], summary.get("victim_accuracy"))
    return sections


def _active_section(trace: dict[str, Any], final: dict[str, Any] | None, va: float | None) -> Section:
    """ActiveThief's rounds: what each round queried, and each round's substitute against the queries."""
    scores = list(trace.get("round_scores") or [])
    figures = []
    if scores:
        pts = [(p["queries"], p["accuracy"]) for p in scores]
        if final is not None and final.get("accuracy") is not None:
            pts.append((final["queries"], final["accuracy"]))
        uri = line_plot({"substitute, then final student": ([x for x, _ in pts], [y for _, y in pts])},
                        xlabel="queries (ledger)", ylabel="test accuracy", ylim=(0, 1.02),
                        hlines={"victim accuracy": va} if va is not None else None)
        figures.append(Figure(uri, "Accuracy against queries over the active rounds"))
    return Section(f"Active selection ({trace.get('strategy')})", paragraphs=[
        "Rounds of query, train, select (ActiveThief, Pal et al. AAAI 2020): a random seed set, then each "
        "round's substitute chooses the next images from the unqueried pool. Seconds are wall time per round."],
        tables=[("rounds", trace.get("rounds", [])), ("substitute of each round", scores)], figures=figures)


def _comparison_sections(comparison: dict[str, Any], va: float | None) -> list[Section]:
    """Accuracy against queries of each attack in a side-by-side benchmark (mean over seeds), per answer mode."""
    rows = comparison.get("table", [])
    sections = []
    for mode in sorted({r["mode"] for r in rows}):
        series: dict[str, tuple[list[Any], list[Any]]] = {}
        for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["budget"]):
            xs, ys = series.setdefault(r["attack"], ([], []))
            xs.append(r["budget"])
            ys.append(r["accuracy"])
        uri = line_plot(series, xlabel="queries", ylabel="test accuracy", logx=True, ylim=(0, 1.02),
                        hlines={"victim accuracy": va} if va is not None else None)
        sections.append(Section(f"Against ART ({mode} answers)", paragraphs=[comparison.get("note", "")],
                                tables=[("mean and std over seeds", [r for r in rows if r["mode"] == mode])],
                                figures=[Figure(uri, f"Accuracy against queries, {mode} answers")]))
    return sections


def exact_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    keys = ("variant", "queries", "hidden_found", "lines", "fit_residual", "max_relative_error_test",
            "max_relative_error_uniform", "accuracy", "fidelity", "victim_accuracy")
    row = {k: summary[k] for k in keys if k in summary}
    return [Section("Exact recovery (Milli et al. 2019)", paragraphs=[
        "A functionally equivalent copy: its largest relative logit error against the victim is shown on the "
        "test split and on uniform random pixels; queries are the ledger's counts by kind."],
        tables=[("", [row])])]
