"""Queries a conv2 reconstruction needs to reach 0.95x the victim's accuracy: gradients vs membership only.

Milli et al. (FAT* 2019, Sec. 5.1) report 10 gradient queries against 1,000 membership queries for 95% on
MNIST. Victim: the standard conv2 victim (``fmnist-conv2`` by default, or ``digits-conv2``); queries from the
attacker pool; each query count trains a fresh conv2 reconstruction (same class) on l_G + lambda l_M, or on
l_M alone. Prints JSON: both curves and the queries-to-target of each, and their ratio (goal: >= 10x).

    python benchmarks/gradient_matching.py --quick
    python benchmarks/gradient_matching.py --victim fmnist --queries 1,3,10,30,100,300,1000,3000,10000
"""

from __future__ import annotations

import argparse
import json
import logging

from stealkit.extract.gradient_matching import GradMatchConfig
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
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.quick:
        args.victim, args.queries, args.steps = "digits", "10,100", 150
    logging.basicConfig(level=logging.WARNING)
    dataset = {"fmnist": "fashion-mnist", "digits": "digits"}[args.victim]
    queries = tuple(int(q) for q in args.queries.split(","))
    base = GradMatchConfig(steps=args.steps, lam=args.lam)
    out = {}
    for kind in ("gradient", "membership"):
        cond = {"figure": 2, "dataset": dataset, "victim": "conv2", "student": "conv2", "pool": "pool", "kind": kind}
        row = run_curve(cond, queries, base, seed=args.seed, device=args.device)
        target = args.target * row["victim_accuracy"]
        out[kind] = {"curve": row["curve"], "victim_accuracy": row["victim_accuracy"], "target": target,
                     "queries_to_target": queries_to_reach(row["curve"], target)}
    g, m = out["gradient"]["queries_to_target"], out["membership"]["queries_to_target"]
    ratio = (m / g) if g and m else None
    print(json.dumps({"benchmark": "gradient_matching", "args": vars(args), **out,
                      "membership_over_gradient_queries": ratio,
                      "note": None if ratio else "a curve never reached the target within the queries run"},
                     indent=1))


if __name__ == "__main__":
    main()
