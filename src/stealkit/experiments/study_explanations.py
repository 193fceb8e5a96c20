"""Milli et al. (FAT* 2019) Figures 2-4 as our plots: reconstruction accuracy against queries.

* Figure 2 (Sec. 5.1): same model class, attacker-pool queries; membership only vs gradients vs SmoothGrad.
* Figure 3 (Sec. 5.2): unknown model class (logistic <-> mlp2, mlp2 <-> conv2); membership vs gradients.
* Figure 4 (Sec. 5.3): unknown data distribution: Gaussian-noise queries; membership vs gradients.

Victims are the cached standard victims (``digits-*``, ``fmnist-*``). Each point trains a fresh
reconstruction with :func:`~stealkit.extract.gradient_matching.extract_gradient_matching`; query counts come
from the ledger. ``python -m stealkit.experiments.study_explanations --out runs/study-explanations`` writes
``records.jsonl``, ``summary.json`` and ``report.html``; ``--quick`` runs a small grid.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from stealkit.extract.gradient_matching import GradMatchConfig, extract_gradient_matching

log = logging.getLogger(__name__)

QUERIES = (1, 10, 100, 1000, 10_000)
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
    from stealkit.experiments.victims import standard_victim
    from stealkit.metrics import Evaluator, predict_labels
    from stealkit.models import build_model
    from stealkit.oracle import LocalExplanationOracle

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


def report(out: Path, rows: list[dict[str, Any]]) -> None:
    from stealkit.fsutil import atomic_write_text
    from stealkit.report import Section, line_plot, render_report

    sections = []
    for fig in sorted({r["figure"] for r in rows}):
        figs = []
        for ds in sorted({r["dataset"] for r in rows if r["figure"] == fig}):
            for victim, student in sorted({(r["victim"], r["student"]) for r in rows
                                           if r["figure"] == fig and r["dataset"] == ds}):
                sel = [r for r in rows if (r["figure"], r["dataset"], r["victim"], r["student"]) ==
                       (fig, ds, victim, student)]
                series = {r["kind"]: ([p["n"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]])
                          for r in sel}
                uri = line_plot(series=series, xlabel="queries", ylabel="test accuracy", logx=True,
                                hlines={"victim": sel[0]["victim_accuracy"]}, ylim=(0, 1))
                from stealkit.report import Figure

                figs.append(Figure(uri, f"{ds}: victim {victim}, reconstruction {student}"))
        title = {2: "Figure 2: gradients vs membership queries", 3: "Figure 3: unknown model class",
                 4: "Figure 4: Gaussian queries"}[fig]
        sections.append(Section(title, figures=figs))
    atomic_write_text(out / "report.html", render_report("Model reconstruction from explanations", {}, sections,
                                                         config={}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="digits only, queries 1,10,100, 200 steps")
    ap.add_argument("--datasets", default="digits,fashion-mnist")
    ap.add_argument("--archs", default="logistic,mlp2,conv2")
    ap.add_argument("--figures", default="2,3,4")
    ap.add_argument("--queries", default=",".join(map(str, QUERIES)))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    if args.quick:
        args.datasets, args.queries, args.steps = "digits", "1,10,100", 200
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    queries = tuple(int(q) for q in args.queries.split(","))
    base = GradMatchConfig(steps=args.steps)
    rows = []
    conds = conditions(tuple(args.datasets.split(",")), tuple(args.archs.split(",")),
                       tuple(int(f) for f in args.figures.split(",")))
    with open(out / "records.jsonl", "a", encoding="utf-8") as fh:
        for cond in conds:
            row = run_curve(cond, queries, base, seed=args.seed, device=args.device, data_dir=args.data_dir)
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            log.info("%s", json.dumps(row))
    from stealkit.fsutil import atomic_write_json

    atomic_write_json(out / "summary.json", {"args": vars(args), "rows": rows})
    report(out, rows)
    print(json.dumps({"study": "explanations", "out": str(out), "curves": len(rows)}))


if __name__ == "__main__":
    main()
