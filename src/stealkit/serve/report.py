"""Report sections of ``stealkit defences`` runs."""

from __future__ import annotations

from typing import Any

from stealkit.report.builders import register_builder
from stealkit.report.html import Section
from stealkit.rundir import RunDir


@register_builder("defences")
def defence_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    rows = [{k: r[k] for k in ("defence", "served_accuracy", "queries", "extraction_accuracy_mean",
                               "extraction_accuracy_std", "fidelity_mean")} for r in summary.get("rows", [])]
    prada = summary.get("prada") or {}
    return [
        Section("Defences against extraction",
                paragraphs=[f"Victim {summary.get('victim')} (test accuracy {summary.get('victim_accuracy')}); "
                            f"baseline extraction at {summary.get('budget')} queries through each defence."],
                tables=[("served accuracy = top-1 of the defended answer on the test split", rows)]),
        Section("PRADA on the baseline's queries", tables=[("", [prada])] if prada else []),
    ]
