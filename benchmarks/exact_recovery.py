"""Exact two-layer recovery (Milli et al. 2019, Alg. 1 and 1-MQ) against ART's FunctionallyEquivalentExtraction.

Victims: two-layer ReLU networks with biases and 10 outputs, random (unit rows) or trained (a zoo mlp2 with
``hidden = h`` trained on digits for d = 64 or on Fashion-MNIST for d = 784, folded to float64). All run over
R^d through a float64 oracle (ART's attack needs float64 and queries far outside [0, 1]). Per run: queries by
kind (from the ledger; ART's from a wrapper counting every input row its predict function receives), the
largest relative logit error on 10,000 N(0, I) inputs, success (error <= 1e-6) and label fidelity.

    python benchmarks/exact_recovery.py --quick
    python benchmarks/exact_recovery.py --seeds 20 --ds 64,784 --hs 8,32,128
Prints one JSON object to stdout. ``--jsonl PATH`` also appends one row per run (setting, variant, seed) as soon as
it ends, and writes ``PATH``'s ``.meta.json`` at the end (``benchmarks/rowmeta.py``): the raw rows
``benchmarks/results_tables.py`` regenerates docs/results.md#exact-recovery from.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stealkit.errors import StealkitError
from stealkit.extract.explanations.exact import ExactConfig, recover_two_layer
from stealkit.extract.explanations.exact_mq import recover_two_layer_mq
from stealkit.oracle.float64 import Float64ExplanationOracle, TwoLayerReLU

GOAL = 1e-6


class _ArtBudget(Exception):
    pass


def trained_victim(d: int, h: int, device: str) -> TwoLayerReLU:
    from stealkit.data import load_splits
    from stealkit.models import build_model
    from stealkit.train import TrainConfig, fit

    name, epochs, n = ("digits", 40, None) if d == 64 else ("fashion-mnist", 3, 20_000)
    splits = load_splits(name)
    x, y = splits.victim_train.x, splits.victim_train.y
    if n is not None:
        x, y = x[:n], y[:n]
    torch.manual_seed(0)
    model = build_model("mlp2", input_shape=tuple(x.shape[1:]), num_classes=10, hidden=h)
    fit(model, x, y, TrainConfig(epochs=epochs, batch_size=64, seed=0), desc=f"mlp2-{h}", device=device)
    net = TwoLayerReLU.from_classifier(model.cpu())
    return TwoLayerReLU(net.fc1.weight.detach(), net.fc1.bias.detach(), net.fc2.weight.detach(),
                        net.fc2.bias.detach(), (1, 1, d))


def measure(net: TwoLayerReLU, predict: Any, x: np.ndarray) -> dict[str, float]:
    f = net.numpy_forward(x)
    g = predict(x)
    err = float(np.abs(g - f).max() / np.abs(f).max())
    return {"max_rel_error": err, "fidelity": float((g.argmax(1) == f.argmax(1)).mean())}


def run_ours(net: TwoLayerReLU, h: int, seed: int, variant: str, x: np.ndarray) -> dict[str, Any]:
    oracle = Float64ExplanationOracle(net, net.input_shape)
    t0 = time.perf_counter()
    try:
        if variant == "mq":
            rec = recover_two_layer_mq(oracle, h, ExactConfig(seed=seed))
        else:
            rec = recover_two_layer(oracle, h, ExactConfig(seed=seed, search=variant))  # type: ignore[arg-type]
        out: dict[str, Any] = measure(net, rec.model.numpy_forward, x)
    except StealkitError as exc:
        out = {"max_rel_error": None, "fidelity": None, "failure": str(exc)[:120]}
    q = oracle.ledger.as_dict()
    return {**out, "queries": sum(q.values()), "queries_predict": q["predict"], "queries_explain": q["explain"],
            "seconds": round(time.perf_counter() - t0, 2)}


def run_art(net: TwoLayerReLU, h: int, seed: int, x: np.ndarray, cap: int, timeout: float) -> dict[str, Any]:
    from art.attacks.extraction import FunctionallyEquivalentExtraction
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    d = x.shape[1]
    count = [0]
    t0 = time.perf_counter()

    def predict(batch: np.ndarray) -> np.ndarray:
        batch = np.asarray(batch, dtype=np.float64).reshape(-1, d)
        count[0] += batch.shape[0]  # every input row ART sends is one membership query
        if count[0] > cap:
            raise _ArtBudget("cap")
        if time.perf_counter() - t0 > timeout:
            raise _ArtBudget("timeout")
        return net.numpy_forward(batch)

    np.random.seed(seed)
    clf = BlackBoxClassifierNeuralNetwork(predict, input_shape=(d,), nb_classes=net.num_classes)
    attack = FunctionallyEquivalentExtraction(clf, num_neurons=h)
    fit_x = np.random.default_rng(seed).standard_normal((max(2 * h + 1, 100), d))
    try:
        stolen = attack.extract(fit_x)
        out: dict[str, Any] = measure(net, lambda z: np.asarray(stolen.predict(z)), x)
    except _ArtBudget as stop:
        out = {"max_rel_error": None, "fidelity": None, "failure": f"stopped at {cap} queries or {timeout} s",
               "stopped": str(stop)}
    except Exception as exc:  # ART's own failures (assertions, shape errors) count as failures
        out = {"max_rel_error": None, "fidelity": None, "failure": f"{type(exc).__name__}: {str(exc)[:100]}"}
    return {**out, "queries": count[0], "seconds": round(time.perf_counter() - t0, 2)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["max_rel_error"] is not None and r["max_rel_error"] <= GOAL]
    done = [r for r in runs if r["max_rel_error"] is not None]
    return {
        "runs": len(runs),
        "success_rate": len(ok) / len(runs),
        "median_queries": statistics.median(r["queries"] for r in runs),
        "median_queries_predict": statistics.median(r.get("queries_predict", r["queries"]) for r in runs),
        "median_queries_explain": statistics.median(r.get("queries_explain", 0) for r in runs),
        "median_max_rel_error": statistics.median(r["max_rel_error"] for r in done) if done else None,
        "worst_max_rel_error": max(r["max_rel_error"] for r in done) if done else None,
        "median_fidelity": statistics.median(r["fidelity"] for r in done) if done else None,
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "failures": sorted({r["failure"] for r in runs if "failure" in r})[:3],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: d=64, h=8, 2 seeds, ART 1 seed")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ds", default="64,784")
    ap.add_argument("--hs", default="8,32,128")
    ap.add_argument("--nets", default="random,trained")
    ap.add_argument("--variants", default="secant,bisect,mq,art")
    ap.add_argument("--art-seeds", type=int, default=5)
    ap.add_argument("--mq-seeds", type=int, default=5)
    ap.add_argument("--art-cap", type=int, default=2_000_000, help="ART membership queries before it is stopped")
    ap.add_argument("--art-timeout", type=float, default=60.0, help="seconds before an ART run is stopped")
    ap.add_argument("--mq-max-dh", type=int, default=784 * 32, help="skip Algorithm 1-MQ above this d*h")
    ap.add_argument("--eval", type=int, default=10_000)
    ap.add_argument("--device", default="cpu", help="device for training the victims (cuda at full scale)")
    ap.add_argument("--jsonl", default=None, help="also append one row per run to this file (raw rows)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.ds, args.hs, args.art_seeds, args.mq_seeds = 2, "64", "8", 1, 1
    logging.basicConfig(level=logging.WARNING)
    variants = args.variants.split(",")
    results = []
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds=f"ours 0-{args.seeds - 1}, 1-MQ 0-{args.mq_seeds - 1}, "
                         f"ART 0-{args.art_seeds - 1}", device=args.device,
                         data={"error scored on": f"{args.eval:,} N(0, I) inputs, numpy seed 123"},
                         art_timeout=args.art_timeout, art_cap=args.art_cap,
                         victims="random: TwoLayerReLU.random(d, h, 10, bias=True, seed=1000 + h); trained: mlp2 "
                         "on digits (d 64) or the first 20,000 Fashion-MNIST victim-train images (d 784), seed 0")

    def keep(row: dict[str, Any], variant: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as fh:
                for seed, r in enumerate(runs):
                    fh.write(json.dumps({"net": row["net"], "d": row["d"], "h": row["h"], "variant": variant,
                                         "seed": seed, **r}) + "\n")
        return runs

    for kind in args.nets.split(","):
        for d in (int(v) for v in args.ds.split(",")):
            for h in (int(v) for v in args.hs.split(",")):
                net = TwoLayerReLU.random(d, h, 10, bias=True, seed=1000 + h) if kind == "random" \
                    else trained_victim(d, h, args.device)
                x = np.random.default_rng(123).standard_normal((args.eval, d))
                row: dict[str, Any] = {"net": kind, "d": d, "h": h, "h_log_h": round(h * math.log(h), 1)}
                for variant in variants:
                    if variant == "art":
                        runs = [run_art(net, h, s, x, args.art_cap, args.art_timeout) for s in range(args.art_seeds)]
                    elif variant == "mq":
                        if d * h > args.mq_max_dh:
                            continue
                        runs = [run_ours(net, h, s, "mq", x) for s in range(args.mq_seeds)]
                    else:
                        runs = [run_ours(net, h, s, variant, x) for s in range(args.seeds)]
                    row[variant] = summarise(keep(row, variant, runs))
                results.append(row)
                print(json.dumps(row), flush=True, file=sys.stderr)
    rowmeta.finish(meta)
    print(json.dumps({"benchmark": "exact_recovery", "goal_max_rel_error": GOAL, "args": vars(args),
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
