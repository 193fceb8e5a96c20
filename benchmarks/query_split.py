"""Where HopSkipJump's per-image budget goes: the queries of ``--preset tuned`` split by phase (and by round).

Runs the tuned HopSkipJump (the benchmark's victim, images and settings: ``decision_attacks.py``) on the
validation images with every label query attributed, from the call stack, to the phase that asked it: the
Triangle Attack opening (its noise start, its binary search, its candidates), the re-check of the opening's
points, HopSkipJump's first binary search, the noise tries (one query each) and their binary searches, the
gradient estimates and the semicircle searches (outward tries and bisection), the last two also per round.
The counts are the ledger's (their sum is checked against it).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/query_split.py --n 12 --val 20 --budget 5800
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections import Counter
from typing import Any

import torch

from stealkit.evade.decision_based import decision

#: phases of the Triangle opening, by the function asking (inside ``triangle.py``'s call)
OPENING = {"_iteration": "opening: triangle candidates", "find_starts": "opening: noise start",
           "binary_search": "opening: binary search", "best_of_noise": "opening: noise tries"}
#: HopSkipJump's phases that need no more than the function's name
HSJ = {"_estimate": "estimates", "best_of_noise": "noise tries: one query each",
       "check_starts": "re-check of the opening's points", "find_starts": "noise start"}


def phase(stack: list[inspect.FrameInfo]) -> tuple[str, int | None]:
    """The phase of the query being asked (innermost recognised frame first) and HopSkipJump's round."""
    names = [(f.function, f.filename.rsplit("/", 1)[-1], f.frame) for f in stack]
    rnd = next((int(fr.f_locals["t"]) for fn, file, fr in names if fn == "attack" and "t" in fr.f_locals
                and file == "hopskipjump.py"), None)
    if any(file == "triangle.py" for _, file, _ in names):
        hit = next((OPENING[fn] for fn, _, _ in names if fn in OPENING), None)
        return (hit, None) if hit else ("other", rnd)
    for fn, _file, fr in names:
        if fn == "semicircle_search":
            return ("semicircle: bisection" if "mid" in fr.f_locals else "semicircle: outward"), rnd
        if fn == "binary_search":
            return ("noise tries: binary searches" if any(n == "best_of_noise" for n, _, _ in names)
                    else "first binary search"), None
        if fn in HSJ:
            return HSJ[fn], (rnd if fn == "_estimate" else None)
    return "other", rnd


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, "benchmarks")
    import decision_attacks as bench
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_validation_arguments(p, val=20)
    p.add_argument("--budget", type=int, default=5800)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", default="{}", help="JSON: HopSkipJump settings over the tuned ones")
    args = p.parse_args(argv)
    model, xv, yv = bench.validation_images(args)
    total: Counter[str] = Counter()
    rounds: dict[int, Counter[str]] = {}
    original = decision.LabelAccess.is_adv

    def counted(self: decision.LabelAccess, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        out = original(self, x, owners)
        name, rnd = phase(inspect.stack()[1:])
        total[name] += int(x.shape[0])
        if rnd is not None:
            rounds.setdefault(rnd, Counter())[name] += int(x.shape[0])
        return out

    decision.LabelAccess.is_adv = counted  # type: ignore[method-assign]
    settings = tuned_settings(substitute=False, budgeted=True, shape=tuple(xv.shape[1:])) | json.loads(args.set)
    norms, per, _ = bench.run_stealkit("hsj", model, xv, yv, args.budget, bench.hsj_config(args.seed, **settings),
                                       None)
    n = xv.shape[0]
    assert sum(total.values()) == sum(per)
    out: dict[str, Any] = {"images": n, "budget": args.budget, "settings": settings, "queries": sum(per),
                           "per_image": {k: round(v / n, 1) for k, v in total.most_common()},
                           "share": {k: round(v / sum(per), 4) for k, v in total.most_common()},
                           "per_round_per_image": {r: {k: round(v / n, 1) for k, v in c.items()}
                                                   for r, c in sorted(rounds.items())},
                           "median_l2": float(torch.tensor(norms).median())}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
