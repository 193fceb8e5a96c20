"""The audit's options: one dataclass holding every option, its default and the ``--quick`` sizes.

Nothing here imports torch: the CLI builds its ``--help`` from these defaults, and every check that needs no
model (answer kinds, ladders, gates, sizes, the surrogate settings' names) runs before any heavy import.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stealkit.errors import InputError

ANSWERS = ("label", "topk", "probs")
#: the default ladder of query budgets of each (answer kind, attacker) cell, and the ``--quick`` one
LADDER = (250, 1000, 4000)
QUICK_LADDER = (50, 100, 200)
#: the default cap on the whole audit's queries: the default ladder for 3 answer kinds x 2 attackers (31,500),
#: the default defence cells (2,500), the transfer attack (1,000), HopSkipJump with and without the stolen copy
#: (20,020), gradient matching (600) and the data-free attacker (5,000) come to 60,620
DEFAULT_MAX_QUERIES = 100_000
#: the unrelated natural data of the second attacker (:mod:`stealkit.data.query_sources`)
DEFAULT_UNRELATED = "patches"


@dataclass(frozen=True)
class Sizes:
    """The sizes of the parts beyond the extraction ladder (0 or ``()`` leaves a part out).

    ``datafree_budget`` is a cap: the data-free part gets what the plan leaves under ``max_queries``, up to it.
    The data-free cap is time, not queries: CoDFe with labels on Fashion-MNIST took 11 min for its first 9,000
    queries on one core (its student retrains on every answer so far), so 20,000 alone outlasted the 25-min
    target. ``gradmatch``: gradient matching's ladder of inputs queried (each one ``predict`` and one ``explain``
    query). ``exact_budget``: the cap on exact recovery's budget. ``seeds``: seeds in all of the Q90/Q95 spread;
    the default audit has one: a seed more repeats 9 parts, 3 of them probability parts of ~210 s each on
    Fashion-MNIST (the recipe's 3,000-step floor), about 7 min on 2 cores over the 25-min target."""

    transfer_images: int = 500
    decision_images: int = 10
    decision_queries: int = 1000
    datafree_budget: int = 5_000
    gradmatch: tuple[int, ...] = (30, 100, 300)
    exact_budget: int = 20_000
    seeds: int = 1


DEFAULT_SIZES = Sizes()
QUICK_SIZES = Sizes(transfer_images=100, decision_images=5, decision_queries=200, datafree_budget=2000,
                    gradmatch=(10, 30, 100), exact_budget=20_000, seeds=2)
#: the surrogate options the audit sets itself in every part (``--set`` may not)
AUDIT_OWNED = ("mode", "pool", "budget", "seed", "victim", "out")


@dataclass(frozen=True)
class AuditOptions:
    """Every option of ``stealkit audit``, with its default. ``budgets`` ``None``: the default ladder (or
    ``--quick``'s); ``sizes``: fields of :class:`Sizes` over the default (or ``--quick``) ones; ``recipe``: the
    surrogate recipe's settings (``--set KEY=VALUE``: a field of
    :class:`~stealkit.extract.surrogate_data.run.SurrogateOptions`, ``student.KEY`` for the student's
    architecture, or a setting of its :class:`~stealkit.extract.surrogate_data.surrogate.SurrogateConfig`)."""

    victim: Any
    out: str
    key: str | None = None
    answers: tuple[str, ...] = ANSWERS
    top_k: int = 1
    pool: str = "pool"
    unrelated: str = DEFAULT_UNRELATED
    defences: tuple[str, ...] = ()
    fail_if: tuple[str, ...] = ()
    budgets: tuple[int, ...] | None = None
    max_queries: int = DEFAULT_MAX_QUERIES
    quick: bool = False
    sizes: Mapping[str, Any] = field(default_factory=dict)
    recipe: Mapping[str, Any] = field(default_factory=dict)
    dataset: str | None = None
    data_dir: str | None = None
    #: the owner's labelled test data (a .npz or a folder of images in class folders): every figure's test split
    test_data: str | None = None
    seed: int = 0
    jobs: int = 1
    device: str = "cpu"
    #: ``ray``: each part a Ray task (:mod:`stealkit.audit.ray_backend`) on the cluster at ``address`` (``None``:
    #: a local Ray of ``jobs`` CPUs)
    backend: str = "local"
    address: str | None = None

    @property
    def ladder(self) -> tuple[int, ...]:
        return tuple(self.budgets) if self.budgets else (QUICK_LADDER if self.quick else LADDER)

    @property
    def attackers(self) -> dict[str, str]:
        """The attackers' data: the first has data like the victim's, the second only unrelated data."""
        return {"like": self.pool, "unrelated": self.unrelated}

    def resolved_sizes(self) -> Sizes:
        base = QUICK_SIZES if self.quick else DEFAULT_SIZES
        known = {f.name for f in dataclasses.fields(Sizes)}
        bad = [k for k in self.sizes if k not in known]
        if bad:
            raise InputError(f"unknown audit sizes {bad}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(base, **{k: v for k, v in self.sizes.items() if v is not None})

    def check(self) -> Sizes:
        """Refuse, before any heavy import, every option that is wrong on its face; the resolved sizes."""
        parse_answers(",".join(self.answers))
        from stealkit.raytasks import check_backend

        check_backend(self.backend, self.address)
        for gate in self.fail_if:
            spec = parse_gate(gate)
            if spec.answers is not None and spec.answers not in self.answers:
                raise InputError(f"--fail-if {gate}: {spec.answers} answers are not audited (--answers "
                                 f"{','.join(self.answers)}); add {spec.answers} to --answers or drop the prefix")
        if self.max_queries < 1:
            raise InputError(f"--max-queries must be a positive number of queries, got {self.max_queries}")
        if min(self.ladder) < 1:
            raise InputError(f"--budgets must be positive query budgets, got {','.join(map(str, self.ladder))}")
        for bad in AUDIT_OWNED:
            if bad in self.recipe:
                raise InputError(f"--set {bad}: the audit sets it in every part")
        sizes = self.resolved_sizes()
        for name in ("transfer_images", "decision_images", "decision_queries", "datafree_budget"):
            if getattr(sizes, name) < 0:
                raise InputError(f"--{name.replace('_', '-')} must be 0 (leave the part out) or positive, got "
                                 f"{getattr(sizes, name)}")
        if any(b < 0 for b in sizes.gradmatch):
            raise InputError(f"--gradmatch-budgets takes positive numbers of inputs, or 0 to leave gradient "
                             f"matching out; got {','.join(map(str, sizes.gradmatch))}")
        if sizes.exact_budget < 0:
            raise InputError(f"--exact-budget must be 0 (leave exact recovery out) or positive, got "
                             f"{sizes.exact_budget}")
        if sizes.seeds < 1:
            raise InputError(f"--seeds must be at least 1 (the audit's own seed), got {sizes.seeds}")
        return sizes


def parse_answers(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [k for k in kinds if k not in ANSWERS]
    if bad or not kinds:
        raise InputError(f"--answers takes a comma-separated list of {', '.join(ANSWERS)}; got {text!r}")
    return kinds


def parse_ints(text: str) -> tuple[int, ...]:
    """``"50,100,200"`` -> ``(50, 100, 200)`` (:func:`stealkit.settings.parse_int_list`)."""
    from stealkit.settings import parse_int_list

    return parse_int_list(text)


def parse_gradmatch(text: str) -> tuple[int, ...]:
    """``--gradmatch-budgets``: a ladder of inputs, or 0 (leave gradient matching out)."""
    ladder = parse_ints(text)
    if min(ladder) < 0 or (0 in ladder and len(ladder) > 1):
        raise InputError(f"--gradmatch-budgets takes positive numbers of inputs, or 0 to leave gradient "
                         f"matching out; got {text}")
    return () if ladder == (0,) else tuple(ladder)


@dataclass(frozen=True)
class GateSpec:
    """One ``--fail-if`` gate: ``q90<N`` fails when an attacker reaches 90 % fidelity with fewer than N queries,
    ``q90>N`` when it does not within N; ``answers``: one answer kind, or ``None`` for every kind audited."""

    answers: str | None
    level: int
    op: str
    n: int

    @property
    def target(self) -> int:
        """The rung that decides the gate whatever its fidelity: the most queries an attacker may have, N - 1
        for ``<`` (fewer than N), N for ``>`` (within N)."""
        return self.n - 1 if self.op == "<" else self.n

    @property
    def text(self) -> str:
        return f"{self.answers + ':' if self.answers else ''}q{self.level}{self.op}{self.n}"


def parse_gate(text: str) -> GateSpec:
    """``"q90<1000"``, ``"label:q95<5000"`` or ``"q90>200"`` as a :class:`GateSpec`."""
    m = re.fullmatch(r"(?:(label|topk|probs):)?q(90|95)([<>])(\d+)", text.strip().lower().replace(" ", ""))
    if m is None or int(m.group(4)) < (2 if m.group(3) == "<" else 1):
        raise InputError(f"--fail-if takes q90<N, q90>N, q95<N or q95>N (N a number of queries, at least 2 after "
                         f"<), optionally after an answer kind (label:q90<N); got {text!r}")
    return GateSpec(m.group(1), int(m.group(2)), m.group(3), int(m.group(4)))


def parse_fail_if(text: str) -> tuple[str | None, int, int]:
    """``"q90<1000"`` or ``"label:q95<5000"`` -> (answer kind or ``None`` for every kind, 90, 1000); the
    direction is :func:`parse_gate`'s."""
    gate = parse_gate(text)
    return gate.answers, gate.level, gate.n


def recipe_from_args(args: Sequence[str]) -> dict[str, Any]:
    """The old ``--recipe ARG`` spelling (``extract surrogate`` flags, e.g. ``--recipe=--epochs=5``) as the
    ``--set`` settings it means: ``--epochs 5`` -> ``epochs=5``, ``--student-arg hidden=8`` -> ``student.hidden=8``,
    ``--set min_steps=0`` -> ``min_steps=0``."""
    from stealkit.settings import parse_value

    words = [a for r in args for a in r.split("=", 1)]
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        if not flag.startswith("--"):
            raise InputError(f"--recipe {flag!r}: expected an `extract surrogate` flag; use --set KEY=VALUE")
        name = flag[2:].replace("-", "_")
        if i + 1 >= len(words) or words[i + 1].startswith("--"):
            out[name] = True
            i += 1
            continue
        value = words[i + 1]
        if name in ("student_arg", "set"):
            k, _, v = value.partition("=")
            out[("student." if name == "student_arg" else "") + k.strip().replace("-", "_")] = parse_value(v)
        else:
            out[name] = parse_value(value)
        i += 2
    return out
