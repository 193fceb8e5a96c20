"""The audit's verdict: three lines an owner reads first (the terminal's first lines, the report's first section).

1. how fast a copy is made from the richest answer audited (the best attacker's Q90) and what the copy enables;
2. the serving choice that raises Q90 most against the attackers that adapt to it, with its cost to honest users;
3. what was not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stealkit.audit.parts import pct

#: the serving choices from the richest answers to the poorest
RICHEST = ("probabilities", "top-k probabilities", "top-1 label")


def _strength(q: Any) -> tuple[int, int] | None:
    """How hard a Q90 is to get (larger is harder): a count, or "not reached within N" (harder than N); ``None``
    when not measured."""
    if isinstance(q, int):
        return (0, q)
    if isinstance(q, str) and q.startswith("not reached within "):
        return (1, int(q.rsplit(" ", 1)[1].replace(",", "")))
    return None


def _q(q: Any) -> str:
    return f"{q:,} queries" if isinstance(q, int) else str(q)


def verdict(summary: dict[str, Any]) -> list[str]:
    """The three lines (fewer where the audit measured nothing to say them)."""
    rows: Sequence[dict[str, Any]] = summary.get("serving") or []
    plain = [r for r in rows if " through " not in r["serving"]]
    now = next((r for name in RICHEST for r in plain if r["serving"].startswith(name)), None)
    out = []
    if now is not None:
        line = f"Served as {now['serving']}, a copy that agrees with your model on 90 % of test inputs takes "
        line += (_q(now["attacker Q90"]) + (f" ({now['best attacker']})" if now.get("best attacker") else "")
                 if _strength(now["attacker Q90"]) is not None else "an unknown number of queries (not measured)")
        transfer = next((r for r in summary.get("enables") or [] if r["attack"].startswith("PGD")), None)
        if transfer is not None and transfer.get("success") is not None:
            line += f"; from the best copy, PGD changes your model's answer on {pct(transfer['success'])} of the test images"
        out.append(line + ".")
        measured = [r for r in rows if _strength(r["attacker Q90"]) is not None]
        base = _strength(now["attacker Q90"])
        better = [r for r in measured if base is not None and _strength(r["attacker Q90"]) > base]  # type: ignore[operator]
        if better:
            def cost(r: dict[str, Any]) -> float:
                """What honest users lose against serving as now: top-1 accuracy lost plus calibration error
                gained (neither counted when it improves)."""
                acc_lost = (now.get("served accuracy") or 0.0) - (r.get("served accuracy") or 0.0)
                ece_gained = (r.get("ECE") or 0.0) - (now.get("ECE") or 0.0)
                return max(acc_lost, 0.0) + max(ece_gained, 0.0)

            top = max(_strength(r["attacker Q90"]) for r in better)  # type: ignore[type-var]
            best = min((r for r in better if _strength(r["attacker Q90"]) == top), key=cost)  # cheapest of the strongest
            acc = best.get("served accuracy")
            out.append(f"The serving change that raises Q90 most against attackers that adapt to it: {best['serving']} "
                       f"(Q90 {_q(best['attacker Q90'])}, best attacker: {best.get('best attacker') or '–'}), honest "
                       f"users' top-1 accuracy {pct(acc)} (now {pct(now.get('served accuracy'))}), calibration error "
                       f"{best.get('ECE') if best.get('ECE') is not None else '–'}.")
        elif base is not None:
            out.append(f"No serving choice audited raises Q90 above {now['serving']}'s against attackers that adapt "
                       "to it.")
    missing = [n for n in summary.get("notes") or [] if "not measured" in n or "left out" in n]
    out.append("Not measured: " + "; ".join(missing) + "." if missing else
               "Everything the plan held was measured.")
    return out
