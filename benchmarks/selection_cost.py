"""What the active selection step costs per round when the pool is larger than the budget (issue 21).

The issue's cost target: at 10k queries the selection step (scoring the pool with the round's substitute,
then uncertainty ranking / k-center greedy) adds at most 20 % to a round's wall time on this machine's CPU.
With the standard 10,000-image attacker pool a 10k budget queries everything and leaves nothing to select, so
the pool here is the victim task's attacker pool *and* the victim's training split (Fashion-MNIST: 60,000
images; the attacker never sees their labels, only the victim's answers through the ledger).

One run of :func:`stealkit.extract.surrogate_data.surrogate.extract_surrogate` per setting, with active rounds
(``ActiveConfig``: 20 % random seed set, 4 rounds, round substitutes trained ``round_epochs`` epochs); the final
student trains ``--epochs`` (1 by default: it is not part of a round and not what is timed). Per round the
trace gives the seconds spent training the substitute, selecting, and querying; the share printed is
``select / (train + select + query)`` over the selection rounds.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/selection_cost.py --budget 10000 \\
        --select kcenter --set active.candidates=0 --set active.candidates=10000

Prints one JSON object: settings, machine (load average, torch), and one row per ``--set`` value. Each row's
``student_digest`` hashes the final student's weights: rows that answered the same images in the same rounds
(e.g. ``--set active.fast_select=false`` and ``=true``, interleaved) have the same digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from typing import Any

import torch

from stealkit.extract.common import open_victim, student_factory, victim_splits
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.settings import apply_settings, parse_value
from stealkit.victims import standard_victim


def one_run(args: argparse.Namespace, setting: str, pool: torch.Tensor, victim_path: str) -> dict[str, Any]:
    v = open_victim(victim_path, mode=args.mode, budget=args.budget)
    config = SurrogateConfig(max_distinct=args.budget, epochs=args.epochs, batch_size=args.batch_size,
                             select=args.select, seed=args.seed)  # type: ignore[arg-type]
    if setting:
        key, _, value = setting.partition("=")
        config = apply_settings(config, {key: parse_value(value)}, who="benchmark")
    t0 = time.perf_counter()
    r = extract_surrogate(v.oracle, pool, make_student=student_factory(args.student, v, args.seed), config=config)
    rounds = r.extra["active"]["rounds"]
    # the same images answered in the same rounds give the same final student: equal digests, equal selections
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in r.student.parameters())).hexdigest()[:16]
    timed = [x for x in rounds if x["round"] > 0]  # round 0 is the random seed set: nothing to select
    train = sum(x["train_seconds"] for x in timed)
    select = sum(x["select_seconds"] for x in timed)
    query = sum(x["query_seconds"] for x in timed)
    return {"setting": setting or "(defaults)", "pool": int(pool.shape[0]), "budget": args.budget,
            "queries": r.queries["predict"], "rounds": rounds, "train_seconds": round(train, 2),
            "select_seconds": round(select, 2), "query_seconds": round(query, 2),
            "select_share": round(select / max(train + select + query, 1e-9), 4),
            "seconds": round(time.perf_counter() - t0, 1), "loadavg_after": list(os.getloadavg()),
            "student_digest": digest}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", default="fmnist-conv2")
    p.add_argument("--budget", type=int, default=10000)
    p.add_argument("--select", default="kcenter", choices=["entropy", "margin", "kcenter", "mix"])
    p.add_argument("--mode", default="probs", choices=["label", "probs"])
    p.add_argument("--student", default="conv2")
    p.add_argument("--epochs", type=int, default=1, help="the final student's epochs (not timed)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[],
                   help="one run per value, e.g. active.candidates=0 (none: one run with the defaults)")
    args = p.parse_args(argv)
    trained = standard_victim(args.victim)
    v = open_victim(trained.path, mode="probs")
    splits = victim_splits(v)
    pool = torch.cat([splits.attacker_pool.x, splits.victim_train.x])
    out: dict[str, Any] = {"benchmark": "selection_cost", "victim": args.victim, "settings": vars(args),
                           "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                                       "torch": torch.__version__, "loadavg_before": list(os.getloadavg())},
                           "rows": [one_run(args, s, pool, str(trained.path)) for s in (args.set or [""])]}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    from stealkit.errors import InputError

    try:
        sys.exit(main())
    except InputError as e:
        sys.exit(f"error: {e}")
