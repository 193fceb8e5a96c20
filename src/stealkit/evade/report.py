"""Report sections of ``stealkit attack`` runs (the table of :mod:`stealkit.report.kinds` names them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from stealkit.report.html import Figure, Section
from stealkit.report.plots import image_grid
from stealkit.rundir import RunDir

SUMMARY_KEYS = ("method", "targeted", "asr", "attempts", "successes", "victim_queries", "victim_accuracy",
                "substitute_accuracy", "substitute_agreement", "substitute_success_rate", "mean_norm",
                "success_rate", "median_norm_successful", "queries")


def attack_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    sections: list[Section] = []
    row = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    if row:
        sections.append(Section("Attack success", paragraphs=[
            "ASR = successes / attempts: attempts are the examples the victim classified correctly (and, for "
            "targeted attacks, whose label is not the target); victim queries are read from the oracle's ledger."
        ], tables=[("", [row])]))
    if summary.get("table"):
        sections.append(Section("Attack success rates (%) by substitute", tables=[("", summary["table"])]))
    npz = run.path / "adversarial.npz"
    if npz.exists():
        with np.load(npz) as data:
            idx = np.flatnonzero(data["attempted"])[:10] if "attempted" in data else np.arange(10)
            if idx.size and data["x"].ndim == 2:  # feature vectors in [0, 1]^d: the largest changes, not images
                sections.append(_feature_changes(data["x"][idx], data["x_adv"][idx]))
            elif idx.size:
                grid = np.concatenate([data["x"][idx], data["x_adv"][idx]])
                sections.append(Section("Examples", figures=[Figure(
                    image_grid(grid, ncols=idx.size),
                    "Top row: clean images; bottom row: adversarial examples sent to the victim")]))
    return sections


def _feature_changes(x: np.ndarray, x_adv: np.ndarray) -> Section:
    """Feature-vector examples: per example, the three features changed most (in the mapped [0, 1] units)."""
    rows = []
    for i, (a, b) in enumerate(zip(x, x_adv, strict=True)):
        delta = b - a
        top = np.argsort(-np.abs(delta))[:3]
        rows.append({"example": i, "largest changes (feature: change in [0, 1] units)":
                     ", ".join(f"{int(j)}: {delta[j]:+.3f}" for j in top), "L2": float(np.linalg.norm(delta))})
    return Section("Examples", paragraphs=["Feature vectors: the features each adversarial example moved most, "
                                           "in the [0, 1] units of the feature ranges."], tables=[("", rows)])
