"""The audit's blocks of ``docs/results.md`` (``benchmarks/results_tables.py`` renders them): the serving tables
before and after the adaptive attackers, from committed ``audit.json`` files in ``results/rows/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _q(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else str(v)


def _serving_before_after(rows: Path, before_file: str, after_file: str) -> str:
    """The serving table before and after the adaptive attackers, with the attacker that won each choice."""
    before = json.loads((rows / before_file).read_text(encoding="utf-8"))
    after = json.loads((rows / after_file).read_text(encoding="utf-8"))
    old = {r["serving"]: r for r in before["serving"]}
    argmax = {r["defence"]: r["Q90"] for r in after["headline"]
              if r.get("defence", "none") != "none" and r["answers"] == "label" and r["attacker"] == "like"}
    out = [f"Queries: {before['queries']:,} before, {after['queries']:,} after (of {before['planned_queries']:,} and "
           f"{after['planned_queries']:,} planned).", "",
           "| serving | Q90 before | Q90 after | the attacker that won | served accuracy | ECE |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in after["serving"]:
        q_after = _q(r["attacker Q90"])
        if r["serving"].endswith("noise:sigma=0.05") and old[r["serving"]]["attacker Q90"] != r["attacker Q90"]:
            q_after = f"**{q_after}**"
        won = r["best attacker"]
        defence = r["serving"].split(" through ")[1] if " through " in r["serving"] else None
        if defence and won == "probability recipe" and defence in argmax:
            won += f" (the argmax: {_q(argmax[defence])} too)" if argmax[defence] == r["attacker Q90"] else \
                f" (the argmax: {_q(argmax[defence])})"
        out.append(f"| {r['serving']} | {_q(old[r['serving']]['attacker Q90'])} | {q_after} | {won} | "
                   f"{r['served accuracy']:.3f} | {r['ECE']:.3f} |")
    return "\n".join(out)


def audit_adaptive(rows: Path) -> str:
    """The serving table of the ``--quick`` digits audit before (``1e82ecb``) and after the adaptive attackers,
    from the two committed ``audit.json`` files."""
    return _serving_before_after(rows, "audit-digits-quick-1e82ecb.json", "audit-digits-quick-adaptive.json")


def _cell(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else "–" if v is None else _q(v)


def audit_fmnist(rows: Path) -> str:
    """The default Fashion-MNIST audit after the adaptive attackers: the serving table against the one recorded at
    ``9b4c833`` (transcribed: that run kept no ``audit.json``), then every cell of the headline (answer kind,
    attacker, defence) with its fidelity per rung."""
    after = json.loads((rows / "audit-fmnist-default-adaptive.json").read_text(encoding="utf-8"))
    rungs = list(dict.fromkeys(k for r in after["headline"] for k in r if k.startswith("fidelity @")))
    out = [_serving_before_after(rows, "audit-fmnist-default-9b4c833.json", "audit-fmnist-default-adaptive.json"), "",
           "| answers | attacker | defence | " + " | ".join(rungs) + " | Q90 | Q95 |",
           "| --- | --- | --- | " + " | ".join("---" for _ in rungs) + " | --- | --- |"]
    for r in after["headline"]:
        out.append(f"| {r['answers']} | {r['attacker']} | {r.get('defence', 'none')} | "
                   + " | ".join(_cell(r.get(k)) for k in rungs) + f" | {_q(r['Q90'])} | {_q(r['Q95'])} |")
    return "\n".join(out + ["", "Verdict: " + " ".join(after.get("verdict") or [])])
