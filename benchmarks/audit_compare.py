"""Two audits' figures side by side: every table and every part's figures equal, or where they differ.

Compares ``audit.json`` of two runs of the same plan (e.g. before and after a refactoring): the summary tables
(headline, enables, explanations, spread, serving, PRADA), the totals and each part's figures (queries, fidelity,
accuracy, served accuracy, the attacks' and explanation attacks' figures, PRADA's flag). Timings, recorded
commands and the answer journal's replay count are not figures and are left out. Prints JSON; exits 1 when a
figure differs.

    python benchmarks/audit_compare.py runs/audit-before/audit.json runs/audit-after/audit.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TABLES = ("headline", "enables", "explanations", "spread", "serving", "prada", "victim_accuracy", "queries",
          "planned_queries", "max_queries")
NOT_FIGURES = {"elapsed_s", "command", "replayed", "summary_victim_queries"}


def part_figures(part: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in part.items() if k not in NOT_FIGURES and k != "prada"}
    out["prada"] = {k: v for k, v in (part.get("prada") or {}).items() if k != "seconds"}
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    diffs = [{"table": t, "before": a.get(t), "after": b.get(t)} for t in TABLES if a.get(t) != b.get(t)]
    pa = {p["id"]: part_figures(p) for p in a.get("parts") or []}
    pb = {p["id"]: part_figures(p) for p in b.get("parts") or []}
    if list(pa) != list(pb):
        diffs.append({"table": "part ids", "before": list(pa), "after": list(pb)})
    for pid in set(pa) & set(pb):
        for key in sorted(set(pa[pid]) | set(pb[pid])):
            if pa[pid].get(key) != pb[pid].get(key):
                diffs.append({"part": pid, "field": key, "before": pa[pid].get(key), "after": pb[pid].get(key)})
    same_sentences = sorted(a.get("sentences") or []) == sorted(b.get("sentences") or [])
    return {"parts": len(pa), "tables_compared": list(TABLES), "differences": diffs, "equal": not diffs,
            "sentences_equal_as_a_set": same_sentences}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    doc = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    print(json.dumps(doc, indent=2))
    if not doc["equal"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
