"""Milli et al. (FAT* 2019) Figures 2-4 as our plots: reconstruction accuracy against queries.

* Figure 2 (Sec. 5.1): same model class, attacker-pool queries; membership only vs gradients vs SmoothGrad.
* Figure 3 (Sec. 5.2): unknown model class (logistic <-> mlp2, mlp2 <-> conv2); membership vs gradients.
* Figure 4 (Sec. 5.3): unknown data distribution: Gaussian-noise queries; membership vs gradients.

Victims are the cached standard victims (``digits-*``, ``fmnist-*``). Each point trains a fresh
reconstruction with :func:`~stealkit.extract.explanations.gradient_matching.extract_gradient_matching`; query counts come
from the ledger. ``stealkit study explanations --out runs/study-explanations`` writes ``config.json``,
``records.jsonl``, ``summary.json`` and ``report.html``; ``--quick`` runs a small grid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from stealkit.errors import InputError
from stealkit.extract.explanations.gradient_matching import GradMatchConfig, extract_gradient_matching
from stealkit.report import Section
from stealkit.rundir import RunDir

log = logging.getLogger(__name__)

NAME = "explanations"
KIND = "study explanations"
SOURCE = "Milli et al. (FAT* 2019), Section 5, Figures 2-4"

QUERIES = (1, 10, 100, 1000, 10_000)
#: Milli et al. Figure 2 (MNIST, conv net): queries each kind needs to reach 0.95x the victim's accuracy
PAPER_FIGURE2_QUERIES = {"paper: gradients (MNIST)": 10, "paper: membership (MNIST)": 1000}
PAPER = {"figure2_queries_to_0.95x_victim": PAPER_FIGURE2_QUERIES}
PREFIX = {"digits": "digits", "fashion-mnist": "fmnist"}
CROSS = (("logistic", "mlp2"), ("mlp2", "logistic"), ("mlp2", "conv2"), ("conv2", "mlp2"))


def conditions(datasets: tuple[str, ...], archs: tuple[str, ...], figures: tuple[int, ...]) -> list[dict[str, Any]]:
    """The grid: one dict per curve (figure, data set, victim/student, query source, query type)."""
    out: list[dict[str, Any]] = []
    for ds in datasets:
        if 2 in figures:
            out += [dict(figure=2, dataset=ds, victim=a, student=a, pool="pool", kind=k)
                    for a in archs for k in ("membership", "gradient", "smoothgrad")]
        if 3 in figures:
            out += [dict(figure=3, dataset=ds, victim=v, student=s, pool="pool", kind=k)
                    for v, s in CROSS if v in archs and s in archs for k in ("membership", "gradient")]
        if 4 in figures:
            out += [dict(figure=4, dataset=ds, victim=a, student=a, pool="gaussian", kind=k)
                    for a in archs for k in ("membership", "gradient")]
    return out


def run_curve(cond: dict[str, Any], queries: tuple[int, ...], base: GradMatchConfig, *, seed: int = 0,
              device: str = "cpu", data_dir: str | None = None) -> dict[str, Any]:
    """Train reconstructions at each query count for one condition; returns the curve and the victim accuracy."""
    from stealkit.data import load_query_source, load_splits
    from stealkit.metrics import Evaluator, predict_labels
    from stealkit.models import build_model
    from stealkit.oracle import LocalExplanationOracle
    from stealkit.victims import standard_victim

    trained = standard_victim(f"{PREFIX[cond['dataset']]}-{cond['victim']}", data_dir=data_dir, device=device)
    splits = load_splits(cond["dataset"], data_dir=data_dir)
    test_x, test_y = splits.test.x, splits.test.y
    evaluator = Evaluator(test_x, test_y, predict_labels(trained.model, test_x, device=device), device=device)
    shape = tuple(splits.test.input_shape)
    pool = load_query_source(cond["pool"], input_shape=shape, n=max(queries), seed=seed, data_dir=data_dir,
                             victim_dataset=cond["dataset"])
    sigma = float(splits.attacker_pool.x.std())
    config = replace(base, use_gradients=cond["kind"] != "membership",
                     explanation="smoothgrad" if cond["kind"] == "smoothgrad" else "gradient",
                     smooth_sigma=sigma, seed=seed)
    oracle = LocalExplanationOracle(trained.model, shape, mode="probs", device=device, seed=seed)

    def make() -> torch.nn.Module:
        return build_model(cond["student"], input_shape=shape, num_classes=splits.test.num_classes)

    result = extract_gradient_matching(oracle, pool, make_student=make, evaluator=evaluator, config=config,
                                       checkpoints=queries, device=device)
    return {**cond, "victim_accuracy": evaluator.victim_accuracy,
            "curve": [{"n": p["n"], "accuracy": p["accuracy"], "fidelity": p["fidelity"],
                       "queries_predict": p["queries_predict"], "queries_explain": p["queries_explain"]}
                      for p in result.curve]}


def queries_to_reach(curve: list[dict[str, Any]], target: float) -> int | None:
    """The smallest query count whose reconstruction reaches ``target`` accuracy (None if none does)."""
    return next((int(p["n"]) for p in curve if p["accuracy"] >= target), None)


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    from stealkit.report import Figure, line_plot

    rows = summary.get("rows", [])
    sections = [Section("Queries to reach 0.95x the victim", tables=[("", summary.get("reach", []))])]
    for fig in sorted({r["figure"] for r in rows}):
        figs = []
        for ds in sorted({r["dataset"] for r in rows if r["figure"] == fig}):
            for victim, student in sorted({(r["victim"], r["student"]) for r in rows
                                           if r["figure"] == fig and r["dataset"] == ds}):
                sel = [r for r in rows if (r["figure"], r["dataset"], r["victim"], r["student"]) ==
                       (fig, ds, victim, student)]
                series = {r["kind"]: ([p["n"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]])
                          for r in sel}
                paper = PAPER_FIGURE2_QUERIES if (fig, victim, student) == (2, "conv2", "conv2") else None
                uri = line_plot(series=series, xlabel="queries", ylabel="test accuracy", logx=True,
                                hlines={"victim": sel[0]["victim_accuracy"]}, ylim=(0, 1), vlines=paper)
                figs.append(Figure(uri, f"{ds}: victim {victim}, reconstruction {student}"))
        title = {2: "Figure 2: gradients vs membership queries", 3: "Figure 3: unknown model class",
                 4: "Figure 4: Gaussian queries"}[fig]
        sections.append(Section(title, figures=figs))
    return sections


@dataclass(frozen=True)
class ExplanationsConfig:
    """The grid of Figures 2-4: data sets, victim architectures, figures, query counts, training steps."""

    datasets: tuple[str, ...] = ("digits", "fashion-mnist")
    archs: tuple[str, ...] = ("logistic", "mlp2", "conv2")
    figures: tuple[int, ...] = (2, 3, 4)
    queries: tuple[int, ...] = QUERIES
    steps: int = 600
    seed: int = 0
    device: str = "cpu"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.datasets) - set(PREFIX)
        if unknown or not self.datasets:
            raise InputError(f"unknown data sets {sorted(unknown)}; choose from {sorted(PREFIX)}")
        if not set(self.figures) <= {2, 3, 4} or not self.figures:
            raise InputError(f"figures must be some of 2, 3, 4, got {self.figures}")


Config = ExplanationsConfig


def run(config: ExplanationsConfig, *, on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every curve of Figures 2-4 for the grid, and the queries each needs to reach 0.95x the victim."""
    base = GradMatchConfig(steps=config.steps)
    rows = []
    for cond in conditions(config.datasets, config.archs, config.figures):
        row = run_curve(cond, config.queries, base, seed=config.seed, device=config.device, data_dir=config.data_dir)
        rows.append(row)
        if on_record is not None:
            on_record(row)
        log.info("figure %s %s %s->%s %s: %s", cond["figure"], cond["dataset"], cond["victim"], cond["student"],
                 cond["kind"], [round(p["accuracy"], 3) for p in row["curve"]])
    reach = []
    for r in rows:
        target = 0.95 * r["victim_accuracy"]
        reach.append({"figure": r["figure"], "dataset": r["dataset"], "victim": r["victim"], "student": r["student"],
                      "pool": r["pool"], "kind": r["kind"], "target": target,
                      "queries_to_reach": queries_to_reach(r["curve"], target)})
    return {"rows": rows, "reach": reach, "seed": config.seed}
