"""The audit's extraction parts: the default ``stealkit extract surrogate`` recipe (DFME appendix A with the
``auto`` preset) at a ladder of budgets, per answer kind and attacker, through an output defence where the cell
has one, and repeated at other seeds for the spread of Q90/Q95.

Each part runs :func:`~stealkit.extract.surrogate_data.run.run_surrogate` through a fresh oracle metered to the
part's budget; its answers are journalled as they arrive (:class:`~stealkit.extract.journal.JournalOracle`), so a
part stopped midway and run again from its start pays no query twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit import copies
from stealkit.audit.parts import PART_SECONDS, Copy, Part, PlanContext, RunContext, pct

if TYPE_CHECKING:
    from stealkit.extract.surrogate_data.run import SurrogateOptions
    from stealkit.report.html import Section

#: rough seconds per student optimiser step (conv2, batch 64, one shared CPU thread, digits' 64 pixels; a step
#: grows as pixels ** STEP_PIXEL_EXPONENT: a Fashion-MNIST probability part, 3,000 steps, took 208-211 s beside a
#: second worker), per query, and FixMatch's extra (it also trains on the unqueried pool), for the plan's
#: estimate (measured on digits, --quick, and Fashion-MNIST)
STEP_SECONDS = 0.01
STEP_PIXEL_EXPONENT = 0.8
QUERY_SECONDS = 0.0002
FIXMATCH_SECONDS = 5.0


def surrogate_options(recipe: Mapping[str, Any], answers: str, pool: str) -> SurrogateOptions:
    """The surrogate recipe of one part: ``extract surrogate``'s defaults, the audit's ``--set`` settings
    (a :class:`SurrogateOptions` field; ``student.KEY`` for the student; else a setting of its config) and the
    part's answer kind and pool."""
    from stealkit.extract.surrogate_data.run import SurrogateOptions
    from stealkit.settings import typed_settings

    names = {f.name for f in dataclasses.fields(SurrogateOptions)}
    fields = typed_settings(SurrogateOptions, {k: v for k, v in recipe.items() if k in names},
                            who="the audit's surrogate recipe")
    student = {k.split(".", 1)[1]: v for k, v in recipe.items() if k.startswith("student.")}
    settings = {k: v for k, v in recipe.items() if k not in names and not k.startswith("student.")}
    fields["student_kwargs"] = {**dict(fields.get("student_kwargs") or {}), **student}
    fields["settings"] = {**dict(fields.get("settings") or {}), **settings}
    return SurrogateOptions(**{**fields, "mode": answers, "pool": pool})


def estimate_seconds(budget: int, answers: str, num_classes: int, recipe: Mapping[str, Any],
                     pixels: int = 64) -> float:
    """A rough time for one part: the recipe's student optimiser steps at ``STEP_SECONDS`` (scaled to the
    victim's input size), the queries, a fixed cost per part and FixMatch's extra."""
    from stealkit.extract.surrogate_data.run import resolve_surrogate

    _, config = resolve_surrogate(surrogate_options(recipe, answers, "pool"), budget, num_classes)
    steps = config.student_epochs(budget, budget) * math.ceil(budget / config.batch_size)
    fixmatch = FIXMATCH_SECONDS if config.ssl != "none" else 0.0
    step = STEP_SECONDS * max(1.0, pixels / 64) ** STEP_PIXEL_EXPONENT
    return PART_SECONDS + fixmatch + steps * step + budget * QUERY_SECONDS


class Extraction:
    """``extract``: one surrogate extraction at ``budget`` queries of ``answers`` answers by ``attacker``
    querying ``pool`` (through ``defence``, if any); ``seed_offset`` k repeats it at the seed + k."""

    name = "extract"
    claim = "fixed"
    needs_copy = False
    makes_copy = True

    # -- the plan: cells and rungs (the budget loop itself is stealkit.audit.plan's) ----------------------------
    def cells(self, ctx: PlanContext) -> list[tuple[str, str, str, str]]:
        """(answers, attacker, pool, defence) of every cell: each answer kind per attacker, then each defence
        attacked by the attacker with data like the victim's twice, as an attacker who knows what is served
        adapts: the probability recipe on the defended probabilities, and the label recipe on their argmax (a
        defence that keeps the top class then never looks stronger than serving labels only)."""
        attackers = ctx.options.attackers
        like = next(iter(attackers.items()))
        defences = [*ctx.defences, *ctx.default_defences]
        out = [(a, name, pool, "") for a in ctx.options.answers for name, pool in attackers.items()]
        return out + [(a, like[0], like[1], d) for a in ("probs", "label") for d in defences]

    def cell_rungs(self, ctx: PlanContext, cell: tuple[str, str, str, str], rungs: Sequence[int]) -> list[int]:
        """A cell's rungs: the whole ladder, but two rungs for the probability recipe through a default defence
        (the audit's slowest parts; :func:`~stealkit.audit.defences.defence_rungs`)."""
        from stealkit.audit.defences import defence_rungs

        answers, _, pool, defence = cell
        size = ctx.pool_sizes.get(pool)
        if size is not None:  # a rung above the pool's size runs at it (its queries are what it spends)
            rungs = sorted({min(b, size) for b in rungs})
        return defence_rungs(rungs) if answers == "probs" and defence in ctx.default_defences else list(rungs)

    def ladder(self, ctx: PlanContext, rungs: Sequence[int]) -> list[Part]:
        """The ladder's parts, cheapest rung of every cell first (a stopped audit has a whole first row)."""
        shape = ctx.shape
        cells = [(cell, self.cell_rungs(ctx, cell, rungs)) for cell in self.cells(ctx)]
        return [Part(a, name, pool, b, round(estimate_seconds(b, a, shape.num_classes, ctx.options.recipe,
                                                              shape.pixels), 1), d)
                for b in sorted({b for _, mine in cells for b in mine})
                for (a, name, pool, d), mine in cells if b in mine]

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        return [], []  # the ladder is planned by stealkit.audit.plan (it shrinks to fit the fixed parts)

    def repeats(self, parts: Sequence[Part], seeds: int, room: int) -> tuple[list[Part], list[str]]:
        """The undefended ladder of the attacker with data like the victim's at the seed + 1, + 2, ..., as many
        as ``room`` queries hold, up to ``seeds`` in all; a note says how many fitted."""
        base = [p for p in parts if p.kind == self.name and p.attacker == "like" and not p.defence]
        if seeds <= 1 or not base:
            return [], []
        cost = sum(p.budget for p in base)
        extra = max(0, min(seeds - 1, room // cost))
        note = (f"spread over seeds: the ladder of the attacker with data like the victim's at {1 + extra} of "
                f"--seeds {seeds} seeds")
        if extra < seeds - 1:
            note += (f" (each seed more needs {cost:,} queries, the plan leaves {max(room - extra * cost, 0):,} "
                     f"under --max-queries {room + sum(p.budget for p in parts):,})")
        return [dataclasses.replace(p, seed_offset=k) for k in range(1, extra + 1) for p in base], [note]

    def part_id(self, part: Part) -> str:
        worn = "+" + "".join(c if c.isalnum() or c == "." else "_" for c in part.defence) if part.defence else ""
        again = f"-seed+{part.seed_offset}" if part.seed_offset else ""
        return f"extract-{part.answers}{worn}-{part.attacker}-{part.budget}{again}"

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        """One extraction through a fresh oracle metered to the part's budget, its answers journalled; the
        stolen copy saved in ``out/student`` (what the attacks read)."""
        from stealkit.audit.defences import build_defence
        from stealkit.extract.journal import JournalOracle
        from stealkit.extract.surrogate_data.run import run_surrogate
        from stealkit.serve.defences import served_accuracy

        seed = ctx.options.seed + part.seed_offset
        journals: list[JournalOracle] = []

        def journal(oracle: Any) -> JournalOracle:
            j = JournalOracle(oracle)
            j.open(ctx.parts_dir / f"{self.part_id(part)}.answers", replay=True)
            journals.append(j)
            return j

        # the owner's defence is one deployment: built from the audit's seed, whatever the part's seed
        worn = (build_defence(part.defence, ctx.target, seed=ctx.options.seed),) if part.defence else ()
        try:
            run = run_surrogate(ctx.target.with_seed(seed), part.budget,
                                surrogate_options(ctx.options.recipe, part.answers, part.pool), out=out,
                                defences=worn, wrap_oracle=journal, report=False,
                                config_extra={"defence": part.defence or None, "audit_part": self.part_id(part)})
        finally:
            for j in journals:
                j.close()
        served = None
        v = run.victim
        if part.defence and v.model is not None:  # the honest users' cost: top-1 accuracy served (no query)
            from stealkit.oracle.victim import victim_test

            test = victim_test(v, ctx.options.data_dir)
            served = served_accuracy(v.model, build_defence(part.defence, ctx.target, seed=ctx.options.seed),
                                     test.x, test.y)  # fresh noise
        queries = run.queries
        return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": run.accuracy,
                "fidelity": run.fidelity, "victim_accuracy": run.victim_accuracy, "served_accuracy": served,
                "preset_resolved": run.preset_resolved, "replayed": sum(j.replayed for j in journals)}

    def progress(self, result: dict[str, Any]) -> str:
        return f"fidelity {pct(result['fidelity'])}, accuracy {pct(result['accuracy'])}"

    # -- the summary and the report -------------------------------------------------------------------------------
    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        stolen = copies.extractions(results, kinds)
        return {"headline": copies.headline(stolen), "spread": copies.seed_spread(results, self.name)}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        return copies.copy_sentences(summary, kinds)

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return copies.sections(summary, kinds)
