"""Why does FixMatch help or hurt? Per-epoch trace of the pseudo-labels on the attacker pool (issue 21).

Runs one ``extract_surrogate`` with ``--select random`` and the chosen SSL settings on the validation split of
``benchmarks/surrogate_extraction.py --active --validate`` (the pool's last fifth held out), and after every
epoch records, on the unqueried pool images: the fraction whose student confidence passes the threshold (the
FixMatch mask rate), how many of those pseudo-labels agree with the victim's label (computed without the
ledger, for diagnosis only: the attack never sees it), the class histogram of the confident pseudo-labels, and
the student's validation accuracy. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fixmatch_diagnosis.py --budget 100 --mode label \
        --set fixmatch.threshold=0.95 --set fixmatch.warmup=0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from stealkit.extract.common import make_evaluator, open_victim, pool_holdout, student_factory, victim_splits
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT, SurrogateConfig, extract_surrogate
from stealkit.metrics import predict_labels
from stealkit.settings import apply_settings, parse_value
from stealkit.victims import standard_victim


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", default="fmnist-conv2")
    p.add_argument("--budget", type=int, default=100)
    p.add_argument("--mode", default="label")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--select", default="random")
    p.add_argument("--ssl", default="fixmatch")
    p.add_argument("--set", action="append", default=[], help="a SurrogateConfig setting, e.g. fixmatch.ema=0.99")
    p.add_argument("--every", type=int, default=3, help="trace every so many epochs")
    args = p.parse_args(argv)
    trained = standard_victim(args.victim)
    v = open_victim(trained.path, mode="probs")
    splits = victim_splits(v)
    pool, _, x_val, y_val = pool_holdout(splits.attacker_pool)
    evaluator = make_evaluator(v, x_val, y_val)
    victim_labels = predict_labels(v.model, pool)  # diagnosis only, outside the ledger
    config = SurrogateConfig(max_distinct=args.budget, epochs=args.epochs, batch_size=args.batch_size,
                             select=args.select, ssl=args.ssl, seed=args.seed,  # type: ignore[arg-type]
                             fixmatch=FixMatchConfig(flip=v.dataset in FLIP_INVARIANT))
    config = apply_settings(config, {k: parse_value(v) for k, _, v in (s.partition("=") for s in args.set)},
                            who="diagnosis")
    fm = config.fixmatch
    trace: list[dict[str, Any]] = []
    k = v.num_classes

    def on_epoch(epoch: int, student: nn.Module, rec: dict[str, float]) -> None:
        if epoch % args.every and epoch != args.epochs:
            return
        student.eval()
        with torch.no_grad():
            q = torch.cat([torch.softmax(student(pool[i:i + 1000]), 1) for i in range(0, len(pool), 1000)])
        conf, pseudo = q.max(1)
        keep = conf >= fm.threshold
        right = (pseudo == victim_labels)
        trace.append({"epoch": epoch, "loss": round(rec["loss"], 4), "mask_rate": round(float(keep.float().mean()), 3),
                      "pseudo_agree_kept": round(float(right[keep].float().mean()), 3) if keep.any() else None,
                      "pseudo_agree_all": round(float(right.float().mean()), 3),
                      "kept_per_class": torch.bincount(pseudo[keep], minlength=k).tolist(),
                      "val_accuracy": round(float(evaluator(student)["accuracy"]), 4)})
        print(json.dumps(trace[-1]), file=sys.stderr, flush=True)

    oracle = open_victim(trained.path, mode=args.mode, budget=args.budget).oracle
    t0 = time.perf_counter()
    r = extract_surrogate(oracle, pool, make_student=student_factory("conv2", v, args.seed), config=config,
                          evaluator=evaluator, on_epoch=on_epoch)
    out = {"benchmark": "fixmatch_diagnosis", "victim": args.victim, "budget": args.budget, "mode": args.mode,
           "seed": args.seed, "fixmatch": fm.__dict__, "accuracy": r.accuracy, "fidelity": r.fidelity,
           "queries": r.queries["predict"], "seconds": round(time.perf_counter() - t0, 1),
           "loadavg": list(os.getloadavg()), "torch": torch.__version__, "trace": trace}
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    from stealkit.errors import InputError

    try:
        sys.exit(main())
    except InputError as e:
        sys.exit(f"error: {e}")
