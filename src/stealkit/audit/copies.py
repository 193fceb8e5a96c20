"""The stolen copies' figures: fidelity against queries, Q90/Q95 per cell, their spread over seeds, the best copy.

Q90 (Q95) is the fewest measured queries of a cell's ladder whose copy reached 90 % (95 %) fidelity on the
victim's test split; a cell whose top rung did not reach it reads "not reached within N" (N: the top rung's
queries, from the ledger). Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit.options import ANSWERS
from stealkit.audit.parts import THRESHOLDS, Copy, kind_of, pct, q_at, stolen_copies

if TYPE_CHECKING:
    from stealkit.report.html import Section
    from stealkit.report.plots import Dash

WORDS = {"label": "top-1 labels", "topk": "top-k answers", "probs": "probabilities"}
#: a cell whose fidelity was not measured (a remote victim whose test-split answers the audit did not buy)
NOT_MEASURED = "not measured: the victim's labels of the test split are unknown"


def measured(points: Sequence[dict[str, Any]]) -> bool:
    """Every point of a cell has a fidelity: its Q90/Q95 is a measurement (reached, or not reached within N)."""
    return bool(points) and all(p.get("fidelity") is not None for p in points)


def q_value(points: Sequence[dict[str, Any]], threshold: float) -> int | str:
    """A cell's Q90/Q95: the queries that reached ``threshold``, "not reached within N" (N: its top rung's
    queries), or :data:`NOT_MEASURED` — never "not reached" where nothing was measured."""
    if not measured(points):
        return NOT_MEASURED
    q = q_at(points, threshold)
    if q is not None:
        return q
    return f"not reached within {max(p['total_queries'] for p in points):,}"


def extractions(results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> list[dict[str, Any]]:
    return stolen_copies(results, kinds)


def headline(stolen: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (answer kind, attacker, defence) of the stolen copies: fidelity at each rung, Q90 and Q95
    (or "not reached within N")."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in stolen:
        p = r["part"]
        cells.setdefault((p["answers"], p["attacker"], p.get("defence", "")), []).append(r)
    rows = []
    for (answers, attacker, defence), points in cells.items():
        points = sorted(points, key=lambda r: r["part"]["budget"])
        row: dict[str, Any] = {"answers": answers, "attacker": attacker}
        if any(k[2] for k in cells):
            row["defence"] = defence or "none"
            row["served accuracy"] = points[0].get("served_accuracy") if defence else points[0].get("victim_accuracy")
        for p in points:
            row[f"fidelity @{p['part']['budget']}"] = p["fidelity"]
        for t in THRESHOLDS:
            row[f"Q{round(t * 100)}"] = q_value(points, t)
        rows.append(row)
    rungs = sorted({int(k.split("@")[1]) for r in rows for k in r if k.startswith("fidelity @")})
    order = [k for r in rows for k in r if not k.startswith("fidelity @") and not k.startswith("Q")]
    order = [*dict.fromkeys(order), *(f"fidelity @{b}" for b in rungs), *(f"Q{round(t * 100)}" for t in THRESHOLDS)]
    return [{k: r[k] for k in order if k in r} for r in rows]


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def seed_spread(results: Sequence[dict[str, Any]], kind: str = "extract") -> list[dict[str, Any]]:
    """Q90/Q95 over seeds, per answer kind, of the attacker with data like the victim's (the undefended ladder
    at the seed and its repeats): every seed's value, the median and the range, on the rungs every seed has (a
    gate's extension rungs run at the audit's seed only). A seed that did not reach the level counts as more than
    its top rung: the median is "not reached" when it falls there."""
    seeds: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in results:
        p = r["part"]
        if kind_of(r) == kind and p["attacker"] == "like" and not p.get("defence"):
            seeds.setdefault(p["answers"], {}).setdefault(int(p.get("seed_offset") or 0), []).append(r)
    rows = []
    for answers, by_seed in seeds.items():
        if len(by_seed) < 2 or not all(measured(points) for points in by_seed.values()):
            continue
        common = set.intersection(*({int(p["part"]["budget"]) for p in pts} for pts in by_seed.values()))
        if not common:  # no rung every seed has: nothing to compare
            continue
        by_seed = {k: [p for p in pts if int(p["part"]["budget"]) in common] for k, pts in by_seed.items()}
        row: dict[str, Any] = {"answers": answers, "attacker": "like", "seeds": len(by_seed)}
        for t in THRESHOLDS:
            level = f"Q{round(t * 100)}"
            values, tops = [], []
            for _, points in sorted(by_seed.items()):
                q = q_at(points, t)
                values.append(math.inf if q is None else q)
                tops.append(max(p["total_queries"] for p in points))
            top = max(tops)
            reached = [v for v in values if v != math.inf]
            med = _median(values)
            row[f"{level} per seed"] = ", ".join("–" if v == math.inf else f"{int(v):,}" for v in values)
            row[f"{level} median"] = (f"not reached within {top:,}" if med == math.inf else
                                      int(med) if float(med).is_integer() else med)
            lo, hi = (f"{int(min(reached)):,}", f"{int(max(reached)):,}") if reached else ("", "")
            row[f"{level} range"] = (f"not reached within {top:,}" if not reached else
                                     f"{lo} to not reached within {top:,}" if len(reached) < len(values) else
                                     lo if lo == hi else f"{lo}-{hi}")
        rows.append(row)
    return rows


def best_copy(results: Sequence[dict[str, Any]], parts_dir: Path, kind: str = "extract") -> Copy | None:
    """The stolen copy the attacks start from: the undefended extraction with the highest fidelity (the fewest
    queries on a tie); without fidelities (a remote victim), the largest budget of the richest answers."""
    mine = [r for r in results if kind_of(r) == kind and not r["part"].get("defence")]
    if not mine:
        return None
    rank = {a: i for i, a in enumerate(ANSWERS)}
    if all(r.get("fidelity") is not None for r in mine):
        best = max(mine, key=lambda r: (r["fidelity"], -r["total_queries"]))
    else:
        best = max(mine, key=lambda r: (r["part"]["attacker"] == "like", r["part"]["budget"],
                                        rank.get(r["part"]["answers"], -1)))
    return Copy(best["id"], str(parts_dir / best["id"]), best.get("fidelity"), best["total_queries"])


def _words(q: Any) -> str:
    return f"{q:,}" if isinstance(q, int) else str(q)


def copy_sentences(summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
    """Plain words on the copies: the best copy per answer kind, Q90 with probabilities against labels, each
    defence's cost and Q90, and the spread of Q90 over seeds."""
    out = []
    stolen = extractions(summary.get("parts") or [], kinds)
    for answers in dict.fromkeys(r["part"]["answers"] for r in stolen):
        mine = [r for r in stolen if r["part"]["answers"] == answers and r["fidelity"] is not None]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["fidelity"], -r["total_queries"]))
        p = best["part"]
        data = {"like": f"data like yours ({p['pool']})", "unrelated": f"only unrelated data ({p['pool']})",
                "data-free": "no data at all (a generator makes the queries)"}.get(p["attacker"], p["pool"])
        out.append(f"With {best['total_queries']:,} queries answered with {WORDS[answers]} and {data}, an "
                   f"attacker gets a copy that agrees with your model on {100 * best['fidelity']:.1f} % of test "
                   "inputs.")
    rows = summary.get("headline") or []
    q = {(r["answers"], r["attacker"]): r["Q90"] for r in rows if r.get("defence", "none") == "none"}
    if ("probs", "like") in q and ("label", "like") in q:
        out.append(f"With data like yours, Q90 (queries to a 90 % copy) is {_words(q[('probs', 'like')])} with "
                   f"probabilities and {_words(q[('label', 'like')])} with top-1 labels only.")
    from stealkit.audit.defences import best_q

    for defence in dict.fromkeys(r["defence"] for r in rows if r.get("defence", "none") != "none"):
        mine = [r for r in rows if r.get("defence") == defence and r["attacker"] == "like"]
        served = next((r for r in mine if r["answers"] == "probs"), mine[0])
        best = best_q(mine) or served
        who = " (the label recipe on its argmax)" if best["answers"] == "label" else ""
        out.append(f"Serving probabilities through the defence {defence} gives honest users "
                   f"{pct(served['served accuracy'])} accuracy and "
                   + (f"puts Q90 at {best['Q90']:,} queries{who}." if isinstance(best["Q90"], int) else
                      f"keeps the copy under 90 % fidelity ({best['Q90']} queries, every attacker)."))
    spread = summary.get("spread") or []
    if spread:
        parts = [f"{r['Q90 range']} with {WORDS.get(r['answers'], r['answers'])}" for r in spread]
        out.append(f"Repeated at {spread[0]['seeds']} seeds with data like yours, Q90 ranges {', '.join(parts)}.")
    return out


#: the fidelity plot's line per attacker (its colour is the answer kind's; a defended cell is dash-dot with a
#: marker of its defence's own)
_DASHES: dict[str, Dash] = {"like": "solid", "unrelated": "dashed", "data-free": "dotted"}
_MARKERS = ("s", "^", "D", "v", "P", "X")


def sections(summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
    """Fidelity against queries per answer kind and attacker with the Q90/Q95 table, and the spread over seeds."""
    from stealkit.report.html import Figure, Section
    from stealkit.report.plots import SeriesStyle, line_plot

    sec = Section("Extraction risk: fidelity against queries, Q90 and Q95", paragraphs=[
        "Fidelity: agreement of the stolen copy with the victim on the test split. Q90/Q95: the fewest "
        "measured queries whose copy reached 90 %/95 % fidelity (the audit's ladder of budgets; each "
        "point is one run of the default `stealkit extract surrogate` recipe)."],
        tables=[("", summary.get("headline") or [])])
    stolen = [r for r in extractions(summary.get("parts") or [], kinds) if r.get("fidelity") is not None]
    defences = list(dict.fromkeys(r["part"]["defence"] for r in stolen if r["part"].get("defence")))
    answers_rank = {a: i for i, a in enumerate(ANSWERS)}
    attacker_rank = {a: i for i, a in enumerate(_DASHES)}

    def cell(r: dict[str, Any]) -> tuple[Any, ...]:  # the legend's order: by answer kind, undefended first
        p = r["part"]
        defence = p.get("defence") or ""
        return (answers_rank.get(p["answers"], len(ANSWERS)), p["answers"], defences.index(defence) + 1 if defence else 0,
                attacker_rank.get(p["attacker"], len(_DASHES)), p["attacker"])

    series: dict[str, tuple[list[float], list[float]]] = {}
    styles: dict[str, SeriesStyle] = {}
    for r in sorted(stolen, key=lambda r: (cell(r), r["part"]["budget"])):
        p = r["part"]
        defence = p.get("defence") or ""
        name = f"{p['answers']} {p['attacker']}" + (f" through {defence}" if defence else "")
        xs, ys = series.setdefault(name, ([], []))
        xs.append(r["total_queries"])
        ys.append(r["fidelity"])
        styles[name] = (SeriesStyle(p["answers"], "dashdot", _MARKERS[defences.index(defence) % len(_MARKERS)])
                        if defence else SeriesStyle(p["answers"], _DASHES.get(p["attacker"], "dashdot")))
    if series:
        uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="fidelity on the test split",
                        logx=True, hlines={"90 %": 0.9, "95 %": 0.95}, ylim=(0, 1.02), styles=styles)
        sec.figures.append(Figure(uri, "Fidelity of the stolen copy against queries: colour, the answer kind; line, "
                                       "the attacker (data like the victim's: solid, unrelated: dashed, data-free: "
                                       "dotted); a defended cell: dash-dot, with its own marker"))
    out = [sec]
    if summary.get("spread"):
        out.append(Section("Q90 and Q95 over seeds", paragraphs=[
            "The undefended ladder of the attacker with data like the victim's, repeated at other seeds where the "
            "plan had room: each seed's Q90/Q95 (\"–\": not reached within its top rung), their median and range."],
            tables=[("", summary["spread"])]))
    return out
