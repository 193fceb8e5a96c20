"""Data-free extraction benchmark: DFME, MAZE, DaST and CoDFe with probability and label access.

Against a standard Fashion-MNIST CNN victim (``fmnist-conv2``, about 0.90 test accuracy, or ``fmnist-cnn4``,
the CoDFe paper's architecture), each method/mode pair runs once to ``--budget`` queries; the student is
scored on the test split at each of ``--marks`` (the first iteration at or past the mark) and the wall time is
recorded. Prints one JSON document to stdout (progress goes to stderr); ``--jsonl`` also appends one line per
finished run so a long benchmark keeps what it measured, and at the end writes its ``.meta.json``
(``benchmarks/rowmeta.py``): the raw rows of docs/results.md's data-free figures.

    .venv/bin/python benchmarks/data_free.py --quick                       # smoke run on digits, ~minutes
    .venv/bin/python benchmarks/data_free.py --budget 2000000              # the full CPU benchmark
    .venv/bin/python benchmarks/data_free.py --preset reference --device cuda   # reference-size generators

``--preset cpu`` (default) shrinks the generators (``ngf`` 16) and the student (conv2 16/32/64) so 2M queries
fit the 2-core budget; ``--preset reference`` keeps every reference default (``ngf`` 64, conv2 32/64/128).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "student": ("conv2", {"c1": 16, "c2": 32, "hidden": 64}),
        "dfme": {"ngf": 16},
        "maze": {"ngf": 16},
        "dast": {"ngf": 16},
        "codfe": {"ngf": 16},
    },
    "reference": {"student": ("conv2", {}), "dfme": {}, "maze": {}, "dast": {}, "codfe": {}},
}


def run_one(victim_name: str, method: str, mode: str, budget: int, marks: list[int], preset: str,
            device: str, seed: int, overrides: dict[str, Any], save_dir: Path | None = None,
            recipe: str = "paper", split: str = "test", points: Path | None = None) -> dict[str, Any]:
    from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
    from stealkit.extract.datafree.loop import LoopConfig
    from stealkit.extract.datafree.recipes import recipe_settings
    from stealkit.extract.registry import METHODS
    from stealkit.victims import standard_victim

    tv = standard_victim(victim_name, device=device)
    v = open_victim(tv.path, mode=mode, budget=budget, device=device, seed=seed)
    splits = victim_splits(v)
    scored = splits.test if split == "test" else splits.attacker_pool  # validation: the attack never sees it
    ev = make_evaluator(v, scored.x, scored.y, device)
    arch, skw = PRESETS[preset]["student"]
    entry = METHODS[method]
    loop = LoopConfig(eval_every=max(marks), eval_at=tuple(marks), checkpoint_every=0, grid_samples=0)
    config = entry.config(seed=seed, loop=loop, **{**PRESETS[preset][method], **recipe_settings(recipe, method, mode),
                                                   **overrides.get(method, {})})
    tag = {"victim": victim_name, "method": method, "mode": mode, "seed": seed, "recipe": recipe, "split": split,
           "preset": preset, "budget": budget}

    def on_point(point: dict[str, Any]) -> None:  # each scored point as it comes: a stopped run keeps its curve
        if points is not None:
            with open(points, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**tag, **point, "load_average": os.getloadavg()}) + "\n")

    start = time.perf_counter()
    result = entry.run(v.oracle, make_student=student_factory(arch, v, seed, **skw), evaluator=ev, config=config,
                       device=device, on_point=on_point)
    wall = time.perf_counter() - start
    cfg_json = json.loads(json.dumps(config, default=lambda o: getattr(o, "__dict__", str(o))))
    student_dir = None
    if save_dir is not None:  # a run directory with the student, e.g. for `stealkit attack study --substitute`
        from stealkit.extract.common import save_extraction
        from stealkit.rundir import RunDir

        run = RunDir(save_dir / f"{method}-{mode}").create(command=f"benchmarks/data_free.py {method}",
                                                             config=cfg_json, seed=seed)
        student_dir = str(save_extraction(run, result, v, student_arch=arch, student_kwargs=skw, seed=seed,
                                          config=cfg_json))
    at = {}
    for m in marks:
        # the first point at or past the mark; the last point stands for a mark the budget's last iteration missed
        pts = [p for p in result.curve if p["queries"] >= min(m, budget - result.extra["cost_per_iteration"] + 1)]
        at[str(m)] = None if not pts or m > budget else {
            "queries": pts[0]["queries"], "accuracy": pts[0]["accuracy"], "fidelity": pts[0]["fidelity"],
            "seconds": pts[0]["seconds"], "best_in_hindsight": pts[0].get("best_in_hindsight", pts[0]["accuracy"]),
            "selection_gap_points": pts[0].get("selection_gap_points", 0.0)}
    record = _per_image(ev, result) if ev is not None and result.accuracy is not None else {}
    best = max(result.curve, key=lambda p: p["accuracy"]) if result.curve else None
    accs = [p["accuracy"] for p in result.curve]
    # the largest fall of the reported student's test accuracy below an earlier point of the curve (points)
    max_drop = max((100 * (max(accs[: i + 1]) - a) for i, a in enumerate(accs)), default=0.0)
    return {
        "victim": victim_name, "method": method, "mode": mode, "variant": result.extra.get("variant", mode),
        "seed": seed, "recipe": recipe, "split": split,
        "victim_accuracy": result.victim_accuracy, "final_accuracy": result.accuracy,
        "final_fidelity": result.fidelity, "queries": result.queries, "at": at,
        "best": None if best is None else {"accuracy": best["accuracy"], "queries": best["queries"]},
        "max_drop_points": round(max_drop, 2), "wall_seconds": round(wall, 1), "queries_per_second": round(result.queries["predict"] / wall, 1),
        "iterations": result.extra["iterations"], "cost_per_iteration": result.extra["cost_per_iteration"],
        "config": cfg_json, "student_dir": student_dir,
        "curve": result.curve, **record,
    }


def _per_image(ev: Any, result: Any) -> dict[str, Any]:
    """Which test images the reported student got right (``benchmarks/evidence.py``), for the paired intervals.
    The student is scored again here (unmetered: the evaluator holds the victim's labels)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from evidence import per_image

    ev(result.student)
    return per_image(ev, result.accuracy)


def goals(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    def ratio(r: dict[str, Any]) -> float:
        return r["final_accuracy"] / r["victim_accuracy"]

    prob = [r for r in runs if r["mode"] != "label"]
    label = [r for r in runs if r["mode"] == "label"]
    out: dict[str, Any] = {"budget": budget}
    if prob:
        b = max(prob, key=ratio)
        out["best_probability"] = {"method": b["method"], "ratio": round(ratio(b), 4), "goal": 0.9,
                                   "met": ratio(b) >= 0.9}
    if label:
        b = max(label, key=ratio)
        out["best_label"] = {"method": b["method"], "ratio": round(ratio(b), 4), "goal": 0.8, "met": ratio(b) >= 0.8}
    for mode in sorted({r["mode"] for r in runs}):
        c = [r for r in runs if r["method"] == "codfe" and r["mode"] == mode]
        d = [r for r in runs if r["method"] == "dast" and r["mode"] == mode]
        if c and d:
            out[f"codfe_vs_dast_{mode}"] = {"codfe": c[0]["final_accuracy"], "dast": d[0]["final_accuracy"],
                                            "codfe_ahead": c[0]["final_accuracy"] > d[0]["final_accuracy"]}
    return out


def aggregate(runs: list[dict[str, Any]], marks: list[int]) -> list[dict[str, Any]]:
    """Mean and std over seeds, per method and mode and mark: accuracy, its ratio to the victim, the
    selected-vs-best-in-hindsight gap (points) and the wall time to the mark."""
    import statistics

    def ms(values: list[float]) -> dict[str, float]:
        return {"mean": round(statistics.fmean(values), 4),
                "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0}

    rows = []
    for key in sorted({(r["method"], r["mode"]) for r in runs}):
        group = [r for r in runs if (r["method"], r["mode"]) == key]
        row: dict[str, Any] = {"method": key[0], "mode": key[1], "seeds": [r["seed"] for r in group],
                               "victim_accuracy": group[0]["victim_accuracy"], "marks": {},
                               "wall_seconds": ms([r["wall_seconds"] for r in group]),
                               "max_drop_points": max(r["max_drop_points"] for r in group)}
        for m in marks:
            pts = [r["at"][str(m)] for r in group if r["at"].get(str(m))]
            if len(pts) == len(group):
                row["marks"][str(m)] = {
                    "accuracy": ms([p["accuracy"] for p in pts]),
                    "ratio": ms([p["accuracy"] / r["victim_accuracy"] for p, r in zip(pts, group, strict=True)]),
                    "selection_gap_points": ms([p["selection_gap_points"] for p in pts]),
                    "seconds": ms([p["seconds"] for p in pts])}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--victim", default="fmnist-conv2", help="standard victim (fmnist-conv2, fmnist-cnn4, ...)")
    ap.add_argument("--methods", default="dfme,maze,dast,codfe")
    ap.add_argument("--modes", default="probs,label")
    ap.add_argument("--budget", type=int, default=2_000_000)
    ap.add_argument("--marks", default="100000,500000,1000000,2000000")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--set", action="append", default=[], metavar="METHOD.KEY=VALUE",
                    help="override one config field, e.g. codfe.noise_set=2000")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (overrides --seed), e.g. 0,1,2")
    ap.add_argument("--recipe", default="paper",
                    help="settings recipe of stealkit.extract.datafree.recipes (paper, or labelonly-v3: the default "
                         "of the extract commands); --set overrides it")
    ap.add_argument("--split", choices=["test", "validation"], default="test",
                    help="score on the test split (report) or the attacker split (validation, to choose settings)")
    ap.add_argument("--jsonl", type=Path, default=None, help="also append each finished run here")
    ap.add_argument("--points", type=Path, default=None,
                    help="also append each scored point of the curve here as it is measured (a stopped run keeps it)")
    ap.add_argument("--save-students", type=Path, default=None, metavar="DIR",
                    help="also save each student as a run directory DIR/METHOD-MODE (for attack study --substitute)")
    ap.add_argument("--quick", action="store_true", help="smoke run: digits-conv2 victim, 20k queries")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("STEALKIT_QUIET", "1")
    if args.quick:
        args.victim, args.budget, args.marks = "digits-conv2", 20_000, "5000,10000,20000"
    load_at_start = os.getloadavg()
    marks = [int(float(m)) for m in args.marks.split(",") if m]
    marks = [m for m in marks if m <= args.budget] or [args.budget]
    overrides: dict[str, dict[str, Any]] = {}
    for item in args.set:
        from stealkit.commands.common import parse_kv

        key, value = item.split("=", 1)
        method, field = key.split(".", 1)
        overrides.setdefault(method, {}).update(parse_kv((f"{field}={value}",)))
    runs = []
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds=seeds, device=args.device, victim=args.victim, split=args.split,
                         data={"test split": rowmeta.victim_test(args.victim)} if args.jsonl else None)
    for method, mode, seed in itertools.product(args.methods.split(","), args.modes.split(","), seeds):
        print(f"running {method} {mode} seed {seed} to {args.budget} queries", file=sys.stderr, flush=True)
        save = args.save_students / f"seed{seed}" if args.save_students and len(seeds) > 1 else args.save_students
        r = run_one(args.victim, method, mode, args.budget, marks, args.preset, args.device, seed, overrides, save,
                    recipe=args.recipe, split=args.split, points=args.points)
        r["config"] = {k: v for k, v in r["config"].items() if k != "loop"}
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}), file=sys.stderr, flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(r) + "\n")
        runs.append(r)
    rowmeta.finish(meta)
    doc = {
        "benchmark": "data_free", "victim": args.victim, "preset": args.preset, "recipe": args.recipe,
        "split": args.split, "seeds": seeds, "budget": args.budget,
        "marks": marks, "device": args.device, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(), "platform": platform.platform(), "torch": torch.__version__,
        "load_average_at_start": load_at_start, "aggregate": aggregate(runs, marks),
        "runs": runs, "goals": goals(runs, args.budget),
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
