"""Queries a conv2 reconstruction needs to reach 0.95x the victim's accuracy: gradients vs membership only.

Milli et al. (FAT* 2019, Sec. 5.1) report 10 gradient queries against 1,000 membership queries for 95% on
MNIST. Victim: the standard conv2 victim (``fmnist-conv2`` by default, or ``digits-conv2``); queries from the
attacker pool; each query count trains a fresh conv2 reconstruction (same class) on l_G + lambda l_M, or on
l_M alone. Prints JSON: both curves and the queries-to-target of each, and their ratio (goal: >= 10x).

    python benchmarks/gradient_matching.py --quick
    python benchmarks/gradient_matching.py --victim fmnist --queries 1,3,10,30,100,300,1000,3000,10000
    python benchmarks/gradient_matching.py --seeds 0,1,2 --queries 10,30,40,100,300,400,500,1000

``--seeds`` repeats the whole measurement per seed (query selection and reconstruction initialisation) and
reports each seed's queries-to-target and ratio, and their minimum and median: one seed cannot separate
ratios whose curves cross the target within a grid step or by less than the seed-to-seed spread.

``--jsonl PATH`` also appends one row per seed and kind (its whole curve, the target and the queries to it) as
soon as it is measured, and writes ``PATH``'s ``.meta.json`` at the end (``benchmarks/rowmeta.py``): the raw rows
``benchmarks/results_tables.py`` regenerates docs/results.md#gradient-matching from.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from stealkit.extract.explanations.gradient_matching import GradMatchConfig
from stealkit.studies.explanations import queries_to_reach, run_curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="digits victim, queries 10,100, 150 steps")
    ap.add_argument("--victim", choices=["fmnist", "digits"], default="fmnist")
    ap.add_argument("--queries", default="1,3,10,30,100,300,1000,3000,10000")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--target", type=float, default=0.95, help="fraction of the victim's accuracy to reach")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma list of seeds (overrides --seed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--jsonl", default=None, help="also append one row per seed and kind to this file (raw rows)")
    args = ap.parse_args()
    if args.quick:
        args.victim, args.queries, args.steps = "digits", "10,100", 150
    logging.basicConfig(level=logging.WARNING)
    dataset = {"fmnist": "fashion-mnist", "digits": "digits"}[args.victim]
    queries = tuple(int(q) for q in args.queries.split(","))
    base = GradMatchConfig(steps=args.steps, lam=args.lam)
    seeds = [int(v) for v in args.seeds.split(",")] if args.seeds else [args.seed]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = None
    if args.jsonl:
        from stealkit.data import load_splits

        meta = rowmeta.start(args.jsonl, seeds=args.seeds or str(args.seed), device=args.device,
                             data={"scored on": load_splits(dataset).test.x}, victim=f"{args.victim}-conv2")
    per_seed = [measure(dataset, queries, base, seed, args) for seed in seeds]
    rowmeta.finish(meta)
    if len(per_seed) == 1:
        print(json.dumps({"benchmark": "gradient_matching", "args": vars(args), **per_seed[0]}, indent=1))
        return
    import os
    import statistics

    ratios = [r["membership_over_gradient_queries"] for r in per_seed]
    known = [r for r in ratios if r]
    print(json.dumps({"benchmark": "gradient_matching", "args": vars(args),
                      "machine": {"cpus": os.cpu_count(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                                  "load_average_end": os.getloadavg()},
                      "seeds": dict(zip(map(str, seeds), per_seed, strict=True)),
                      "ratios": ratios, "ratio_min": min(known) if known else None,
                      "ratio_median": statistics.median(known) if known else None}, indent=1))


def measure(dataset: str, queries: tuple[int, ...], base: GradMatchConfig, seed: int,
            args: argparse.Namespace) -> dict:
    out = {}
    for kind in ("gradient", "membership"):
        cond = {"figure": 2, "dataset": dataset, "victim": "conv2", "student": "conv2", "pool": "pool", "kind": kind}
        row = run_curve(cond, queries, base, seed=seed, device=args.device)
        target = args.target * row["victim_accuracy"]
        out[kind] = {"curve": row["curve"], "victim_accuracy": row["victim_accuracy"], "target": target,
                     "queries_to_target": queries_to_reach(row["curve"], target)}
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"seed": seed, "kind": kind, "dataset": dataset, "steps": base.steps,
                                     "lam": base.lam, "target_fraction": args.target, **out[kind]}) + "\n")
    g, m = out["gradient"]["queries_to_target"], out["membership"]["queries_to_target"]
    ratio = (m / g) if g and m else None
    return {**out, "membership_over_gradient_queries": ratio,
            "note": None if ratio else "a curve never reached the target within the queries run"}


if __name__ == "__main__":
    main()
