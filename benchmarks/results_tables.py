"""Regenerate the tables of ``docs/results.md`` from the committed raw rows in ``results/rows/``.

Each table is a block of ``docs/results.md`` between ``<!-- BEGIN rows:NAME -->`` and ``<!-- END rows:NAME -->``,
made from ``results/rows/NAME.jsonl`` (the benchmark's ``--jsonl`` output, one row a line) and
``results/rows/NAME.meta.json`` (the command, commit, date, device and plan of that run). Every interval is the
seed-level interval of ``benchmarks/evidence.py`` (the wider of a hierarchical bootstrap over seeds then images
and a t-interval over the per-seed figures; the cell says which), with its fixed seed, so the tables regenerate
to the character.

    python benchmarks/results_tables.py            # print every table
    python benchmarks/results_tables.py --write    # rewrite the blocks in docs/results.md
    python benchmarks/results_tables.py --check    # exit 1 if a block differs from what the rows give, or a
                                                   # README results row lacks its regenerated figure (or, with
                                                   # no committed rows, the words "no raw rows")

Besides the ``NAME.jsonl`` tables, ``OTHER_TABLES`` makes blocks from other committed rows (the audit's
``audit.json`` files), and :func:`readme_cells` the README's figures that committed rows give (the sealed rows,
the H100 PGD times from ``results/gpu/``). ``results_figures.FIGURES`` adds the README rows whose benchmarks write
raw rows with ``--jsonl`` (surrogate probabilities and 10k, CoDFe against DaST, exact recovery, gradient matching,
HopSkipJump with a substitute, PGD speed, certification, the oracle and HTTP): each regenerates once its rows
files are committed; until then ``--check`` skips it, and says so, only while its README row says "no raw rows".
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
import results_audit  # noqa: E402
from evidence import (  # noqa: E402
    accuracy_difference,
    median_ratio,
    ratio_of_means,
    seed_interval,
    stack,
    unpack_bits,
    verdict,
)
from results_figures import FIGURES  # noqa: E402

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


def _how(si: Any, fmt: str) -> str:
    """Which interval the verdict used, and the narrower one beside it, e.g. ``t; bootstrap +0.7, +3.9``."""
    if si.method == "t":
        return f"t over seeds; bootstrap {si.hierarchical[0]:{fmt}}, {si.hierarchical[1]:{fmt}}"
    return f"hierarchical bootstrap; t {si.t[0]:{fmt}}, {si.t[1]:{fmt}}"


_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}

#: the label-only goal of the sealed plan: met only if the interval's lower end is at least this
LABELONLY_GOAL = 0.90


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
    return _surrogate(*_load(name))


def _surrogate(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = ["| answers | budget | ours (default) | ART's best thief | difference, points [95 % CI, seed-level] | verdict | "
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
        si = seed_interval(accuracy_difference, stack(ours), stack(best))
        steps = f"{ours[0].get('epochs', '-')} / {best[0].get('epochs', '-')}"
        out.append(f"| {mode} | {budget} | {_mean_std([r['accuracy'] for r in ours])} | "
                   f"{_mean_std([r['accuracy'] for r in best])} ({best_name}) | "
                   f"{si.estimate:+.1f} [{si.lo:+.1f}, {si.hi:+.1f}] ({_how(si, '+.1f')}) | "
                   f"{verdict(si.lo, si.hi)} | {steps} | {_by_design(ours[0])} |")
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
           "| tool | queries / image | share of ART's | median L2 | ratio to ART [95 % CI, seed-level] | verdict |",
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
        si = seed_interval(median_ratio, a, b)
        q = statistics.fmean(r["mean_queries"] for r in mine)
        out.append(f"| {tool} | {q:,.0f} | 1/{art_q / q:.1f} | {np.median(a.mean(axis=0)):.3f} | "
                   f"{si.estimate:.3f} [{si.lo:.3f}, {si.hi:.3f}] ({_how(si, '.3f')}) | "
                   f"{verdict(si.lo, si.hi, 1.0, higher_is_better=False)} |")
    return "\n".join(out + _footer(meta))


def labelonly(name: str) -> str:
    """The data-free default's chosen student over the victim, per answer kind, paired per image and seed."""
    rows, meta = _load(name)
    return _labelonly(rows, [meta])


def labelonly_five(name: str) -> str:
    """Labels at five seeds (``results/plans/2026-11-28-five-seeds-labels-200.md``): seeds 100-102 from the sealed
    rows and 103-104 from ``NAME.jsonl``, pooled under the same rule."""
    three, meta3 = _load("labelonly-digits-sealed")
    two, meta2 = _load(name)
    return _labelonly([r for r in three if r["mode"] == "label"] + two, [meta3, meta2])


def _labelonly(rows: list[dict[str, Any]], metas: list[dict[str, Any]]) -> str:
    out = ["| answers | queries | student accuracy | victim | ratio to the victim [95 % CI, seed-level] | "
           "goal 0.90x (lower end >= 0.90) | largest fall (points) |", "|---|---|---|---|---|---|---|"]
    for mode in sorted({r["mode"] for r in rows}):
        runs = sorted((r for r in rows if r["mode"] == mode and r.get("correct")), key=lambda r: r["seed"])
        if not runs:
            continue
        a = stack(runs)
        v = np.stack([unpack_bits(r["victim_correct"], int(r["n_test"])) for r in runs])
        si = seed_interval(ratio_of_means, a, v)
        q = max(int(r["queries"]["predict"]) for r in runs)
        met = "met" if si.lo >= LABELONLY_GOAL else f"not shown at {_WORDS.get(len(runs), len(runs))} seeds"
        out.append(f"| {mode} | {q:,} | {_mean_std([r['final_accuracy'] for r in runs])} | "
                   f"{runs[0]['victim_accuracy']:.3f} | {si.estimate:.3f} [{si.lo:.3f}, {si.hi:.3f}] ({_how(si, '.3f')}) | "
                   f"{met} | {max(r['max_drop_points'] for r in runs):.1f} |")
    return "\n".join(out + [line for meta in metas for line in _footer(meta)])


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
    "surrogate-digits-sealed-labels200-5seeds": surrogate,  # seeds 100-104 at one code (its plan's addendum)
    "decision-fmnist-sealed": decision,
    "labelonly-digits-sealed": labelonly,
    "labelonly-digits-sealed-5seeds": labelonly_five,  # seeds 103-104 beside 100-102 (its plan)
    "am-digits-cnn3": misinformation,
}


#: blocks made from other committed rows than ``NAME.jsonl``: name -> (renderer, the files it reads)
OTHER_TABLES: dict[str, tuple[Callable[[str], str], tuple[str, ...]]] = {
    "audit-adaptive": (lambda name: results_audit.audit_adaptive(ROWS),
                       ("audit-digits-quick-1e82ecb.json", "audit-digits-quick-adaptive.json")),
    "audit-fmnist-adaptive": (lambda name: results_audit.audit_fmnist(ROWS),
                              ("audit-fmnist-default-9b4c833.json", "audit-fmnist-default-adaptive.json")),
}


def render(names: list[str] | None = None) -> dict[str, str]:
    """Every table whose rows exist, by name."""
    out = {n: f(n) for n, f in TABLES.items() if (names is None or n in names) and (ROWS / f"{n}.jsonl").exists()}
    out |= {n: f(n) for n, (f, files) in OTHER_TABLES.items()
            if (names is None or n in names) and all((ROWS / x).exists() for x in files)}
    out |= {f.name: f.make()[0] for f in FIGURES if (names is None or f.name in names) and f.present()}
    return out


# -- the README's results rows -----------------------------------------------------------------------------------

README = ROOT / "README.md"
GPU = ROOT / "results" / "gpu"
#: the words a README row without committed raw rows carries instead of a regenerated figure
NO_ROWS = "no raw rows"


def readme_cells() -> dict[str, str]:
    """Each README figure that committed rows give, as the README writes it, by a key naming its row."""
    out: dict[str, str] = {}
    for key, name, seeds in (("sealed-surrogate", "surrogate-digits-sealed-artsearch", "three"),
                             ("sealed-surrogate-5", "surrogate-digits-sealed-labels200-5seeds", "five")):
        rows, _ = _load(name)
        cell = [r for r in rows if r.get("mode") == "label" and int(r["budget"]) == 200]
        ours = sorted((r for r in cell if r["attack"] == "ours-default"), key=lambda r: r["seed"])
        art = sorted((r for r in cell if r["attack"] == "art-knockoff-random"), key=lambda r: r["seed"])
        si = seed_interval(accuracy_difference, stack(ours), stack(art))
        out[key] = (f"{verdict(si.lo, si.hi)} at {seeds} seeds ({statistics.fmean(r['accuracy'] for r in ours):.3f}, "
                    f"{si.estimate:+.1f} points [{si.lo:+.1f}, {si.hi:+.1f}]")
    rows, _ = _load("labelonly-digits-sealed")
    figs = {}
    for mode in ("label", "probs"):
        runs = sorted((r for r in rows if r["mode"] == mode and r.get("correct")), key=lambda r: r["seed"])
        v = np.stack([unpack_bits(r["victim_correct"], int(r["n_test"])) for r in runs])
        figs[mode] = seed_interval(ratio_of_means, stack(runs), v)
    lab, pro = figs["label"], figs["probs"]
    out["sealed-labelonly"] = (f"{lab.estimate:.3f}x the victim [{lab.lo:.3f}, {lab.hi:.3f}] (labels), "
                               f"{pro.estimate:.3f}x [{pro.lo:.3f}, {pro.hi:.3f}] (probabilities)")
    if (ROWS / "labelonly-digits-sealed-5seeds.jsonl").exists():  # seeds 103-104 of its plan, beside 100-102
        five = [r for r in rows if r["mode"] == "label"] + _load("labelonly-digits-sealed-5seeds")[0]
        runs = sorted((r for r in five if r.get("correct")), key=lambda r: r["seed"])
        v = np.stack([unpack_bits(r["victim_correct"], int(r["n_test"])) for r in runs])
        si = seed_interval(ratio_of_means, stack(runs), v)
        out["sealed-labelonly-5"] = (f"labels at {_WORDS.get(len(runs), len(runs))} seeds {si.estimate:.3f}x "
                                     f"[{si.lo:.3f}, {si.hi:.3f}]")
    rows, _ = _load("decision-fmnist-sealed")
    art_rows = sorted((r for r in rows if r["tool"] == "art-hsj" and str(r["budget"]) == "full" and r.get("l2")),
                      key=lambda r: r.get("repeat", r["seed"]))
    b = np.array([r["l2"] for r in art_rows], dtype=float)
    ratios = []
    for tool in ("stealkit-hsj", "stealkit-hsj-pool"):
        mine = sorted((r for r in rows if r["tool"] == tool and r.get("l2")),
                      key=lambda r: r.get("repeat", r["seed"]))  # as decision() orders them
        ratios.append(seed_interval(median_ratio, np.array([r["l2"] for r in mine], dtype=float), b))
    words = "level" if all(verdict(x.lo, x.hi, 1.0, higher_is_better=False) == "level" for x in ratios) else "mixed"
    out["sealed-decision"] = (f"median L2 {ratios[0].estimate:.3f}x / {ratios[1].estimate:.3f}x ART's (with start "
                              f"pool): {words}, seed-level intervals reach {ratios[0].hi:.2f} / {ratios[1].hi:.2f}")
    run1 = json.loads((GPU / "2026-11-27-h100-run1.json").read_text(encoding="utf-8"))
    pgd = [f["value"] for f in run1["figures"] if f.get("step") == "pgd"]
    secs = [dict(re.findall(r"(\w+) ([\d.]+) s", v)) for v in pgd]
    out["gpu-pgd"] = f"H100 {secs[0]['stealkit']} / {secs[1]['stealkit']} s"
    out["gpu-pgd-torchattacks"] = f"H100 {secs[0]['torchattacks']} / {secs[1]['torchattacks']} s"
    for f in FIGURES:
        if f.present():
            out |= {f"{f.name}-{i}": cell for i, cell in enumerate(f.make()[1])}
    return out


def readme_rows(text: str) -> list[str]:
    """The rows of the README's results table (after its header)."""
    section = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith(("| capability", "| ---"))]


def _row_of(rows: list[str], anchor: str) -> str | None:
    return next((r for r in rows if f"(docs/results.md#{anchor})" in r), None)


def readme_skips(text: str) -> list[str]:
    """The README rows ``--check`` does not regenerate, each with why: its rows files are not committed and the
    row says "no raw rows" (a row without those words is a problem of :func:`check_readme`, not a skip)."""
    rows = readme_rows(text)
    out = []
    for f in FIGURES:
        row = _row_of(rows, f.anchor)
        if not f.present() and row is not None and NO_ROWS in row:
            out.append(f"skipped {f.name} (README row #{f.anchor}): {'; '.join(f.missing())}; the README row "
                       f"says {NO_ROWS!r}")
    return out


def check_readme(text: str) -> list[str]:
    """What is wrong with the README's results rows: a regenerated figure it does not carry, a row that has
    neither a regenerated figure nor the words "no raw rows", a row whose rows are all committed that still says
    "no raw rows", or a row whose rows are not that does not say it."""
    cells = readme_cells()
    rows = readme_rows(text)
    problems = [f"README lacks the regenerated figure {k}: {v!r}" for k, v in cells.items()
                if not any(v in r for r in rows)]
    for r in rows:
        if NO_ROWS not in r and not any(v in r for v in cells.values()):
            problems.append(f"README row has no regenerated figure and does not say {NO_ROWS!r}: {r[:80]}")
    for anchor in sorted({f.anchor for f in FIGURES}):
        row = _row_of(rows, anchor)
        figs = [f for f in FIGURES if f.anchor == anchor]
        if row is None:
            problems.append(f"README has no results row linking docs/results.md#{anchor}")
        elif all(f.present() for f in figs) and NO_ROWS in row:
            problems.append(f"README row #{anchor} says {NO_ROWS!r} but its rows are committed: {row[:80]}")
        elif not all(f.present() for f in figs) and NO_ROWS not in row:
            absent = "; ".join(m for f in figs for m in f.missing())
            problems.append(f"README row #{anchor} does not say {NO_ROWS!r} but {absent}")
    return problems


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
    p.add_argument("--readme", type=Path, default=README)
    args = p.parse_args(argv)
    tables = render()
    if not (args.write or args.check):
        print(json.dumps(tables, indent=1))
        return 0
    doc = args.doc.read_text(encoding="utf-8")
    new = apply(doc, tables)
    if args.check:
        stale = [n for n in tables if _block(n).search(doc).group(2) != tables[n] + "\n"]  # type: ignore[union-attr]
        text = args.readme.read_text(encoding="utf-8")
        readme = check_readme(text)
        print(json.dumps({"tables": sorted(tables), "stale": stale, "readme": readme,
                          "skipped": readme_skips(text)}, indent=1))
        return 1 if stale or readme else 0
    tmp = args.doc.with_suffix(".md.tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(args.doc)
    print(json.dumps({"written": sorted(tables)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
