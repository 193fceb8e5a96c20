"""The audit's figures as typed rows, for the Python API (:attr:`stealkit.audit.run.AuditResult.serving` etc.):
one :class:`ServingRow` per serving choice (the attacker's Q90 and Q95, the cost to honest users, PRADA), and the
summary's tables as lists of rows. Read from the summary alone, so a finished audit's ``audit.json`` gives them too
(:func:`read_audit`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.audit.defences import DERIVABLE, best_q

#: a Q90/Q95: the queries that reached the level, "not reached within N", or ``None`` (not measured)
Q = int | str | None
#: the summary's tables, as the terminal prints them
TABLE_NAMES = ("headline", "enables", "explanations", "spread", "serving", "prada")


@dataclass(frozen=True)
class ServingRow:
    """One serving choice of the audit's defence table. ``q90`` / ``q95``: the queries the best attacker that can
    use what is served needs for a copy agreeing with the victim on 90 % / 95 % of the test split (an ``int``),
    ``"not reached within N"``, or ``None`` where not measured; ``best_attacker``: whose Q90 that is;
    ``served_accuracy`` and ``ece``: what honest users get (top-1 accuracy and calibration error on the test
    split, ``None`` for a remote victim); ``prada_flagged_at``: PRADA's flag on that choice's longest run."""

    serving: str
    q90: Q
    q95: Q
    best_attacker: str | None
    served_accuracy: float | None
    ece: float | None
    prada_flagged_at: int | str | None


def _served(name: str) -> tuple[str, str]:
    """``(answers served, defence spec)`` of a serving row's name (:data:`stealkit.audit.defences.WORDS`)."""
    if " through " in name:
        return "probs", name.split(" through ", 1)[1]
    if name.startswith("top-1 label"):
        return "label", ""
    if name.startswith("top-k"):
        return "topk", ""
    return "probs", ""


def attackers_of(headline: Sequence[Mapping[str, Any]], served: str, spec: str) -> list[Mapping[str, Any]]:
    """The headline rows of the attackers with data like the victim's that can use what is served: through a
    defence, the cells run through it; else the undefended cells whose answers derive from what is served."""
    like = [h for h in headline if h["attacker"] == "like"]
    if spec:
        return [h for h in like if h.get("defence") == spec]
    return [h for h in like if h.get("defence", "none") == "none" and h["answers"] in DERIVABLE[served]]


def serving_rows(summary: Mapping[str, Any]) -> list[ServingRow]:
    """The summary's serving table as :class:`ServingRow` s; Q95 is the best Q95 among the same attackers Q90 is
    taken over (:func:`stealkit.audit.defences.best_q` at level Q95)."""
    headline = summary.get("headline") or []
    rows = []
    for r in summary.get("serving") or []:
        best95 = best_q(attackers_of(headline, *_served(r["serving"])), "Q95") or {}
        rows.append(ServingRow(serving=r["serving"], q90=r.get("attacker Q90"), q95=best95.get("Q95"),
                               best_attacker=r.get("best attacker"), served_accuracy=r.get("served accuracy"),
                               ece=r.get("ECE"), prada_flagged_at=r.get("PRADA flagged at")))
    return rows


def tables(summary: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every table of the summary that holds rows, by name (``headline``: fidelity at each rung, Q90 and Q95 per
    answer kind and attacker; ``serving``; ``enables``; ``explanations``; ``spread``; ``prada``)."""
    return {name: [dict(r) for r in summary[name]] for name in TABLE_NAMES
            if isinstance(summary.get(name), list) and summary[name]}


def read_audit(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A finished audit directory's summary (its ``audit.json`` without the options)."""
    data = json.loads((Path(path) / "audit.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if k not in ("audit", "seed")}
