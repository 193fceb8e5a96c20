"""Why does the KL temperature collapse some students? Per-epoch and per-step trace of one training (issue 21).

Runs one ``extract_surrogate`` of ``benchmarks/surrogate_extraction.py --active --validate`` (the pool's last fifth
held out, scored there), the default preset resolved for the budget plus the ``--set`` values (e.g. ``tau=2
--set lr=0.05``), and records: per step, the gradient norm of the student's parameters (all layers together)
and the learning rate; per epoch, the mean training loss, the validation accuracy, the answered images' top-1
agreement with the victim and the student's mean top-1 probability on them, and the largest step gradient
norm of the epoch. The victim's answers on the answered images are recomputed outside the ledger, for
diagnosis only (the attack never sees them twice). The trace hooks read gradients only: the student trained is
the benchmark row's, bitwise (its final accuracy is printed to check). Prints one JSON object. Since the tenth
pass the default resolved for ``--mode probs`` from 10 answers per class already has ``tau=2``, ``lr=0.05`` and
``grad_clip=5``; the default the tenth pass's diagnosis traced is ``--set tau=1 --set lr=0.1 --set grad_clip=0``.
The trace is of the plain path (the first ``budget`` images of the seed's shuffle, one training): a default that
selects by margin (from 20 answers per class) is run with ``select=random`` here, and the output says so.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tau_diagnosis.py --victim digits-conv2 --budget 100 \
        --mode probs --seed 3 --set tau=2 --set lr=0.05
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from stealkit.extract.common import make_evaluator, open_victim, pool_holdout, student_factory, victim_splits
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT, SurrogateConfig, extract_surrogate
from stealkit.extract.surrogate_data.surrogate_presets import DEFAULT_PRESET, resolve_preset
from stealkit.settings import apply_settings, parse_value
from stealkit.victims import standard_victim


def with_grad_norms(make_student: Callable[[], nn.Module], steps: list[float]) -> Callable[[], nn.Module]:
    """``make_student`` whose students append each backward pass's gradient norm (all trainable parameters
    together, before any clipping) to ``steps``. Tensor hooks only read the gradients: training is unchanged."""

    def make() -> nn.Module:
        student = make_student()
        params = [q for q in student.parameters() if q.requires_grad]
        pending: list[float] = []

        def hook(grad: torch.Tensor) -> None:
            pending.append(float(grad.detach().pow(2).sum()))
            if len(pending) == len(params):
                steps.append(sum(pending) ** 0.5)
                pending.clear()

        for q in params:
            q.register_hook(hook)
        return student

    return make


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", default="digits-conv2")
    p.add_argument("--budget", type=int, default=100)
    p.add_argument("--mode", default="probs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--set", action="append", default=[], help="a SurrogateConfig setting, e.g. tau=2")
    args = p.parse_args(argv)
    trained = standard_victim(args.victim)
    v = open_victim(trained.path, mode="probs")
    splits = victim_splits(v)
    pool, _, x_val, y_val = pool_holdout(splits.attacker_pool)
    evaluator = make_evaluator(v, x_val, y_val)
    combo = resolve_preset(DEFAULT_PRESET, args.budget, v.num_classes, mode=args.mode)[1]
    config = SurrogateConfig(max_distinct=args.budget, epochs=args.epochs, batch_size=args.batch_size,
                             fixmatch=FixMatchConfig(flip=v.dataset in FLIP_INVARIANT), seed=args.seed)
    config = apply_settings(config, {**combo, **{k: parse_value(x) for k, _, x in (s.partition("=") for s in args.set)}},
                            who="diagnosis")
    forced_random = config.select != "random"  # rounds would train substitutes and answer other images
    config = apply_settings(config, {"select": "random"}, who="diagnosis")
    # the plain attack's answered images: the first `budget` of the seed's shuffle of the pool
    answered = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(args.seed))[:args.budget]]
    with torch.no_grad():
        victim_top1 = v.model(answered).argmax(1)  # diagnosis only, outside the ledger

    steps: list[float] = []
    make_student = with_grad_norms(student_factory("conv2", v, args.seed), steps)
    trace: list[dict[str, Any]] = []

    def on_epoch(epoch: int, student: nn.Module, rec: dict[str, float]) -> None:
        student.eval()
        with torch.no_grad():
            q = torch.softmax(student(answered), 1)
        per_epoch = len(steps) // epoch
        last = steps[(epoch - 1) * per_epoch:]
        trace.append({"epoch": epoch, "loss": round(rec["loss"], 4), "lr": round(rec["lr"], 5),
                      "grad_norm_max": round(max(last), 3) if last else None,
                      "grad_norm_mean": round(sum(last) / len(last), 3) if last else None,
                      "train_agree": round(float((q.argmax(1) == victim_top1).float().mean()), 3),
                      "train_top1_prob": round(float(q.max(1).values.mean()), 3),
                      "val_accuracy": round(float(evaluator(student)["accuracy"]), 4)})
        print(json.dumps(trace[-1]), file=sys.stderr, flush=True)

    oracle = open_victim(trained.path, mode=args.mode, budget=args.budget).oracle
    t0 = time.perf_counter()
    r = extract_surrogate(oracle, pool, make_student=make_student, config=config, evaluator=evaluator,
                          on_epoch=on_epoch)
    out = {"benchmark": "tau_diagnosis", "victim": args.victim, "budget": args.budget, "mode": args.mode,
           "seed": args.seed, "settings": args.set, "select_forced_random": forced_random, "accuracy": r.accuracy, "fidelity": r.fidelity,
           "queries": r.queries["predict"], "seconds": round(time.perf_counter() - t0, 1),
           "loadavg": list(os.getloadavg()), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "step_grad_norms": [round(s, 3) for s in steps], "trace": trace}
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    from stealkit.errors import InputError

    try:
        sys.exit(main())
    except InputError as e:
        sys.exit(f"error: {e}")
