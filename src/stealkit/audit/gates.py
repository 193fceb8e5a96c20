"""``--fail-if`` gates: what each one needs measured, the ladder's extension that measures it, the verdicts and
the exit codes.

A gate looks at the undefended cells of the attacker with data like the victim's (one answer kind, or all). Q90 is
read off a ladder of rungs, so a gate is decided by one rung, its *target* (:attr:`GateSpec.target`): ``q90<N``
asks whether fewer than N queries make a 90 % copy, so the rung N - 1 decides it (reached there or below: fail;
not reached at N - 1 or above: pass); ``q90>N`` asks whether N queries do, so the rung N decides it (reached
within N: pass; not reached at N or above: fail). Anything else is *open*: the level was not reached within the
top rung below the target, or it was reached only above it, between two rungs the target lies between.

When a gate is open after the ladder, the audit extends the ladder of the open cells: rungs doubling from the
highest rung below the target, the last one the target itself, each within the attacker's pool (one query is one
distinct image) and within ``--max-queries`` (:func:`plan_extension` reserves them before the data-free and
explanation parts take what is left). They run one rung at a time and stop as soon as every gate is decided
(:func:`extend`); a gate still open then cannot be decided (exit 3), and its line says where the ladder stopped
and why. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stealkit.audit.options import GateSpec, parse_gate
from stealkit.audit.parts import TOLERANCE, Part, PlanContext, stolen_copies

#: the command's exit codes: the gates passed (or none), a gate failed, bad input, a gate could not be decided
EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_UNDECIDED = 0, 1, 2, 3


@dataclass(frozen=True)
class Gate:
    """One ``--fail-if`` gate's verdict: ``fail``, ``pass`` (every cell it covers measured and decided by a rung
    at or beyond its target), or ``undecided`` (a cell not measured, or open where the ladder stops)."""

    gate: str
    status: str
    line: str


def gate_cells(results: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The results the gates read, by answer kind: the undefended stolen copies of the attacker with data like
    the victim's, at the audit's own seed."""
    from stealkit.audit.kinds import KINDS

    cells: dict[str, list[dict[str, Any]]] = {}
    for r in stolen_copies(results, KINDS):
        p = r["part"]
        if p["attacker"] == "like" and not p.get("defence"):
            cells.setdefault(p["answers"], []).append(r)
    return cells


def cell_verdict(answers: str, points: Sequence[dict[str, Any]], spec: GateSpec) -> tuple[str, str]:
    """``(status, words)`` of one cell under one gate: ``fail``, ``pass``, ``open`` or ``unmeasured``."""
    from stealkit.audit.copies import measured

    if not measured(points):
        return "unmeasured", f"{answers} answers: fidelity not measured (the victim's labels of the test split are unknown)"
    level, target = spec.level / 100, spec.target
    reached = sorted(int(p["total_queries"]) for p in points if p["fidelity"] >= level - TOLERANCE)
    unreached = sorted(int(p["total_queries"]) for p in points if p["fidelity"] < level - TOLERANCE)
    if reached and reached[0] <= target:
        words = f"{answers} answers reach {spec.level} % fidelity with {reached[0]:,} queries"
        return ("fail" if spec.op == "<" else "pass"), words
    if unreached and unreached[-1] >= target:
        words = f"{answers} answers do not reach {spec.level} % fidelity within {unreached[-1]:,} queries"
        return ("pass" if spec.op == "<" else "fail"), words
    below = [u for u in unreached if u < target]
    if reached:
        since = f"more than {below[-1]:,}" if below else "some"
        return "open", (f"{answers} answers reach {spec.level} % fidelity with {reached[0]:,} queries and not with "
                        f"{since}; no rung at {target:,} measured")
    return "open", f"{answers} answers: not reached within {unreached[-1]:,} queries"


def decide_gates(results: Sequence[dict[str, Any]], gates: Sequence[str],
                 stops: Mapping[str, str] | None = None) -> list[Gate]:
    """Each gate over its cells; ``stops``: why each answer kind's ladder stops where it does (the plan's
    :attr:`Extension.stops`), said in the line of a gate it leaves undecided."""
    cells = gate_cells(results)
    out = []
    for gate in gates:
        spec = parse_gate(gate)
        mine = {a: pts for a, pts in cells.items() if spec.answers in (None, a)}
        verdicts = {a: cell_verdict(a, pts, spec) for a, pts in mine.items()}
        fails = [w for s, w in verdicts.values() if s == "fail"]
        unsure = [] if mine else [f"no undefended cell of {spec.answers or 'any'} answers was audited"]
        for a, (status, words) in verdicts.items():
            if status == "unmeasured":
                unsure.append(words)
            elif status == "open":
                unsure.append(f"{words}; {_stop_words(a, mine[a], spec, (stops or {}).get(a))}")
        if fails:
            out.append(Gate(gate, "fail", f"--fail-if {gate}: " + "; ".join(fails)))
        elif unsure:
            out.append(Gate(gate, "undecided", f"--fail-if {gate}: cannot decide: " + "; ".join(unsure)))
        else:
            out.append(Gate(gate, "pass", f"--fail-if {gate}: passed (measured): "
                                          + "; ".join(w for _, w in verdicts.values())))
    return out


def _stop_words(answers: str, points: Sequence[dict[str, Any]], spec: GateSpec, why: str | None) -> str:
    below = [int(p["total_queries"]) for p in points if int(p["total_queries"]) < spec.target]
    at = f"the ladder stops at {max(below):,}" if below else "the ladder has no rung"
    if why:
        return f"{at}, below {spec.target:,} ({why})"
    return f"{at}, below {spec.target:,} (add a rung of {spec.target:,} to --budgets)"


def exit_code(gates: Sequence[Gate]) -> int:
    """1 when a gate failed, else 3 when one could not be decided, else 0."""
    if any(g.status == "fail" for g in gates):
        return EXIT_FAIL
    return EXIT_UNDECIDED if any(g.status == "undecided" for g in gates) else EXIT_PASS


# -- the extension: planned within the pool and --max-queries, run while a gate is open -------------------------
@dataclass
class Extension:
    """The ladder's extension rungs for the gates (in the order they may run) and, per answer kind whose
    extension stops below its highest target, why (the pool's size, ``--max-queries``)."""

    parts: list[Part]
    notes: list[str]
    stops: dict[str, str]


def extension_rungs(base: Sequence[int], targets: Sequence[int], size: int | None) -> list[int]:
    """The rungs a cell adds to decide gates at ``targets``: doubling from its highest rung below the highest
    target, and each target itself; within the pool's ``size`` (a rung above it runs at it); none a rung the
    cell already has, and none where a target is already a rung."""
    cap = (lambda b: min(b, size)) if size is not None else (lambda b: b)
    have = {cap(b) for b in base}
    wanted = sorted({cap(t) for t in targets if cap(t) not in have})
    if not wanted:
        return []
    top = wanted[-1]
    start = max((b for b in have if b < top), default=0)
    rungs = set(wanted)
    b = start * 2
    while 0 < b < top:
        rungs.add(cap(b))
        b *= 2
    return sorted(r for r in rungs if r not in have and r > 0)


def plan_extension(ctx: PlanContext, cell_rungs: Callable[[tuple[str, str, str, str]], list[int]],
                   room: int) -> Extension:
    """The extension rungs of every cell a gate covers, cheapest first across cells, as far as ``room``
    queries hold (a cell's rungs stop at the first that does not fit)."""
    from stealkit.audit.kinds.extraction import estimate_seconds

    specs = [parse_gate(g) for g in ctx.options.fail_if]
    if not specs or not ctx.fidelity_measured:
        return Extension([], [], {})
    attacker, pool = next(iter(ctx.options.attackers.items()))
    size = ctx.pool_sizes.get(pool)
    wanted: dict[str, list[int]] = {}
    stops: dict[str, str] = {}
    for a in ctx.options.answers:
        targets = [s.target for s in specs if s.answers in (None, a)]
        if not targets:
            continue
        rungs = extension_rungs(cell_rungs((a, attacker, pool, "")), targets, size)
        if rungs:
            wanted[a] = rungs
        if size is not None and size < max(targets):
            stops[a] = f"the query source {pool} holds {size:,} images; give --pool more"
    parts: list[Part] = []
    stopped: set[str] = set()
    notes: list[str] = []
    shape, recipe = ctx.shape, ctx.options.recipe
    for i in range(max((len(r) for r in wanted.values()), default=0)):
        for a, rungs in wanted.items():
            if i >= len(rungs) or a in stopped:
                continue
            if rungs[i] > room:
                stopped.add(a)
                stops[a] = (f"--max-queries {ctx.options.max_queries:,} leaves {room:,} queries, not the next "
                            f"rung's {rungs[i]:,}; raise --max-queries")
                continue
            room -= rungs[i]
            parts.append(Part(a, attacker, pool, rungs[i], round(estimate_seconds(
                rungs[i], a, shape.num_classes, recipe, shape.pixels), 1)))
    if parts:
        rungs = "; ".join(f"{a} answers {', '.join(f'{p.budget:,}' for p in parts if p.answers == a)}"
                          for a in dict.fromkeys(p.answers for p in parts))
        notes.append(f"--fail-if: where the ladder leaves a gate undecided, the attacker with data like the "
                     f"victim's gets extension rungs ({rungs} queries), run one at a time until every gate is decided")
    for a, why in stops.items():
        top = max([*cell_rungs((a, attacker, pool, "")), *(p.budget for p in parts if p.answers == a)])
        target = max(s.target for s in specs if s.answers in (None, a))
        notes.append(f"--fail-if: the ladder of {a} answers stops at {top:,}, below {target:,} ({why}): a gate it "
                     "leaves open there cannot be decided (exit 3)")
    return Extension(parts, notes, stops)


def next_rungs(extension: Sequence[Part], results: Sequence[dict[str, Any]], gates: Sequence[str]) -> list[Part]:
    """The next extension rung of every cell left open by a gate that no cell has failed yet (a rung more
    there can decide it); empty when every gate is decided or no planned rung is left."""
    from stealkit.audit.kinds import part_id

    cells = gate_cells(results)
    wanted: set[str] = set()
    for gate in gates:
        spec = parse_gate(gate)
        verdicts = {a: cell_verdict(a, pts, spec)[0] for a, pts in cells.items() if spec.answers in (None, a)}
        if "fail" not in verdicts.values():
            wanted |= {a for a, s in verdicts.items() if s == "open"}
    have = {r["id"] for r in results}
    out = []
    for a in dict.fromkeys(p.answers for p in extension):
        pending = sorted((p for p in extension if p.answers == a and part_id(p) not in have), key=lambda p: p.budget)
        if a in wanted and pending:
            out.append(pending[0])
    return out


def extend(extension: Sequence[Part], results: list[dict[str, Any]], gates: Sequence[str],
           run_rungs: Callable[[list[Part]], list[dict[str, Any]]],
           echo: Callable[[str], None] = lambda s: None) -> tuple[list[dict[str, Any]], list[Part]]:
    """Run extension rungs, a rung per open cell at a time, until every gate is decided or the planned rungs
    are spent; every result, and the rungs run."""
    from stealkit.audit.kinds import part_id

    ran: list[Part] = []
    while nxt := next_rungs(extension, results, gates):
        echo(f"ladder extended for an undecided --fail-if: {', '.join(part_id(p) for p in nxt)}")
        results = [*results, *run_rungs(nxt)]
        ran += nxt
    return results, ran
