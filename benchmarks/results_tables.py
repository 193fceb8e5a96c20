"""Regenerate the tables of ``docs/results.md`` from the committed raw rows in ``results/rows/``.

Each table is a block of ``docs/results.md`` between ``<!-- BEGIN rows:NAME -->`` and ``<!-- END rows:NAME -->``,
made from ``results/rows/NAME.jsonl`` (the benchmark's ``--jsonl`` output, one row a line) and
``results/rows/NAME.meta.json`` (the command, commit, date, device and plan of that run). Every interval is the
paired bootstrap of ``benchmarks/evidence.py`` with its fixed seed, so the tables regenerate to the character.

    python benchmarks/results_tables.py            # print every table
    python benchmarks/results_tables.py --write    # rewrite the blocks in docs/results.md
    python benchmarks/results_tables.py --check    # exit 1 if a block differs from what the rows give
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evidence import (  # noqa: E402
    accuracy_difference,
    median_ratio,
    paired_interval,
    stack,
    unpack_bits,
    verdict,
)

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "results" / "rows"
DOC = ROOT / "docs" / "results.md"


def _load(name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = ROWS / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta_path = ROWS / f"{name}.meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    return rows, meta


def _mean_std(values: list[float], digits: int = 3) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _footer(meta: dict[str, Any]) -> list[str]:
    keys = ("command", "plan", "commit", "date", "device", "seeds", "images", "load")
    return ["", *[f"- {k}: {meta[k]}" if k != "command" else f"- command: `{meta[k]}`" for k in keys if k in meta]]


def _by_design(row: dict[str, Any]) -> str:
    """How an ours-default row's work differs from ART's thief (same student, batch and epochs otherwise)."""
    parts = []
    if row.get("ssl", "none") != "none":
        parts.append(f"{row['ssl']} also trains on the unqueried pool (epochs over the pool: more steps than ART)")
    if row.get("select", "random") != "random":
        parts.append(f"{row['select']} selection queries other images than ART's random ones")
    return "; ".join(parts) or "none"


def surrogate(name: str) -> str:
    """The default (``ours-default``) against ART's best thief per cell, paired per test image and seed."""
    rows, meta = _load(name)
    out = ["| answers | budget | ours (default) | ART's best thief | difference, points [95 % CI] | verdict | "
           "epochs ours / ART | where the work differs by design |", "|---|---|---|---|---|---|---|---|"]
    cells = sorted({(r["mode"], int(r["budget"])) for r in rows})
    for mode, budget in cells:
        cell = [r for r in rows if r["mode"] == mode and int(r["budget"]) == budget]
        ours = sorted((r for r in cell if r["attack"] == "ours-default"), key=lambda r: r["seed"])
        arts: dict[str, list[dict[str, Any]]] = {}
        for r in cell:
            if str(r["attack"]).startswith("art"):
                arts.setdefault(str(r["attack"]), []).append(r)
        if not ours or not arts:
            continue
        best_name, best = max(arts.items(), key=lambda kv: statistics.fmean(r["accuracy"] for r in kv[1]))
        best = sorted(best, key=lambda r: r["seed"])
        est, lo, hi = paired_interval(accuracy_difference, stack(ours), stack(best))
        steps = f"{ours[0].get('epochs', '-')} / {best[0].get('epochs', '-')}"
        out.append(f"| {mode} | {budget} | {_mean_std([r['accuracy'] for r in ours])} | "
                   f"{_mean_std([r['accuracy'] for r in best])} ({best_name}) | {est:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
                   f"{verdict(lo, hi)} | {steps} | {_by_design(ours[0])} |")
    return "\n".join(out + _footer(meta))


def decision(name: str) -> str:
    """stealkit's decision attack against ART's full run: median L2 over the images, paired per image."""
    rows, meta = _load(name)
    art = sorted((r for r in rows if r["tool"] == "art-hsj" and str(r["budget"]) == "full" and r.get("l2")),
                 key=lambda r: r.get("repeat", r["seed"]))
    if not art:
        raise SystemExit(f"{name}: no ART full-run rows with per-image L2")
    b = np.array([r["l2"] for r in art], dtype=float)
    art_q = statistics.fmean(r["mean_queries"] for r in art)
    out = [f"ART HopSkipJump full run: median L2 {np.median(b.mean(axis=0)):.3f} over {b.shape[1]} images "
           f"({len(art)} seeded repeats, {art_q:,.0f} queries per image).", "",
           "| tool | queries / image | share of ART's | median L2 | ratio to ART [95 % CI] | verdict |",
           "|---|---|---|---|---|---|"]
    tools = sorted({(r["tool"], str(r["budget"])) for r in rows
                    if not (r["tool"] == "art-hsj" and str(r["budget"]) == "full")})
    for tool, budget in tools:
        mine = sorted((r for r in rows if r["tool"] == tool and str(r["budget"]) == budget and r.get("l2")),
                      key=lambda r: r.get("repeat", r["seed"]))  # ART's anytime rows pair with its full runs
        tool = f"{tool} (anytime best)" if mine and mine[0].get("anytime") else tool
        if not mine:
            continue
        a = np.array([r["l2"] for r in mine], dtype=float)
        est, lo, hi = paired_interval(median_ratio, a, b)
        q = statistics.fmean(r["mean_queries"] for r in mine)
        out.append(f"| {tool} | {q:,.0f} | 1/{art_q / q:.1f} | {np.median(a.mean(axis=0)):.3f} | "
                   f"{est:.3f} [{lo:.3f}, {hi:.3f}] | {verdict(lo, hi, 1.0, higher_is_better=False)} |")
    return "\n".join(out + _footer(meta))


def labelonly(name: str) -> str:
    """The data-free default's chosen student over the victim, per answer kind, paired per image and seed."""
    rows, meta = _load(name)
    out = ["| answers | queries | student accuracy | victim | ratio to the victim [95 % CI] | largest fall (points) |",
           "|---|---|---|---|---|---|"]
    for mode in sorted({r["mode"] for r in rows}):
        runs = sorted((r for r in rows if r["mode"] == mode and r.get("correct")), key=lambda r: r["seed"])
        if not runs:
            continue
        a = stack(runs)
        v = np.stack([unpack_bits(r["victim_correct"], int(r["n_test"])) for r in runs])
        est, lo, hi = paired_interval(lambda x, y: float(x.mean() / y.mean()), a, v)
        q = max(int(r["queries"]["predict"]) for r in runs)
        out.append(f"| {mode} | {q:,} | {_mean_std([r['final_accuracy'] for r in runs])} | "
                   f"{runs[0]['victim_accuracy']:.3f} | {est:.3f} [{lo:.3f}, {hi:.3f}] | "
                   f"{max(r['max_drop_points'] for r in runs):.1f} |")
    return "\n".join(out + _footer(meta))


def misinformation(name: str) -> str:
    """Adaptive Misinformation against the adaptive attackers: the honest users' cost, fidelity per served answer,
    attacker and budget, and Q90 per seed (``benchmarks/adaptive_misinformation.py``'s tables)."""
    from adaptive_misinformation import summarise

    _, meta = _load(name)
    return "\n".join([summarise([str(ROWS / f"{name}.jsonl")]), *_footer(meta)])


#: table name (= rows file stem) -> renderer
TABLES: dict[str, Callable[[str], str]] = {
    "surrogate-digits-sealed": surrogate,
    "surrogate-digits-sealed-artsearch": surrogate,
    "decision-fmnist-sealed": decision,
    "labelonly-digits-sealed": labelonly,
    "am-digits-cnn3": misinformation,
}


def render(names: list[str] | None = None) -> dict[str, str]:
    """Every table whose rows file exists, by name."""
    return {n: f(n) for n, f in TABLES.items() if (names is None or n in names) and (ROWS / f"{n}.jsonl").exists()}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN rows:{re.escape(name)} -->\n)(.*?)(<!-- END rows:{re.escape(name)} -->)", re.S)


def apply(doc: str, tables: dict[str, str]) -> str:
    """``doc`` with each table's block replaced; a table without a block in the doc is an error."""
    for name, text in tables.items():
        pat = _block(name)
        if not pat.search(doc):
            raise SystemExit(f"docs/results.md has no block for {name}: add <!-- BEGIN rows:{name} --> ... "
                             f"<!-- END rows:{name} -->")
        doc = pat.sub(lambda m, t=text: m.group(1) + t + "\n" + m.group(3), doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="rewrite the blocks of docs/results.md")
    p.add_argument("--check", action="store_true", help="exit 1 where docs/results.md differs from the rows")
    p.add_argument("--doc", type=Path, default=DOC)
    args = p.parse_args(argv)
    tables = render()
    if not (args.write or args.check):
        print(json.dumps(tables, indent=1))
        return 0
    doc = args.doc.read_text(encoding="utf-8")
    new = apply(doc, tables)
    if args.check:
        stale = [n for n in tables if _block(n).search(doc).group(2) != tables[n] + "\n"]  # type: ignore[union-attr]
        print(json.dumps({"tables": sorted(tables), "stale": stale}))
        return 1 if stale else 0
    tmp = args.doc.with_suffix(".md.tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(args.doc)
    print(json.dumps({"written": sorted(tables)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
