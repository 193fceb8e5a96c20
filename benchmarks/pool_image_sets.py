"""Pool ``decision_attacks.py`` runs made on disjoint image sets into one median per tool.

A median L2 over 40 images moves by several per cent from one set of 40 to another (docs/notebook/decision-attacks.md,
"Eighth round (b)"), more than the tools differ. This reads the JSON lines of several runs (each made with the
same tools, budgets, seeds and ``--art-repeats``), joins the per-image L2s (``l2``) of the rows that match on
(tool, budget, seed, repeat) across the runs, and reports for each tool the mean over seeds (or ART's repeats)
of the median over all the pooled images, with each run's own figure beside it.

    python benchmarks/pool_image_sets.py runs/r13/anchor400.jsonl runs/r13/anchor500.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

Key = tuple[str, str, int, int]


def load(path: Path) -> dict[Key, dict[str, Any]]:
    """The rows of one run that carry per-image L2s, keyed by (tool, budget, seed, repeat)."""
    rows: dict[Key, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path}:{n} is not a JSON line ({e.msg}); give the --jsonl file of a run") from None
        if "tool" not in r or "l2" not in r:
            continue
        key = (str(r["tool"]), str(r["budget"]) + (" (anytime)" if r.get("anytime") else ""),
               int(r.get("seed", -1)), int(r.get("repeat", -1)))
        rows[key] = r
    return rows


def median(values: list[float | None]) -> float:
    """The median over images; an image without an adversarial point counts as infinitely far."""
    return statistics.median(math.inf if v is None else v for v in values)


def pool(runs: list[dict[Key, dict[str, Any]]]) -> list[dict[str, Any]]:
    common = set(runs[0]).intersection(*runs[1:])
    groups: dict[tuple[str, str], list[Key]] = {}
    for key in sorted(common):
        groups.setdefault(key[:2], []).append(key)
    out = []
    for (tool, budget), keys in sorted(groups.items()):
        pooled = [median([v for run in runs for v in run[k]["l2"]]) for k in keys]
        each = [statistics.fmean(median(run[k]["l2"]) for k in keys) for run in runs]
        out.append({"tool": tool, "budget": budget, "draws": len(keys),
                    "images": sum(len(run[keys[0]]["l2"]) for run in runs),
                    "pooled_median_l2_mean": statistics.fmean(pooled),
                    "pooled_median_l2_std": statistics.stdev(pooled) if len(pooled) > 1 else 0.0,
                    "pooled_median_l2": pooled, "per_run_median_l2_mean": each})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="the --jsonl files of runs on disjoint image sets")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.runs if not f.is_file()]
    if missing:
        raise SystemExit(f"error: no such file: {', '.join(missing)}")
    runs = [load(f) for f in args.runs]
    if not all(runs):
        raise SystemExit("error: a run has no rows with per-image L2s ('l2'); re-run it with the current "
                         "benchmarks/decision_attacks.py")
    print(json.dumps({"runs": [str(f) for f in args.runs], "tools": pool(runs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
