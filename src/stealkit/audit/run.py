"""``run_audit``: the whole audit from its options — check, plan, execute, summarise, report."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit.options import AuditOptions
from stealkit.errors import InputError

if TYPE_CHECKING:
    from stealkit.audit.execute import PartHook
    from stealkit.audit.parts import Part
    from stealkit.oracle.victim import Target


@dataclass
class AuditResult:
    """What an audit measured: its summary (every figure, as ``audit.json`` holds it), the plan, the gates it
    failed (one line each) and its directory."""

    path: Path
    parts: list[Part]
    notes: list[str]
    summary: dict[str, Any] = field(default_factory=dict, repr=False)
    failed: list[str] = field(default_factory=list)

    @property
    def report(self) -> Path:
        return self.path / "report.html"


def target_of(options: AuditOptions) -> Target:
    """The audit's victim as a :class:`~stealkit.oracle.victim.Target` (``standard:NAME`` resolved)."""
    from stealkit.oracle.victim import Target

    victim = options.victim
    if isinstance(victim, str) and victim.startswith("standard:"):
        from stealkit.victims import standard_victim

        victim = str(standard_victim(victim.split(":", 1)[1]).path)
    return Target(victim, key=options.key, top_k=options.top_k, dataset=options.dataset, data_dir=options.data_dir,
                  device=options.device, seed=options.seed)


def _remote(target: Target) -> bool:
    from stealkit.oracle.victim import is_url

    return isinstance(target.victim, str) and is_url(target.victim)


def _shape(target: Target) -> tuple[int, int]:
    """The victim's classes and input size, read without a query (a model's metadata, a server's /v1/info)."""
    from stealkit.audit.parts import close

    v = target.open(mode="label", budget=0)
    close(v)
    return v.num_classes, math.prod(v.input_shape)


def _check_answers(target: Target, kinds: Sequence[str]) -> None:
    """Refuse, before any query, an answer kind the remote victim (this key) does not serve."""
    from stealkit.audit.parts import close

    for kind in kinds:
        try:
            close(target.open(mode=kind, budget=0))
        except InputError as exc:
            raise InputError(f"--answers {kind}: {target.location} does not serve it to this key ({exc}); audit the "
                             "answer kinds it serves") from None


def run_audit(options: AuditOptions, *, plan_only: bool = False, on_part: PartHook | None = None,
              echo: Callable[[str], None] = lambda s: None,
              progress: Callable[[str], None] = lambda s: None) -> AuditResult:
    """Audit ``options.victim``: plan every part within ``max_queries``, run them (resuming finished ones in
    ``options.out``), and write ``summary.json``, ``audit.json`` and ``report.html`` there. Every query count comes
    from an oracle's ledger; the total never exceeds ``max_queries``. ``echo`` gets the plan, ``progress`` a line
    per finished part; ``plan_only`` stops after the plan (no query)."""
    from stealkit.audit.defences import resolve_defences, serving_costs
    from stealkit.audit.execute import check_resume, execute
    from stealkit.audit.parts import PlanContext, RunContext, VictimShape
    from stealkit.audit.plan import format_plan, make_plan
    from stealkit.audit.report import failed_gates, summarise
    from stealkit.rundir import RunDir
    from stealkit.serve.defences import parse_defence

    sizes = options.check()
    target = target_of(options)
    remote = _remote(target)
    defences, default_defences = resolve_defences(options.defences, remote=remote, answers=options.answers)
    for spec in defences:
        parse_defence(spec)  # refuse a bad spec before any work
    if defences and remote:
        raise InputError("--defence audits a local victim; a remote victim's defences are its server's")
    num_classes, pixels = _shape(target)
    if remote:
        _check_answers(target, options.answers)
    ctx = PlanContext(options, sizes, VictimShape(num_classes, pixels), target, tuple(dict.fromkeys(defences)),
                      tuple(default_defences))
    plan = make_plan(ctx)
    from stealkit.audit.kinds import part_id

    run = RunDir(options.out)
    config = {"victim": target.location, "answers": list(options.answers), "top_k": options.top_k,
              "attackers": options.attackers, "defences": list(ctx.defences), "default_defences": default_defences,
              "ladder": sorted({p.budget for p in plan.parts}), "max_queries": options.max_queries,
              "recipe": dict(options.recipe), "dataset": options.dataset, "parts": [part_id(p) for p in plan.parts]}
    done = check_resume(run, config, options.seed)
    echo(format_plan(plan.parts, options.max_queries, done))
    for n in plan.notes:
        echo(f"note: {n}")
    result = AuditResult(run.path, plan.parts, plan.notes)
    if plan_only:
        return result
    from stealkit.audit.reconcile import RESUMED_USAGE, reconcile_audit, record_server_count, server_count
    from stealkit.fsutil import atomic_write_json

    run.create(command="audit", seed=options.seed, config=config)
    usage_path = run.path / "server_usage_before.json"
    if remote:  # the server's count at the first start (kept on resume), and at this start
        record_server_count(run.path, plan.parts, target.location, options.key)
    results = execute(plan.parts, run, RunContext(target, options, run.path / "parts"), on_part=on_part,
                      echo=progress)
    costs = serving_costs(target, answers=options.answers, defences=[*defences, *default_defences])
    summary = summarise(plan.parts, results, options.max_queries, plan.notes, costs, options.top_k)
    if usage_path.exists():
        resumed = run.path / RESUMED_USAGE
        summary["reconciliation"] = reconcile_audit(
            json.loads(usage_path.read_text(encoding="utf-8")), server_count(target.location, options.key), results,
            json.loads(resumed.read_text(encoding="utf-8")) if resumed.exists() else None)
    run.write_summary(summary)
    atomic_write_json(run.path / "audit.json", {"audit": config, "seed": options.seed, **summary})
    from stealkit.report.builders import write_report

    write_report(run)
    result.summary = summary
    result.failed = failed_gates(summary["headline"], options.fail_if)
    return result
