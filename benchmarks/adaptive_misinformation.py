"""Adaptive Misinformation (Kariyappa & Qureshi 2020) against the audit's adaptive attackers, on digits.

Victim: a cnn3 trained on digits' victim-train split (40 epochs, batch 64, seed 0, as the standard digits
victims), saved under ``--victim-dir``. The defence (:func:`stealkit.serve.misinformation.fit_adaptive_misinformation`):
the misinformation network trained on the same split, ``tau`` picked on it for each ``--keep``, ``nu`` 1000, the
plain maximum softmax probability as the detector (no Outlier Exposure). Attackers: the audit's default surrogate
recipe (:func:`stealkit.extract.surrogate_data.run.run_surrogate`, exactly what ``stealkit audit`` runs per part)
with data like the victim's (``pool``) or unrelated data (``patches``), at each budget and seed, served:

- ``probs``: the undefended probabilities (probability recipe); ``label``: top-1 labels (label recipe);
- ``am``: the defended probabilities (probability recipe); ``am-argmax``: their argmax (label recipe): the two
  attackers that adapt to what is served, as the audit runs them.

Every query count comes from the oracle's ledger. One JSON row per run is appended to ``--rows`` as it ends (a
stopped run keeps its rows), and the honest users' cost (top-1 accuracy and ECE served on the test split) once
per ``--keep``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/adaptive_misinformation.py --rows results/rows/am.jsonl
    .venv/bin/python benchmarks/adaptive_misinformation.py --summarise results/rows/am.jsonl   # the tables
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def victim_dir(path: Path) -> Path:
    """The digits cnn3 victim, trained once into ``path``."""
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    if not (path / "model.json").exists():
        train_victim("digits", "cnn3", TrainConfig(epochs=40, batch_size=64, seed=0), out=path)
    return path


def q90(points: dict[int, float]) -> str:
    """The smallest budget whose fidelity reached 0.90, or "not reached within N"."""
    reached = [b for b, f in sorted(points.items()) if f >= 0.90 - 1e-6]
    return str(reached[0]) if reached else f"not reached within {max(points)}"


def summarise(paths: list[str]) -> str:
    """Markdown tables from rows: fidelity per served answer, pool and budget (mean over seeds, min-max), the best
    adaptive attacker against AM per seed (the larger fidelity of ``am`` and ``am-argmax`` at each budget), and
    Q90 per seed."""
    import statistics
    from collections import defaultdict

    rows = [json.loads(line) for p in paths for line in Path(p).read_text(encoding="utf-8").splitlines() if line]
    attacks = [r for r in rows if r["kind"] == "attack"]
    fid: dict[tuple[str, str, int], dict[int, float]] = defaultdict(dict)
    for r in attacks:
        served = r["served"] + (f", keep {r['keep']}" if r.get("keep") else "")
        fid[(served, r["pool"], r["seed"])][r["budget"]] = r["fidelity"]
    for (served, pool, seed), points in list(fid.items()):
        if served.startswith("am, "):
            keep = served.removeprefix("am, ")
            other = fid.get((f"am-argmax, {keep}", pool, seed), {})
            fid[(f"am best adaptive, {keep}", pool, seed)] = {b: max(f, other[b]) for b, f in points.items()
                                                             if b in other}
    out = ["| served to honest users | tau | test inputs served f | top-1 accuracy | ECE |", "| --- | --- | --- | --- | --- |"]
    first: dict[tuple[str, float], dict[str, Any]] = {}
    for r in rows:  # each process of a split run wrote the same cost rows: the first of each
        if r["kind"] in ("undefended", "am"):
            first.setdefault((r["kind"], r.get("keep") or 0.0), r)
    for _, r in sorted(first.items(), key=lambda kv: (kv[0][0] != "undefended", kv[0][1])):
        if r["kind"] == "undefended":
            out.append(f"| probabilities | - | 100 % | {r['accuracy']:.3f} | {r['ece']:.3f} |")
        else:
            out.append(f"| AM, keep {r['keep']} (training split kept: {r['validation_kept']:.1%}) | "
                       f"{r['tau']:.4f} | {r['test_served_f']:.1%} | {r['accuracy']:.3f} | {r['ece']:.3f} |")
    out += ["", "| served | attacker data | budget | fidelity (mean, min-max over seeds) | seeds |",
            "| --- | --- | --- | --- | --- |"]
    kinds = ["probs", "label", "am", "am-argmax", "am best adaptive"]

    def rank(key: tuple[str, str, int]) -> tuple[Any, ...]:
        served, pool, b = key
        name, _, keep = served.partition(", ")
        return (pool != "pool", pool, keep, kinds.index(name), b)
    cells: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for (served, pool, _), points in fid.items():
        for b, f in points.items():
            cells[(served, pool, b)].append(f)
    for (served, pool, b), fs in sorted(cells.items(), key=lambda kv: rank(kv[0])):
        out.append(f"| {served} | {pool} | {b} | {statistics.mean(fs):.3f} ({min(fs):.3f}-{max(fs):.3f}) | {len(fs)} |")
    out += ["", "| served | attacker data | Q90 per seed |", "| --- | --- | --- |"]
    per: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (served, pool, seed), points in sorted(fid.items(), key=lambda kv: kv[0][2]):
        per[(served, pool)].append(f"{seed}: {q90(points)}")
    for (served, pool), qs in sorted(per.items(), key=lambda kv: rank((*kv[0], 0))):
        out.append(f"| {served} | {pool} | {'; '.join(qs)} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summarise", nargs="+", metavar="ROWS", help="print the tables of these row files")
    parser.add_argument("--rows", help="JSONL file the rows are appended to")
    parser.add_argument("--victim-dir", default="runs/am-bench/digits-cnn3")
    parser.add_argument("--out", default="runs/am-bench/runs")
    parser.add_argument("--budgets", default="50,100,200")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pools", default="pool,patches")
    parser.add_argument("--keep", default="0.95")
    parser.add_argument("--served", default="probs,label,am,am-argmax")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.summarise:
        print(summarise(args.summarise))
        return
    if not args.rows:
        parser.error("--rows ROWS (where the rows go) or --summarise ROWS...")

    import torch

    from stealkit.data import load_splits
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate
    from stealkit.models import load_model
    from stealkit.oracle.victim import Target
    from stealkit.serve.defences import served_calibration
    from stealkit.serve.misinformation import MisinformationSettings, fit_adaptive_misinformation
    from stealkit.settings import parse_int_list

    path = victim_dir(Path(args.victim_dir))
    model, spec = load_model(path)
    splits = load_splits("digits", seed=0)
    train, test = splits.victim_train, splits.test
    rows = Path(args.rows)
    rows.parent.mkdir(parents=True, exist_ok=True)

    def emit(row: dict[str, Any]) -> None:
        with rows.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    base = {"victim": "digits cnn3 (40 epochs, batch 64, seed 0)", "device": args.device}
    emit({**base, "kind": "undefended", **served_calibration(model, test.x, test.y)})
    defences = {}
    for keep in (float(k) for k in args.keep.split(",")):
        am = fit_adaptive_misinformation(model, train.x, train.y, train.x, MisinformationSettings(keep=keep),
                                         seed=0, device=args.device)
        with torch.no_grad():
            probs = torch.softmax(model(test.x), dim=1)
        share = float((am.alpha(probs) < 0.5).double().mean())
        emit({**base, "kind": "am", **am.record, "test_served_f": round(share, 4),
              **served_calibration(model, test.x, test.y, defence=am)})
        defences[keep] = am
    served = [s for s in args.served.split(",") if s]
    for seed in parse_int_list(args.seeds):
        for pool in args.pools.split(","):
            for budget in parse_int_list(args.budgets):
                for what in served:
                    for keep, am in (defences.items() if what.startswith("am") else [(None, None)]):
                        mode = "label" if what in ("label", "am-argmax") else "probs"
                        started = time.perf_counter()
                        run = run_surrogate(Target(str(path), dataset="digits", seed=seed, device=args.device),
                                            budget, SurrogateOptions(mode=mode, pool=pool),
                                            out=Path(args.out) / rows.stem / f"{what}-{keep}-{pool}-{budget}-{seed}",
                                            defences=(am,) if am is not None else (), report=False)
                        emit({**base, "kind": "attack", "served": what, "keep": keep, "pool": pool,
                              "budget": budget, "seed": seed, "queries": sum(run.queries.values()),
                              "fidelity": round(float(run.fidelity), 4), "accuracy": round(float(run.accuracy), 4),
                              "seconds": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
