"""The audit's plan: every part, in the order it runs, sized to fit ``--max-queries`` before any query.

The extraction ladder and the ``fixed`` kinds (the attacks from the stolen copy) come first: to fit, rungs are
dropped from the top of the ladder (down to one), then the fixed kinds' parts, the last kind first. The ``room``
kinds (the explanation attacks) take what is left, in table order; the ``rest`` kinds (the data-free attacker)
what they leave; the repeats of the ladder at other seeds (the spread of Q90/Q95) whatever remains. A
``--fail-if`` gate's extension rungs (:mod:`stealkit.audit.gates`) are reserved right after the fixed parts: they
run after every other part, only while a gate is undecided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stealkit.audit.kinds import KINDS, LADDER_KIND, part_id
from stealkit.audit.parts import Part, PlanContext
from stealkit.errors import InputError


@dataclass(frozen=True)
class Plan:
    """``parts``: what runs, in order; ``extension``: the gates' extension rungs, run after them only while a
    gate is undecided; ``stops``: why an answer kind's extension stops below a gate's decisive rung."""

    parts: list[Part]
    notes: list[str]
    extension: list[Part] = field(default_factory=list)
    stops: dict[str, str] = field(default_factory=dict)

    @property
    def queries(self) -> int:
        """The most the plan can spend: its parts and every extension rung."""
        return sum(p.budget for p in self.parts) + sum(p.budget for p in self.extension)


def make_plan(ctx: PlanContext) -> Plan:
    """The parts, in the order they run, and notes on what was left out to fit ``--max-queries``."""
    max_queries = ctx.options.max_queries
    ladder = ctx.options.ladder
    ext = KINDS[LADDER_KIND]
    rungs = sorted(set(ladder))
    cells = ext.cells(ctx)  # type: ignore[attr-defined]
    fixed = {k.name: k.plan(ctx, max_queries) for k in KINDS.values() if k.claim == "fixed" and k.name != LADDER_KIND}
    notes = [n for _, kind_notes in fixed.values() for n in kind_notes]

    def spend() -> int:
        ladder_queries = sum(sum(ext.cell_rungs(ctx, c, rungs)) for c in cells)  # type: ignore[attr-defined]
        return ladder_queries + sum(p.budget for parts, _ in fixed.values() for p in parts)

    while len(rungs) > 1 and spend() > max_queries:
        notes.append(f"rung {rungs[-1]:,} dropped: the plan would spend {spend():,} queries, more than "
                     f"--max-queries {max_queries:,}")
        rungs.pop()
    for name in reversed(list(fixed)):
        if spend() > max_queries and fixed[name][0]:
            notes.append(f"the {name} attack left out: the plan would spend {spend():,} queries, more than "
                         f"--max-queries {max_queries:,}")
            fixed[name] = ([], [])
    if spend() > max_queries:
        raise InputError(f"--max-queries {max_queries:,} is too small for any part: the smallest rung "
                         f"({min(ladder):,} queries) for {len(cells)} cells needs {len(cells) * min(ladder):,}; "
                         "raise --max-queries or lower --budgets")
    parts = ext.ladder(ctx, rungs)  # type: ignore[attr-defined]
    for pool, size in ctx.pool_sizes.items():
        if size is not None and max(rungs) > size:
            notes.append(f"the query source {pool} holds {size:,} images: its attacker's rungs above that run at "
                         f"{size:,} (one query is one distinct image)")
    short = ext.cell_rungs(ctx, ("probs", "", "", ctx.default_defences[0]), rungs) if ctx.default_defences \
        else rungs  # type: ignore[attr-defined]
    if ctx.default_defences and short != rungs:
        notes.append(f"the default defences ({', '.join(ctx.default_defences)}) are attacked by the probability "
                     f"recipe on two rungs of the ladder, its lowest and its middle "
                     f"({', '.join(f'{b:,}' for b in short)}: probability parts are the audit's slowest), and by "
                     "the label recipe on their argmax on every rung")
    for kind_parts, _ in fixed.values():
        parts += kind_parts
    from stealkit.audit.gates import plan_extension

    gated = plan_extension(ctx, lambda cell: ext.cell_rungs(ctx, cell, rungs), max_queries - spend())  # type: ignore[attr-defined]
    room = max_queries - spend() - sum(p.budget for p in gated.parts)
    room_parts: list[Part] = []
    room_notes: list[str] = []
    for kind in (k for k in KINDS.values() if k.claim == "room"):
        got, why = kind.plan(ctx, room)
        room_parts += got
        room_notes += why
        room -= sum(p.budget for p in got)
    for kind in (k for k in KINDS.values() if k.claim == "rest"):
        got, why = kind.plan(ctx, room)
        parts += got
        notes += why
        room -= sum(p.budget for p in got)
    parts += room_parts
    notes += room_notes
    left = max_queries - sum(p.budget for p in [*parts, *gated.parts])
    repeats, why = ext.repeats(parts, ctx.sizes.seeds, left)  # type: ignore[attr-defined]
    return Plan(parts + repeats, notes + why + gated.notes, gated.parts, gated.stops)


def format_plan(parts: Sequence[Part], max_queries: int, done: set[str], evaluation: int = 0,
                extension: Sequence[Part] = ()) -> str:
    """The plan as the terminal prints it; ``evaluation``: the evaluation queries bought first (a remote
    victim's labels of the test split), on a line of their own; ``extension``: the gates' extension rungs, after
    the parts, under a line of their own (the total counts them: the most the audit can spend)."""
    lines = [f"{'part':<42} {'queries':>8} {'est. time':>10}"]
    if evaluation:
        lines.append(f"{'evaluation: the test split labels':<42} {evaluation:>8,} {'':>10}")
    for p in parts:
        mark = "  (done: resumed)" if part_id(p) in done else ""
        lines.append(f"{part_id(p):<42} {p.budget:>8,} {p.estimate_s:>9.0f}s{mark}")
    if extension:
        lines.append("extension rungs for --fail-if (each runs only while a gate is undecided):")
    for p in extension:
        mark = "  (done: resumed)" if part_id(p) in done else ""
        lines.append(f"{'+ ' + part_id(p):<42} {p.budget:>8,} {p.estimate_s:>9.0f}s{mark}")
    total = sum(p.budget for p in [*parts, *extension]) + evaluation
    est = sum(p.estimate_s for p in [*parts, *extension])
    lines.append(f"{'total':<42} {total:>8,} {est:>9.0f}s  (of --max-queries {max_queries:,}; "
                 "times are rough, one CPU thread)")
    return "\n".join(lines)
