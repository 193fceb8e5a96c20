"""LocalOracle throughput against the bare model forward, batches of 256 Fashion-MNIST images.

The oracle adds input validation (shape, dtype, NaN/Inf, range), ledger accounting and the output mode on top
of the forward pass. Goal: at least 0.9x the bare forward's images/s. Prints JSON. ``--jsonl PATH`` also appends
one raw row per repeat and variant and writes ``PATH``'s ``.meta.json`` at the end (``benchmarks/rowmeta.py``).

    .venv/bin/python benchmarks/oracle_overhead.py [--batches 200] [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--victim", default="fmnist-conv2")
    p.add_argument("--quick", action="store_true", help="smoke run: 20 batches, 2 repeats")
    p.add_argument("--jsonl", default=None, metavar="PATH", help="also append one row per repeat and variant here")
    args = p.parse_args()
    if args.quick:
        args.batches, args.repeats = 20, 2

    from stealkit.data import load_splits
    from stealkit.oracle import LocalOracle
    from stealkit.victims import standard_victim

    victim = standard_victim(args.victim)
    model = victim.model.eval()
    pool = load_splits(victim.spec.extra["dataset"]).attacker_pool.x
    batches = [pool[(i * args.batch_size) % (len(pool) - args.batch_size):][: args.batch_size]
               for i in range(args.batches)]

    def bare(xb: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return torch.softmax(model(xb), dim=1)

    results: dict[str, dict[str, float]] = {}
    modes = ("label", "probs", "logits", "topk")
    oracles = {m: LocalOracle(model, victim.spec.input_shape, mode=m, top_k=3) for m in modes}
    variants = {"bare_forward": bare} | {f"oracle_{m}": oracles[m].query for m in modes}
    for fn in variants.values():  # warm-up (charged to the oracles' ledgers like every other call)
        fn(batches[0])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds="none (no randomness: the first images of the attacker pool)",
                         victim=args.victim, batch_size=args.batch_size, batches=args.batches,
                         data={"queried images": torch.cat(batches)})
    runs: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.repeats):
        seconds = dict.fromkeys(names, 0.0)
        for i, xb in enumerate(batches):
            # every batch goes through every variant, in a rotating order, so a change in machine load
            # during the run hits all variants alike
            k = (i + r) % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                variants[name](xb)
                seconds[name] += time.perf_counter() - t0
        n_images = sum(b.shape[0] for b in batches)
        for name in names:
            runs[name].append(n_images / seconds[name])
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"variant": name, "repeat": r, "images": n_images,
                                         "seconds": seconds[name], "images_per_s": n_images / seconds[name]}) + "\n")
    base = statistics.median(runs["bare_forward"])
    for name, vals in runs.items():
        med = statistics.median(vals)
        results[name] = {"images_per_s_median": round(med, 1), "ratio_to_bare": round(med / base, 3)}
    ledger_ok = all(o.ledger.as_dict()["predict"] == (args.repeats * args.batches + 1) * args.batch_size
                    for o in oracles.values())
    rowmeta.finish(meta, ledger_exact=ledger_ok)
    print(json.dumps({
        "benchmark": "oracle_overhead", "victim": args.victim, "batch_size": args.batch_size,
        "batches": args.batches, "repeats": args.repeats, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(), "results": results,
        "ledger_exact": ledger_ok,
    }, indent=2))


if __name__ == "__main__":
    main()
