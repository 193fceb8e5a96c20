"""Where the active selection step's time goes: the scoring forward and k-center greedy (issue 21, sixth pass).

The selection step of a round (``stealkit.extract.surrogate_data.active``) scores the candidates and the answered images with
the round's substitute (softmax + penultimate features) and runs k-center greedy. This times, interleaved in
one process on the same inputs (a seeded conv2 student, random 28x28 images, the CPU forward chunk):

* the scoring forward: plain (``fast=False``), ``fast=True`` (2x2 max-pooling as strided maxima,
  :func:`stealkit.extract.surrogate_data.active.max_2x2`) and, for reference only, the whole forward in channels-last memory
  layout (model and input converted; faster still but not bitwise equal, so not used);
* k-center greedy picking ``--picks`` of ``--candidates`` candidates against ``--answered`` centres: plain
  (one ``cdist`` per pick) and ``fast`` (:func:`stealkit.extract.surrogate_data.active.distances_to_row`).

It also reports whether the fast outputs are bitwise equal to the plain ones and the largest difference of the
channels-last forward.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/scoring_forward.py

Prints one JSON object: settings, machine (load average, torch), seconds per repetition of each variant.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from stealkit.extract.surrogate_data.active import kcenter_greedy, probs_and_features
from stealkit.models.zoo import conv2


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return round(time.perf_counter() - t0, 3), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", type=int, default=10_000)
    p.add_argument("--answered", type=int, default=6_000)
    p.add_argument("--picks", type=int, default=2_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = conv2((1, 28, 28), 10)
    x = torch.rand(args.candidates + args.answered, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    out: dict[str, Any] = {"benchmark": "scoring_forward", "settings": vars(args),
                           "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                                       "torch": torch.__version__, "loadavg_before": list(os.getloadavg())}}
    times: dict[str, list[float]] = {}
    results: dict[str, Any] = {}
    variants: dict[str, Callable[[], Any]] = {
        "forward_plain": lambda: probs_and_features(model, x),
        "forward_fast": lambda: probs_and_features(model, x, fast=True),
        "forward_channels_last": lambda: probs_and_features(model_cl, x_cl),
    }
    for _ in range(args.repeats):
        for name, fn in variants.items():
            s, results[name] = timed(fn)
            times.setdefault(name, []).append(s)
    plain, fast, cl = results["forward_plain"], results["forward_fast"], results["forward_channels_last"]
    feats = plain[1]
    cand, centres = feats[: args.candidates].contiguous(), feats[args.candidates :].contiguous()
    picks: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):
        for name, f in (("kcenter_plain", False), ("kcenter_fast", True)):
            s, picks[name] = timed(lambda f=f: kcenter_greedy(cand, centres, args.picks, fast=f))
            times.setdefault(name, []).append(s)
    out["seconds"] = times
    out["bitwise_equal"] = {"forward_fast": bool(torch.equal(plain[0], fast[0]) and torch.equal(plain[1], fast[1])),
                            "kcenter_fast": bool(torch.equal(picks["kcenter_plain"], picks["kcenter_fast"]))}
    out["channels_last_max_abs_diff"] = {"probs": float((plain[0] - cl[0]).abs().max()),
                                         "features": float((plain[1] - cl[1]).abs().max())}
    out["machine"]["loadavg_after"] = list(os.getloadavg())
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
