"""The audit's summary, its plain words, its terminal tables and its report page.

:func:`summarise` gathers every kind's tables (:data:`stealkit.audit.kinds.KINDS`), the defence table and the
plain-words sentences into the summary (``summary.json`` and ``audit.json``); :func:`sections` renders the report
from that summary alone (kind ``audit`` in :data:`stealkit.report.kinds.BUILDERS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stealkit.audit.defences import add_serving, flagged_text, serving_sections
from stealkit.audit.gates import (  # noqa: F401  (the gates' verdicts and exit codes, as they were named here)
    EXIT_FAIL,
    EXIT_INPUT,
    EXIT_PASS,
    EXIT_UNDECIDED,
    Gate,
    decide_gates,
    exit_code,
)
from stealkit.audit.kinds import KINDS
from stealkit.audit.parts import Part, stolen_copies
from stealkit.audit.reconcile import reconciliation_line

if TYPE_CHECKING:
    from stealkit.report.html import Section
    from stealkit.rundir import RunDir

#: the summary's tables in the order the terminal prints them (after the headline)
TABLES = ("enables", "explanations", "spread", "serving")


def summarise(parts: Sequence[Part], results: Sequence[dict[str, Any]], max_queries: int, notes: Sequence[str],
              costs: dict[str, dict[str, float]] | None, top_k: int, evaluation: Any = None) -> dict[str, Any]:
    """Every figure of the audit: the ledgers' total (the attacks'; a remote victim's evaluation queries apart),
    each kind's tables, the defence table, the sentences. The victim's accuracy is its accuracy on the whole test
    split (from its model, or from the labels bought), never a part's sample."""
    spent = sum(r["total_queries"] for r in results)
    evaluated = sum(evaluation.queries.values()) if evaluation is not None else 0
    assert spent + evaluated <= max_queries, (spent, evaluated, max_queries)  # the plan fits; every oracle is metered
    stolen = stolen_copies(results, KINDS)
    victim_accuracy = evaluation.victim_accuracy if evaluation is not None else next(
        (r["victim_accuracy"] for r in stolen if r.get("victim_accuracy") is not None), None)
    out: dict[str, Any] = {"method": "audit", "victim_accuracy": victim_accuracy, "queries": spent,
                           "max_queries": max_queries, "planned_queries": sum(p.budget for p in parts),
                           "headline": [], "enables": [], "parts": list(results)}
    if evaluation is not None:
        out["evaluation"] = evaluation.summary()
    for kind in KINDS.values():
        for name, rows in kind.rows(results, KINDS).items():
            out.setdefault(name, []).extend(rows)
    out["sentences"] = [s for kind in KINDS.values() for s in kind.sentences(out, KINDS)]
    if notes or any(r["fidelity"] is None for r in stolen):
        out["notes"] = [*notes] + ([] if all(r["fidelity"] is not None for r in stolen) else [
            "fidelity needs the victim's own labels of the test split, which a remote victim does not give: "
            "Q90/Q95 are not measured"])
    add_serving(out, costs, top_k)
    from stealkit.audit.verdict import verdict

    out["verdict"] = verdict(out)
    return out


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every row's columns in the rows' own order: a column only a later row has (the data-free row's
    ``fidelity @2000``) goes before the first column that follows it there (``Q90``), not at the end."""
    cols: list[str] = []
    for r in rows:
        keys = list(r)
        for i, c in enumerate(keys):
            if c not in cols:
                after = next((k for k in keys[i + 1:] if k in cols), None)
                cols.insert(cols.index(after) if after is not None else len(cols), c)
    return cols


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = _columns(rows)
    cells = [list(cols)] + [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)


def terminal_lines(summary: dict[str, Any], report_path: Any) -> list[str]:
    """What the command prints when the audit ends: the headline, the other tables, the totals."""
    lines = [*summary.get("verdict", []), "", format_table(summary["headline"])]
    extra = [t for t in summary if t not in (*TABLES, "headline") and isinstance(summary[t], list)
             and summary[t] and isinstance(summary[t][0], dict) and t not in ("parts", "prada", "gates")]
    for table in (*TABLES, *extra):
        if summary.get(table):
            lines += ["", format_table(summary[table])]
    evaluated = sum((summary.get("evaluation") or {}).get("queries", {}).values())
    extra = f" and {evaluated:,} evaluation queries (the test split's labels)" if evaluated else ""
    lines.append(f"queries {summary['queries']:,}{extra} of --max-queries {summary['max_queries']:,} (from the "
                 f"ledgers); report: {report_path}")
    if summary.get("reconciliation"):
        lines.append(reconciliation_line(summary["reconciliation"]))
    return lines


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """The audit's report: the plain words, each kind's sections (the extraction risk first), the server's
    count, the defence and PRADA tables, and every part."""
    from stealkit.report.html import Section

    out = [Section("Verdict", paragraphs=[str(s) for s in summary.get("verdict") or []]),
           Section("In plain words", paragraphs=[str(s) for s in summary.get("sentences") or []])]
    kind_sections = [s for kind in KINDS.values() for s in kind.sections(summary, KINDS)]
    out += kind_sections[:1]
    if summary.get("reconciliation"):
        out.append(Section("Queries reconciled with the server",
                           paragraphs=[reconciliation_line(summary["reconciliation"])]))
    out += kind_sections[1:]
    out += serving_sections(summary)
    table = [{"part": r["id"], "queries": r["total_queries"], "fidelity": r.get("fidelity"),
              "accuracy": r.get("accuracy"), "served accuracy": r.get("served_accuracy"),
              "PRADA flagged at": flagged_text(r.get("prada")),
              "recipe": r.get("preset_resolved") or r.get("command"), "seconds": r["elapsed_s"]}
             for r in summary.get("parts") or []]
    out.append(Section("Parts", tables=[("", table)]))
    return out
