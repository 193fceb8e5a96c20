"""Data-free extraction benchmark: DFME, MAZE, DaST and CoDFe with probability and label access.

Against a standard Fashion-MNIST CNN victim (``fmnist-conv2``, about 0.90 test accuracy, or ``fmnist-cnn4``,
the CoDFe paper's architecture), each method/mode pair runs once to ``--budget`` queries; the student is
scored on the test split at each of ``--marks`` (the first iteration at or past the mark) and the wall time is
recorded. Prints one JSON document to stdout (progress goes to stderr); ``--jsonl`` also appends one line per
finished run so a long benchmark keeps what it measured.

    .venv/bin/python benchmarks/data_free.py --quick                       # smoke run on digits, ~minutes
    .venv/bin/python benchmarks/data_free.py --budget 2000000              # the full CPU benchmark
    .venv/bin/python benchmarks/data_free.py --preset reference --device cuda   # reference-size generators

``--preset cpu`` (default) shrinks the generators (``ngf`` 16) and the student (conv2 16/32/64) so 2M queries
fit the 2-core budget; ``--preset reference`` keeps every reference default (``ngf`` 64, conv2 32/64/128).
"""

from __future__ import annotations

import argparse
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
            device: str, seed: int, overrides: dict[str, Any], save_dir: Path | None = None) -> dict[str, Any]:
    from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
    from stealkit.extract.datafree_loop import LoopConfig
    from stealkit.extract.registry import METHODS
    from stealkit.victims import standard_victim

    tv = standard_victim(victim_name, device=device)
    v = open_victim(tv.path, mode=mode, budget=budget, device=device, seed=seed)
    splits = victim_splits(v)
    ev = make_evaluator(v, splits.test.x, splits.test.y, device)
    arch, skw = PRESETS[preset]["student"]
    entry = METHODS[method]
    loop = LoopConfig(eval_every=max(marks), eval_at=tuple(marks), checkpoint_every=0, grid_samples=0)
    config = entry.config(seed=seed, loop=loop, **{**PRESETS[preset][method], **overrides.get(method, {})})
    start = time.perf_counter()
    result = entry.run(v.oracle, make_student=student_factory(arch, v, seed, **skw), evaluator=ev, config=config,
                       device=device)
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
        at[str(m)] = None if not pts or m > budget else {"queries": pts[0]["queries"], "accuracy": pts[0]["accuracy"],
                                                         "fidelity": pts[0]["fidelity"], "seconds": pts[0]["seconds"]}
    best = max(result.curve, key=lambda p: p["accuracy"]) if result.curve else None
    return {
        "victim": victim_name, "method": method, "mode": mode, "variant": result.extra.get("variant", mode),
        "victim_accuracy": result.victim_accuracy, "final_accuracy": result.accuracy,
        "final_fidelity": result.fidelity, "queries": result.queries, "at": at,
        "best": None if best is None else {"accuracy": best["accuracy"], "queries": best["queries"]},
        "wall_seconds": round(wall, 1), "queries_per_second": round(result.queries["predict"] / wall, 1),
        "iterations": result.extra["iterations"], "cost_per_iteration": result.extra["cost_per_iteration"],
        "config": cfg_json, "student_dir": student_dir,
        "curve": result.curve,
    }


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
    ap.add_argument("--jsonl", type=Path, default=None, help="also append each finished run here")
    ap.add_argument("--save-students", type=Path, default=None, metavar="DIR",
                    help="also save each student as a run directory DIR/METHOD-MODE (for attack study --substitute)")
    ap.add_argument("--quick", action="store_true", help="smoke run: digits-conv2 victim, 20k queries")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("STEALKIT_QUIET", "1")
    if args.quick:
        args.victim, args.budget, args.marks = "digits-conv2", 20_000, "5000,10000,20000"
    marks = [int(float(m)) for m in args.marks.split(",") if m]
    marks = [m for m in marks if m <= args.budget] or [args.budget]
    overrides: dict[str, dict[str, Any]] = {}
    for item in args.set:
        from stealkit.commands.common import parse_kv

        key, value = item.split("=", 1)
        method, field = key.split(".", 1)
        overrides.setdefault(method, {}).update(parse_kv((f"{field}={value}",)))
    runs = []
    for method in args.methods.split(","):
        for mode in args.modes.split(","):
            print(f"running {method} {mode} to {args.budget} queries", file=sys.stderr, flush=True)
            r = run_one(args.victim, method, mode, args.budget, marks, args.preset, args.device, args.seed, overrides,
                        args.save_students)
            r["config"] = {k: v for k, v in r["config"].items() if k != "loop"}
            print(json.dumps({k: v for k, v in r.items() if k != "curve"}), file=sys.stderr, flush=True)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(r) + "\n")
            runs.append(r)
    doc = {
        "benchmark": "data_free", "victim": args.victim, "preset": args.preset, "budget": args.budget,
        "marks": marks, "device": args.device, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(), "platform": platform.platform(), "torch": torch.__version__,
        "runs": runs, "goals": goals(runs, args.budget),
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
