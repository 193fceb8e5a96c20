"""``run_audit``: the whole audit from its options — check, plan, execute, summarise, report."""

from __future__ import annotations

import dataclasses
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
    from stealkit.audit.report import Gate
    from stealkit.audit.results import ServingRow
    from stealkit.oracle.victim import Target


@dataclass
class AuditResult:
    """What an audit measured: its summary (every figure, as ``audit.json`` holds it), the plan, each
    ``--fail-if`` gate's verdict and its directory; ``failed``: the lines of the gates that failed."""

    path: Path
    parts: list[Part]
    notes: list[str]
    summary: dict[str, Any] = field(default_factory=dict, repr=False)
    gates: list[Gate] = field(default_factory=list)
    #: the gates' extension rungs: planned (``extension``), and those that ran (``extended``)
    extension: list[Part] = field(default_factory=list)
    extended: list[Part] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [g.line for g in self.gates if g.status == "fail"]

    @property
    def exit_code(self) -> int:
        """0: every gate passed (or none was asked), 1: a gate failed, 3: a gate could not be decided."""
        from stealkit.audit.gates import exit_code

        return exit_code(self.gates)

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    @property
    def verdict(self) -> list[str]:
        """The verdict's lines (the report's first section): how fast a copy is made, the serving choice that
        raises Q90 most and its cost, what was not measured."""
        return list(self.summary.get("verdict") or [])

    @property
    def serving(self) -> list[ServingRow]:
        """One row per serving choice: Q90 and Q95, the best attacker, served accuracy and ECE, PRADA."""
        from stealkit.audit.results import serving_rows

        return serving_rows(self.summary)

    @property
    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """The summary's tables as rows, by name (``headline``, ``serving``, ``enables``, ...)."""
        from stealkit.audit.results import tables

        return tables(self.summary)

    @property
    def victim_accuracy(self) -> float | None:
        """The victim's accuracy on the test split (the owner's with ``test_data``)."""
        return self.summary.get("victim_accuracy")

    def __str__(self) -> str:
        return "\n".join([*self.verdict, f"report: {self.report}"])


def target_of(options: AuditOptions) -> Target:
    """The audit's victim as a :class:`~stealkit.oracle.victim.Target` (``standard:NAME`` resolved)."""
    from stealkit.oracle.victim import Target

    victim = options.victim
    if isinstance(victim, str) and victim.startswith("standard:"):
        from stealkit.victims import standard_victim

        victim = str(standard_victim(victim.split(":", 1)[1]).path)
    from stealkit.audit.tabular import own_files

    how = {"key": options.key, "top_k": options.top_k, "dataset": options.dataset, "data_dir": options.data_dir,
           "device": options.device, "seed": options.seed, "test_data": options.test_data,
           "feature_data": own_files(options)}  # a feature-vector victim's ranges: the owner's files' min/max
    if isinstance(victim, Target):  # an nn.Module with its input shape (stealkit.api.audit)
        return dataclasses.replace(victim, **how)
    return Target(victim, **how)


def _remote(target: Target) -> bool:
    from stealkit.oracle.victim import is_url

    return isinstance(target.victim, str) and is_url(target.victim)


def _shape(target: Target) -> tuple[int, int, dict[str, Any] | None]:
    """The victim's classes and input size, read without a query (a model's metadata, a server's /v1/info), and
    for an ONNX or TorchScript file how its output was read (logits or probabilities, and who said so)."""
    from stealkit.audit.parts import close

    v = target.open(mode="label", budget=0)
    close(v)
    record = getattr(v.spec, "record", None)
    return v.num_classes, math.prod(v.input_shape), record() if callable(record) else None


def pool_sizes(target: Target, options: AuditOptions) -> dict[str, int | None]:
    """Each attacker's query source, checked as the run will read it (an unknown source, or a data set the
    victim's task does not name, is refused here, before the plan), and the images it holds (``None``: synthetic,
    unbounded)."""
    from stealkit.audit.parts import close
    from stealkit.data import parse_source
    from stealkit.data.query_sources import load_query_source

    v = target.open(mode="label", budget=0)
    close(v)
    sizes: dict[str, int | None] = {}
    for flag, spec in (("--pool", options.pool), ("--unrelated", options.unrelated)):
        try:
            if parse_source(spec).is_synthetic:
                sizes[spec] = None
                continue
            sizes[spec] = len(load_query_source(spec, input_shape=v.input_shape, n=None, seed=0,
                                                data_dir=options.data_dir, victim_dataset=v.dataset,
                                                split_seed=v.split_seed, features=v.features))
        except InputError as exc:
            raise InputError(f"{flag} {spec}: {exc}") from None
    return sizes


def own_data_of(target: Target, options: AuditOptions) -> tuple[dict[str, Any], list[str]]:
    """The owner's data files (``--test-data``, and ``--pool`` / ``--unrelated`` where they are files) as config.json
    records them, and the plan's notes: what each file is (source, items, pixel scale, digest) and where it can
    mislead (:func:`stealkit.oracle.victim.own_data`)."""
    from stealkit.audit.parts import close
    from stealkit.oracle.victim import own_data

    v = target.open(mode="label", budget=0)
    close(v)
    records, warnings = own_data(v, {"--pool": options.pool, "--unrelated": options.unrelated}, options.data_dir)
    notes = [f"your data, --{flag.replace('_', '-')} {r['source']}: {r['size']:,} items, {_scale(r)}, sha256 "
             f"{r['sha256'][:12]}..." + (" (every fidelity and accuracy is scored on it)" if flag == "test_data" else "")
             for flag, r in records.items()]
    return records, notes + warnings


def _scale(record: dict[str, Any]) -> str:
    from stealkit.data.features import FEATURE_SCALE

    return "read as " + FEATURE_SCALE if record["pixel_scale"] == FEATURE_SCALE else \
        f"pixels read as {record['pixel_scale']}"


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
    per finished part and the status line every ``STEALKIT_PROGRESS_INTERVAL`` seconds; ``plan_only`` stops after the plan (no query)."""
    from stealkit.audit.defences import check_defence, measurable_defences, resolve_defences, serving_costs
    from stealkit.audit.execute import check_resume, execute
    from stealkit.audit.gates import decide_gates, extend
    from stealkit.audit.parts import PlanContext, RunContext, VictimShape
    from stealkit.audit.plan import format_plan, make_plan
    from stealkit.audit.report import summarise
    from stealkit.rundir import RunDir

    sizes = options.check()
    if options.dataset is not None:
        from stealkit.data.sources import canonical_dataset

        options = dataclasses.replace(options, dataset=canonical_dataset(options.dataset))
    target = target_of(options)
    remote = _remote(target)
    defences, default_defences = resolve_defences(options.defences, remote=remote, answers=options.answers)
    for spec in defences:
        check_defence(spec)  # refuse a bad spec before any work
    if defences and remote:
        raise InputError("--defence audits a local victim; a remote victim's defences are its server's")
    defences, unmeasured_defences = measurable_defences(defences, target)
    num_classes, pixels, model_file = _shape(target)
    from stealkit.audit.tabular import tabular_options

    options, tabular_notes, ranges = tabular_options(target, options)  # a feature-vector victim, else unchanged
    if remote:
        _check_answers(target, options.answers)
    from stealkit.audit import evaluation

    evaluation_queries, unmeasured = evaluation.needed(target)
    if evaluation_queries >= options.max_queries:
        raise InputError(f"--max-queries {options.max_queries:,} leaves no query for the attacks after the "
                         f"{evaluation_queries:,} evaluation queries (the victim's labels of the test split)")
    plan_options = dataclasses.replace(options, max_queries=options.max_queries - evaluation_queries)
    ctx = PlanContext(plan_options, sizes, VictimShape(num_classes, pixels, ranges.d if ranges else None), target,
                      tuple(dict.fromkeys(defences)), tuple(default_defences), pool_sizes=pool_sizes(target, options),
                      fidelity_measured=not unmeasured)
    plan = make_plan(ctx)
    own_records, own_notes = own_data_of(target, options)
    plan.notes[:0] = [*tabular_notes, *own_notes]
    if evaluation_queries:
        plan.notes.insert(0, f"a remote victim: the audit first buys its top-1 labels of the {evaluation_queries:,} "
                             "test images (evaluation queries, within --max-queries), the reference of every fidelity")
    if unmeasured:
        plan.notes.insert(0, unmeasured)
    plan.notes.extend(unmeasured_defences)
    from stealkit.audit.kinds import part_id

    run = RunDir(options.out)
    config = {"victim": target.location, "answers": list(options.answers), "top_k": options.top_k,
              "attackers": options.attackers, "defences": list(ctx.defences), "default_defences": default_defences,
              "ladder": sorted({p.budget for p in plan.parts}), "max_queries": options.max_queries,
              "recipe": dict(options.recipe), "dataset": options.dataset, "parts": [part_id(p) for p in plan.parts],
              "evaluation_queries": evaluation_queries, **({"model_file": model_file} if model_file else {}),
              **({"own_data": own_records} if own_records else {}),
              **({"feature_ranges": ranges.record(), "unrelated": options.unrelated} if ranges else {})}
    done = check_resume(run, config, options.seed)
    echo(format_plan(plan.parts, options.max_queries, done, evaluation_queries, plan.extension))
    for n in plan.notes:
        echo(f"note: {n}")
    result = AuditResult(run.path, plan.parts, plan.notes, extension=plan.extension)
    if plan_only:
        return result
    from stealkit.audit.reconcile import RESUMED_USAGE, reconcile_audit, record_server_count, server_count
    from stealkit.fsutil import atomic_write_json

    run.create(command="audit", seed=options.seed, config=config)
    usage_path = run.path / "server_usage_before.json"
    if remote:  # the server's count at the first start (kept on resume), and at this start
        record_server_count(run.path, [*plan.parts, *plan.extension], target.location, options.key)
    bought = None
    if evaluation_queries:
        import torch

        bought = evaluation.buy(target, run.path, evaluation_queries)
        target = dataclasses.replace(target, reference_labels=torch.tensor(bought.labels))
    run_ctx = RunContext(target, options, run.path / "parts")
    from stealkit.audit.status import AuditClock

    with AuditClock([*plan.parts, *plan.extension], run_ctx.parts_dir, progress):  # the status line
        results = execute(plan.parts, run, run_ctx, on_part=on_part, echo=progress)
        results, result.extended = extend(plan.extension, results, options.fail_if,
                                          lambda rungs: execute(rungs, run, run_ctx, on_part=on_part,
                                                                echo=lambda s: progress(f"extension {s}")),
                                          echo=progress)
    costs = serving_costs(target, answers=options.answers, defences=[*defences, *default_defences])
    summary = summarise([*plan.parts, *result.extended], results, options.max_queries, plan.notes, costs,
                        options.top_k, bought)
    if plan.extension:
        summary["extension"] = {"planned": [part_id(p) for p in plan.extension],
                                "ran": [part_id(p) for p in result.extended], "stops": plan.stops}
    if usage_path.exists():
        resumed = run.path / RESUMED_USAGE
        summary["reconciliation"] = reconcile_audit(
            json.loads(usage_path.read_text(encoding="utf-8")), server_count(target.location, options.key),
            [*results, *([{"queries": bought.queries, "replayed": bought.replayed}] if bought else [])],
            json.loads(resumed.read_text(encoding="utf-8")) if resumed.exists() else None)
    run.write_summary(summary)
    atomic_write_json(run.path / "audit.json", {"audit": config, "seed": options.seed, **summary})
    from stealkit.report.builders import write_report

    write_report(run)
    result.summary = summary
    result.gates = decide_gates(results, options.fail_if, plan.stops)
    if result.gates:
        summary["gates"] = [{"gate": g.gate, "status": g.status, "line": g.line} for g in result.gates]
        run.write_summary(summary)
        atomic_write_json(run.path / "audit.json", {"audit": config, "seed": options.seed, **summary})
    return result
