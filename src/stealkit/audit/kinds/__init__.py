"""The table of audit part kinds: adding a part is one module here, one line in :data:`KINDS` and one size in
:class:`stealkit.audit.options.Sizes`. The plan, the execution and the report loop over this table."""

from __future__ import annotations

from stealkit.audit.kinds.attacks import Decision, Transfer
from stealkit.audit.kinds.datafree import DataFree
from stealkit.audit.kinds.explanations import ExactRecovery, GradientMatching
from stealkit.audit.kinds.extraction import Extraction
from stealkit.audit.parts import Part, PartKind

#: every kind, in the order its parts run and its sections appear (the extraction ladder first: the attacks
#: start from its best copy)
KINDS: dict[str, PartKind] = {k.name: k for k in (Extraction(), Transfer(), Decision(), DataFree(),
                                                   GradientMatching(), ExactRecovery())}
#: the kind whose ladder the plan shrinks to fit, whose best copy the attacks use and whose repeats make the spread
LADDER_KIND = "extract"


def part_id(part: Part) -> str:
    """The part's name: its folder, its checkpoint file and its line in the plan."""
    return KINDS[part.kind].part_id(part)
