"""What every audit part kind shares: the :class:`Part`, the :class:`PartKind` protocol and small helpers.

A part is one attack through its own oracle, metered to its own budget. Each kind of part (an extraction, the
data-free attacker, transfer and decision attacks from the stolen copy, gradient matching, exact recovery) is one
module of :mod:`stealkit.audit.kinds` implementing :class:`PartKind`; :data:`stealkit.audit.kinds.KINDS` is the
table the plan, the execution and the report loop over. This module imports no kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from stealkit.audit.options import AuditOptions, Sizes
    from stealkit.oracle.victim import Target
    from stealkit.report.html import Section

#: the fidelity levels of Q90 and Q95
THRESHOLDS = (0.90, 0.95)
#: fidelities are float32 means: 405 of 450 agreeing reads 0.89999998, which reached 90 %
TOLERANCE = 1e-6
#: rough seconds each part costs whatever its size (the plan's time estimate)
PART_SECONDS = 2.0


@dataclass(frozen=True)
class Part:
    """One part of the audit: ``kind`` names its :class:`PartKind`; the other fields are the kind's sizes.

    ``answers``/``attacker``/``pool``: what the part's attacker gets and queries; ``budget``: its oracle's cap;
    ``defence``: an output defence the victim wears (a spec of :mod:`stealkit.serve.defences`, "" for none);
    ``n``/``per_image``/``substitute``: images, queries per image and whether the stolen copy helps (attacks);
    ``ladder``: rungs scored within one run (gradient matching); ``seed_offset``: repeated at ``seed`` + k."""

    answers: str
    attacker: str
    pool: str
    budget: int
    estimate_s: float = 0.0
    defence: str = ""
    kind: str = "extract"
    n: int = 0
    per_image: int = 0
    substitute: bool = False
    ladder: tuple[int, ...] = ()
    seed_offset: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class VictimShape:
    """What the plan knows of the victim without a query: its classes and input size (``features``: a
    feature-vector victim's ``d``, else ``None``)."""

    num_classes: int
    pixels: int
    features: int | None = None


@dataclass(frozen=True)
class PlanContext:
    """What a kind plans from: the options, the resolved sizes, the victim's shape and handle (read without a
    query), and ``memo``, where kinds keep what they read of the victim once (e.g. its explanation access)."""

    options: AuditOptions
    sizes: Sizes
    shape: VictimShape
    target: Target
    defences: tuple[str, ...] = ()          # explicit --defence cells
    default_defences: tuple[str, ...] = ()  # the default defence cells (two rungs each)
    memo: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    #: the images each attacker's query source holds (``None``: a synthetic source, unbounded): a query is one
    #: distinct image, so no rung can spend more
    pool_sizes: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    #: whether the audit measures fidelity (a remote victim whose test-split labels it cannot buy: no gate can
    #: be decided, so the ladder is not extended for one)
    fidelity_measured: bool = True


@dataclass(frozen=True)
class RunContext:
    """What a part runs with: the target (the opened victim's handle), the options and the parts' folder."""

    target: Target
    options: AuditOptions
    parts_dir: Path


@dataclass(frozen=True)
class Copy:
    """The stolen copy the attacks start from (the best extraction)."""

    id: str
    dir: str
    fidelity: float | None
    queries: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: how a kind's parts claim queries under --max-queries: ``fixed`` parts are planned with the extraction ladder
#: (the ladder shrinks to fit them, then they are dropped, last kind first); ``room`` parts take what the ladder
#: and the fixed parts leave, in table order; ``rest`` parts get what is left after all of those
Claim = Literal["fixed", "room", "rest"]


class PartKind(Protocol):
    """One kind of audit part: its plan, its run and what it adds to the summary and the report."""

    name: str
    claim: Claim
    needs_copy: bool   # runs after the extractions, from the best stolen copy
    makes_copy: bool   # its result is a stolen copy (headline, Q90/Q95, the copy the attacks start from)

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        """The kind's parts within ``room`` queries (``fixed`` kinds: as wanted), and notes on what was left out."""

    def part_id(self, part: Part) -> str: ...

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        """Run ``part`` into ``out``; its figures, with ``queries`` (the ledger's) and ``total_queries``."""

    def progress(self, result: dict[str, Any]) -> str: ...

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, PartKind]
             ) -> dict[str, list[dict[str, Any]]]:
        """Summary tables (name -> rows) from every result of the audit (``kinds``: the table, to tell which
        results are stolen copies)."""

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, PartKind]) -> list[str]: ...

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, PartKind]) -> list[Section]: ...


def quiet() -> Any:
    """The runners' own terminal lines are kept out of the audit's (one progress line per part)."""
    return contextlib.redirect_stdout(io.StringIO())


def close(v: Any) -> None:
    """Close an opened victim's oracle (an HTTP client), if it has one to close."""
    fn = getattr(v.oracle, "close", None)
    if fn is not None:
        fn()


def q_at(points: Sequence[dict[str, Any]], threshold: float) -> int | None:
    """The fewest measured queries whose copy reached ``threshold`` fidelity (``None``: not reached)."""
    for p in sorted(points, key=lambda r: r["part"]["budget"]):
        if p.get("fidelity") is not None and p["fidelity"] >= threshold - TOLERANCE:
            return int(p["total_queries"])
    return None


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def kind_of(result: dict[str, Any]) -> str:
    return str(result["part"].get("kind", "extract"))


def stolen_copies(results: Sequence[dict[str, Any]], kinds: Mapping[str, PartKind]) -> list[dict[str, Any]]:
    """The results that are a stolen copy (the extraction ladder and the data-free attacker; the repeats at other
    seeds are the spread's)."""
    return [r for r in results if getattr(kinds.get(kind_of(r)), "makes_copy", False)
            and not r["part"].get("seed_offset")]
