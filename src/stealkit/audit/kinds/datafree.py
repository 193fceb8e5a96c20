"""The audit's data-free attacker: the default data-free recipe (CoDFe with top-1 labels,
:mod:`stealkit.extract.datafree.recipes`) on what the plan leaves under ``--max-queries``, up to its cap.

A stopped part resumes from its own checkpoint (the data-free loop's answer journal): no query is paid twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit.parts import PART_SECONDS, Copy, Part, PlanContext, RunContext, pct

if TYPE_CHECKING:
    from stealkit.report.html import Section

#: the data-free part is left out when the plan leaves it fewer queries than this
DATAFREE_MIN = 500
#: the answers the data-free attacker gets (the most restrictive API: top-1 labels)
DATAFREE_ANSWERS = "label"
#: the data-free method of the default recipe (stealkit.extract.datafree.recipes)
DATAFREE_METHOD = "codfe"
#: rough seconds per data-free query (digits, one CPU thread); grows as pixels ** 1.1 (measured: 2,000 queries
#: 8.9 s on digits, 5,000 356 s on Fashion-MNIST)
DATAFREE_QUERY_SECONDS = 0.0045
DATAFREE_PIXEL_EXPONENT = 1.1


class DataFree:
    """``datafree``: ``stealkit extract codfe --mode label`` with the default recipe at ``budget`` queries."""

    name = "datafree"
    claim = "rest"
    needs_copy = False
    makes_copy = True

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        cap = ctx.sizes.datafree_budget
        if not cap:
            return [], []
        if ctx.shape.features is not None:
            from stealkit.audit.tabular import DATAFREE_NOT_MEASURED

            return [], [DATAFREE_NOT_MEASURED.format(d=ctx.shape.features)]
        budget = min(cap, room)
        if budget < DATAFREE_MIN:
            return [], [f"the data-free attacker left out: the plan leaves it {max(budget, 0):,} queries under "
                        f"--max-queries {ctx.options.max_queries:,}, fewer than {DATAFREE_MIN:,}"]
        seconds = PART_SECONDS + budget * DATAFREE_QUERY_SECONDS * max(1.0, ctx.shape.pixels / 64) ** \
            DATAFREE_PIXEL_EXPONENT
        return [Part(DATAFREE_ANSWERS, "data-free", "", budget, round(seconds, 1), kind=self.name)], []

    def part_id(self, part: Part) -> str:
        return f"datafree-{part.answers}-{part.budget}"

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        from stealkit.extract.datafree.recipes import DEFAULT
        from stealkit.extract.datafree.run import DataFreeOptions, run_datafree

        resume = (out / "checkpoint" / "checkpoint.json").exists()
        run = run_datafree(DATAFREE_METHOD, ctx.target, part.budget, mode=part.answers,
                           options=DataFreeOptions(eval_every=part.budget, preset=DEFAULT), out=out, resume=resume)
        queries = dict(run.queries)
        return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": run.accuracy,
                "fidelity": run.fidelity, "victim_accuracy": run.victim_accuracy, "served_accuracy": None,
                "preset_resolved": f"{DATAFREE_METHOD} {DEFAULT}", "resumed": resume,
                "summary_victim_queries": queries}

    def progress(self, result: dict[str, Any]) -> str:
        return f"fidelity {pct(result['fidelity'])}, accuracy {pct(result['accuracy'])}"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        return {}  # its row is in the headline (stealkit.audit.copies)

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        return []

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return []
