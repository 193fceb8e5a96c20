"""Choose the label-only student selector on the validation split (issue 16, ``docs/label-only.md``).

Selection never changes training (the reported student is a copy), so one CoDFe trajectory per seed is run
with ``labelonly-v1`` at the benchmark's cpu sizes, and several ``StudentSelector`` variants shadow it: each is
fed the same held-out paid answers as the run's own selector and considers the same candidates after every
round. Every 5,000 queries each variant's reported student is scored on the victim's *attacker* split (the
validation split: never the test split), beside the raw student and its EMA. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/label_only_selectors.py --mode label --seed 3 \
        --budget 100000 > runs/val-label-3.json
    PYTHONPATH=src python benchmarks/label_only_selectors.py --summarise runs/val-label-*.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
from stealkit.extract.datafree.codfe import CoDFeAttack, CoDFeConfig
from stealkit.extract.datafree.datafree_loop import LoopConfig, run_datafree
from stealkit.extract.datafree.recipes import recipe_settings
from stealkit.extract.datafree.selection import HeldOutStore, StudentSelector
from stealkit.victims import standard_victim

# name: (which rows the store(s) keep, capacity, margin in standard errors, margin at the end of the budget)
VARIANTS: dict[str, tuple[str, int, float, float]] = {
    "recent5k_m0": ("recent", 5000, 0.0, 0.0), "all5k_m2": ("all", 5000, 2.0, 2.0),
    "all5k_m3": ("all", 5000, 3.0, 3.0), "all5k_m4": ("all", 5000, 4.0, 4.0),
    "all5k_m2to4": ("all", 5000, 2.0, 4.0), "all5k_m2to6": ("all", 5000, 2.0, 6.0),
    "first5k_m2": ("first", 5000, 2.0, 2.0), "first5k_m3": ("first", 5000, 3.0, 3.0),
    "first+all5k_m2": ("first+all", 5000, 2.0, 2.0), "first+recent5k_m2": ("first+recent", 5000, 2.0, 2.0),
}


def make_shadows(make_student, oracle, seed: int,
                 names: list[str]) -> tuple[dict[tuple, HeldOutStore], dict[str, StudentSelector]]:
    """One selector per variant; variants with the same store kind and capacity share it (fed once)."""
    stores: dict[tuple, HeldOutStore] = {}
    shadows: dict[str, StudentSelector] = {}
    for name in names:
        keep, capacity, margin, margin_end = VARIANTS[name]
        selector = StudentSelector(make_student(), capacity, oracle.input_shape, oracle.num_classes, "cpu",
                                   keep=keep, margin=margin, seed=seed, margin_end=margin_end)
        selector.stores = [stores.setdefault((kind, capacity), store)
                           for kind, store in zip(keep.split("+"), selector.stores, strict=True)]
        shadows[name] = selector
    return stores, shadows


def run(mode: str, seed: int, budget: int, every: int, names: list[str]) -> dict:
    torch.set_num_threads(1)
    victim = open_victim(standard_victim("digits-conv2").path, mode=mode, budget=budget, seed=seed)
    validation = victim_splits(victim).attacker_pool
    evaluate = make_evaluator(victim, validation.x, validation.y, "cpu")
    make_student = student_factory("conv2", victim, seed, c1=16, c2=32, hidden=64)
    config = CoDFeConfig(**{**recipe_settings("labelonly-v1", "codfe", mode), "ngf": 16, "seed": seed},
                         loop=LoopConfig(eval_every=10**9, checkpoint_every=0, grid_samples=0))
    stores, shadows = make_shadows(make_student, victim.oracle, seed, names)
    curve: list[dict] = []
    start = time.perf_counter()

    class Shadowed(CoDFeAttack):
        """CoDFe whose held-out rows also reach the shadow stores, and whose candidates the shadows consider."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            own_add = self.selector.add

            def add(x: torch.Tensor, soft: torch.Tensor) -> None:
                own_add(x, soft)
                for store in stores.values():
                    store.add(x, soft)

            self.selector.add = add

        def step(self, query, progress):
            out = super().step(query, progress)
            candidates = self.candidates()
            for selector in shadows.values():
                selector.consider(candidates, progress)
            spent = sum(victim.oracle.ledger.as_dict().values())
            if spent % every == 0:
                point = {"queries": spent, "seconds": round(time.perf_counter() - start, 1),
                         "student": evaluate(self.student)["accuracy"],
                         "ema": evaluate(self.average.module)["accuracy"],
                         "own": evaluate(self.reported())["accuracy"]}
                for name, selector in shadows.items():
                    point[name] = evaluate(selector.snapshot)["accuracy"] if selector.source else point["student"]
                    point[name + "_src"] = selector.source
                curve.append(point)
                print(json.dumps(point), file=sys.stderr, flush=True)
            return out

    attack = Shadowed(input_shape=victim.oracle.input_shape, num_classes=victim.oracle.num_classes,
                      mode=victim.oracle.mode, make_student=make_student, config=config, device="cpu")
    run_datafree(attack, victim.oracle, evaluator=None, loop=config.loop)
    return {"mode": mode, "seed": seed, "budget": budget, "split": "validation (attacker pool)",
            "load_end": os.getloadavg(), "torch": torch.__version__, "curve": curve}


def largest_fall(accs: list[float]) -> float:
    """The largest fall, in points, of a curve below its best earlier value."""
    best, fall = -1.0, 0.0
    for a in accs:
        fall = max(fall, best - a)
        best = max(best, a)
    return round(100 * fall, 1)


def summarise(paths: list[str], marks: tuple[int, ...] = (10_000, 25_000, 50_000, 100_000)) -> dict:
    """Per variant, over the runs in ``paths``: accuracy at each mark (mean over runs), the worst fall at the
    marks and at every scored step from the first mark on (per run), and the mean over those steps."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    names = [n for n in ["student", "ema", "own", *VARIANTS] if all(n in r["curve"][0] for r in runs)]
    out: dict[str, dict] = {}
    for name in names:
        curves = [[pt[name] for pt in r["curve"] if pt["queries"] >= marks[0]] for r in runs]
        at = [[pt[name] for pt in r["curve"] if pt["queries"] in marks] for r in runs]
        out[name] = {
            "marks": [round(sum(c[i] for c in at) / len(at), 3) for i in range(len(marks))],
            "fall_marks": max(largest_fall(c) for c in at),
            "fall_steps_per_seed": {r["seed"]: largest_fall(c) for r, c in zip(runs, curves, strict=True)},
            "mean": round(sum(sum(c) / len(c) for c in curves) / len(curves), 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["label", "probs"], default="label")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--budget", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=5000, help="score every this many queries")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--summarise", nargs="+", metavar="JSON", help="summarise earlier runs' outputs instead")
    args = parser.parse_args()
    if args.summarise:
        print(json.dumps(summarise(args.summarise), indent=1))
        return
    print(json.dumps(run(args.mode, args.seed, args.budget, args.every, args.variants.split(","))))


if __name__ == "__main__":
    main()
