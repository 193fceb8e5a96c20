"""Report sections of ``stealkit certify`` runs: certified accuracy against radius per bound (Li et al.
Figure 1 for one sigma), abstention, and the per-bound table at the requested radii."""

from __future__ import annotations

from typing import Any

import numpy as np

from stealkit.report.builders import register_builder
from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir


def curve_from_records(records: list[dict[str, Any]], bound: str, grid: np.ndarray) -> list[float]:
    """Certified accuracy at each radius of ``grid`` from ``certify`` records."""
    if not records:
        return [0.0 for _ in grid]
    ok = [(rec["radius"].get(bound), rec["label"] == rec["y"]) for rec in records]
    return [sum(r is not None and good and r >= g for r, good in ok) / len(records) for g in grid]


@register_builder("certify")
def certify_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    records = run.records()
    bounds = summary.get("bounds") or ["cohen", "renyi", "pixeldp"]
    sections = []
    acc = summary.get("certified_accuracy", {})
    if acc:
        rows = [{"bound": b, "abstain": summary.get("abstain_rate", {}).get(b),
                 "median radius": summary.get("median_radius", {}).get(b),
                 **{f"r={r}": v for r, v in acc[b].items()}} for b in bounds if b in acc]
        sections.append(Section(
            "Certified accuracy",
            paragraphs=[f"sigma = {summary.get('sigma')}, n0 = {summary.get('n0')}, n = {summary.get('n')}, "
                        f"alpha = {summary.get('alpha')}, {summary.get('num_images')} images, "
                        f"{summary.get('images_per_second', 0):.2f} images/s. Cohen's radius uses the one-sided "
                        "Clopper-Pearson bound on the top class; Renyi and PixelDP use the simultaneous "
                        f"({summary.get('interval')}) bounds on the top two classes."],
            tables=[("fraction of test images certified correct at each L2 radius", rows)]))
    if records:
        top = max([r for rec in records for r in rec["radius"].values() if r is not None] + [0.5])
        grid = np.linspace(0.0, top * 1.05, 60)
        series = {b: (grid.tolist(), curve_from_records(records, b, grid)) for b in bounds}
        uri = line_plot(series, xlabel="L2 radius", ylabel="certified accuracy", ylim=(0, 1.02))
        sections.append(Section("Certified accuracy against radius",
                                figures=[Figure(uri, "Li et al. Figure 1 for this model and sigma")]))
    return sections


def _acc_plot(series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str) -> str:
    return line_plot(series, xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.02))


@register_builder("certify-study")
def study_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    records = run.records()
    by_part: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_part.setdefault(rec.get("part", ""), []).append(rec)
    sections: list[Section] = []
    for rec in by_part.get("bounds", []):
        facts = {k: v for k, v in rec.items() if k != "part"}
        figs = []
        for curves in by_part.get("bound_curves", []):
            for tag, c in curves["curves"].items():
                series = {k: (c["p1"], v) for k, v in c.items() if k != "p1"}
                uri = line_plot(series, xlabel="p1", ylabel="certified radius (sigma = 1)",
                                title=f"p2 = {'1 - p1' if tag == 'two-class' else '(1 - p1) / 9'}")
                figs.append(Figure(uri, f"Appendix A / Figure 4 analogue, {tag}"))
        sections.append(Section("Bounds over (p1, p2) (Appendix A)", tables=[("lattice comparison", [facts])],
                                figures=figs))
    cert = by_part.get("certify", [])
    study = config.get("config", {}).get("study", {})
    if cert:
        series: dict[str, tuple[list[float], list[float]]] = {}
        rows = []
        for rec in cert:
            grid = np.linspace(0.0, 2.5, 60)
            n = rec["num_images"]
            for b in ("renyi", "cohen", "pixeldp"):
                radii = [r for r in rec["radii_per_image"][b] if r is not None]
                main = rec["method"] == "stability" and rec["sigma"] == study.get("main_sigma")
                if b == "renyi" or main:
                    series[f"{b} {rec['method']} sigma={rec['sigma']:g}"] = (
                        grid.tolist(), [sum(r >= g for r in radii) / n for g in grid])
            rows.append({"model": rec["model"], "natural": rec["natural_accuracy"],
                         **{f"{b} r={r}": v for b in ("renyi", "cohen", "pixeldp")
                            for r, v in rec["certified_accuracy"][b].items()}})
        sections.append(Section("Certified accuracy against radius (Figure 1)", tables=[("", rows)],
                                figures=[Figure(_acc_plot(series, "L2 radius", "certified accuracy"),
                                                "certified accuracy (lower bound on accuracy under any L2 attack)")]))
    if by_part.get("ablation"):
        rows = [{k: v for k, v in r.items() if k != "part"} for r in by_part["ablation"]]
        sections.append(Section("Stability-training ablation", tables=[("certified accuracy by radius", rows)]))
    if by_part.get("table1"):
        rows = [{k: v for k, v in r.items() if k != "part"} for r in by_part["table1"]]
        sections.append(Section("Table 1 analogue", tables=[("", rows)]))
    emp = by_part.get("empirical", [])
    if emp:
        figs = []
        for attack in ("pgd-l2", "pgd-linf", "cw-l2", "boundary"):
            series = {r["model"]: ([row["eps"] for row in r["rows"]], [row["accuracy"] for row in r["rows"]])
                      for r in emp if r["attack"] == attack}
            if series:
                figs.append(Figure(_acc_plot(series, "attack size", "accuracy"), f"{attack} (EOT where noisy)"))
        rows = [{"model": r["model"], "attack": r["attack"], **{f"{row['eps']:g}": row["accuracy"] for row in r["rows"]}}
                for r in emp]
        sections.append(Section("Empirical robustness (Figures 2-3, Appendix D.2)", tables=[("", rows)],
                                figures=figs))
    if by_part.get("soundness"):
        s = summary.get("soundness", {})
        bad = [{k: v for k, v in r.items() if k != "part"} for r in by_part["soundness"] if r["violation"]]
        sections.append(Section("Soundness check", paragraphs=[
            f"{s.get('attacked')} (point, bound) pairs attacked inside their certified radius; "
            f"{s.get('violations')} violations, {s.get('argmax_changed')} arg-max changes, "
            f"{s.get('abstained')} abstentions."], tables=[("violations", bad)] if bad else []))
    return sections
