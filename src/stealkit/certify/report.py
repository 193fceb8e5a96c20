"""Report sections of ``stealkit certify`` runs: certified accuracy against radius per bound (Li et al.
Figure 1 for one sigma), abstention, and the per-bound table at the requested radii."""

from __future__ import annotations

from typing import Any

import numpy as np

from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir


def curve_from_records(records: list[dict[str, Any]], bound: str, grid: np.ndarray) -> list[float]:
    """Certified accuracy at each radius of ``grid`` from ``certify`` records."""
    if not records:
        return [0.0 for _ in grid]
    ok = [(rec["radius"].get(bound), rec["label"] == rec["y"]) for rec in records]
    return [sum(r is not None and good and r >= g for r, good in ok) / len(records) for g in grid]


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
