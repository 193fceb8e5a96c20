"""``stealkit audit``: how much does an API leak to model extraction? One command, one report (issue 39).

The audit runs ``stealkit extract surrogate``'s default recipe (:func:`~stealkit.commands.extract_surrogate.
surrogate_config` of :func:`~stealkit.commands.extract_surrogate.command_params`, DFME appendix A with the
``auto`` preset) at a ladder of query budgets, once per answer kind the API gives or could give (labels, top-k,
probabilities) and per attacker: one with data like the victim's (the attacker split, or ``--pool``) and one with
only unrelated natural data (``--unrelated``, by default crops of natural photographs). Its headline is the
fidelity (agreement with the victim on the test split) against queries and Q90/Q95, the fewest measured queries
that reached 90 % / 95 % fidelity.

Every part (one extraction at one budget) is planned before any query: the plan's total never exceeds
``--max-queries``, and each part's oracle is metered to its own budget, so the ledger enforces it. Each part
writes ``parts/<id>.json`` atomically when it finishes: an interrupted audit run again with the same ``--out``
and plan skips the finished parts and pays for no query twice. Every query count comes from an oracle's ledger.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stealkit.commands.common import device_option, parse_int_list, victim_option
from stealkit.errors import InputError

if TYPE_CHECKING:
    from stealkit.report.html import Section
    from stealkit.rundir import RunDir

ANSWERS = ("label", "topk", "probs")
#: the default ladder of query budgets of each (answer kind, attacker) cell, and the ``--quick`` one
LADDER = (250, 500, 1000, 2000, 4000)
QUICK_LADDER = (50, 100, 200)
#: the default cap on the whole audit's queries: the default ladder for 3 answer kinds x 2 attackers is 46,500
DEFAULT_MAX_QUERIES = 50_000
#: the unrelated natural data of the second attacker (:mod:`stealkit.data.query_sources`)
DEFAULT_UNRELATED = "patches"
THRESHOLDS = (0.90, 0.95)
#: fidelities are float32 means: 405 of 450 agreeing reads 0.89999998, which reached 90 %
TOLERANCE = 1e-6
#: rough seconds per student optimiser step (conv2, batch 64, one shared CPU thread), per query, per part, and
#: FixMatch's extra (it also trains on the unqueried pool), for the plan's estimate (measured on digits, --quick)
STEP_SECONDS = 0.01
QUERY_SECONDS = 0.0002
PART_SECONDS = 2.0
FIXMATCH_SECONDS = 5.0


@dataclass(frozen=True)
class Part:
    """One extraction of the audit: the default surrogate recipe at ``budget`` queries of ``answers`` answers,
    by the attacker ``attacker`` querying images of ``pool``."""

    answers: str
    attacker: str
    pool: str
    budget: int
    estimate_s: float = 0.0
    defence: str = ""  # an output defence the victim wears (a spec of stealkit.serve.defences), "" for none

    @property
    def id(self) -> str:
        worn = "+" + "".join(c if c.isalnum() or c == "." else "_" for c in self.defence) if self.defence else ""
        return f"extract-{self.answers}{worn}-{self.attacker}-{self.budget}"


#: called after each part with the part and its result (a hook: a test stops the audit here)
PartHook = Callable[[Part, dict[str, Any]], None]


def parse_answers(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [k for k in kinds if k not in ANSWERS]
    if bad or not kinds:
        raise InputError(f"--answers takes a comma-separated list of {', '.join(ANSWERS)}; got {text!r}")
    return kinds


def recipe_args(budget: int, answers: str, pool: str, seed: int, extra: Sequence[str]) -> list[str]:
    """The ``stealkit extract surrogate`` arguments of one part (the command's defaults for all others)."""
    return ["--budget", str(budget), "--mode", answers, "--pool", pool, "--seed", str(seed), *extra]


def estimate_seconds(budget: int, answers: str, num_classes: int, extra: Sequence[str]) -> float:
    """A rough time for one part: the recipe's student optimiser steps at ``STEP_SECONDS``, the queries, a
    fixed cost per part and FixMatch's extra."""
    from stealkit.commands.extract_surrogate import command_params, surrogate_config

    params = command_params(*recipe_args(budget, answers, "pool", 0, extra))
    _, config = surrogate_config(params, budget, num_classes)
    steps = config.student_epochs(budget, budget) * math.ceil(budget / config.batch_size)
    fixmatch = FIXMATCH_SECONDS if config.ssl != "none" else 0.0
    return PART_SECONDS + fixmatch + steps * STEP_SECONDS + budget * QUERY_SECONDS


def make_plan(answers: Sequence[str], attackers: dict[str, str], ladder: Sequence[int], max_queries: int, *,
              num_classes: int, extra: Sequence[str], defences: Sequence[str] = ()) -> tuple[list[Part], list[str]]:
    """The parts, in the order they run (cheapest rung of every cell first, so a stopped audit has a whole first
    row), and notes. A cell is an answer kind and an attacker, or a defence (probabilities through it, the
    attacker with data like the victim's). Rungs are dropped from the top until the total fits ``max_queries``."""
    rungs = sorted(set(ladder))
    notes = []
    like = next(iter(attackers.items()))
    cell_list = [(a, name, pool, "") for a in answers for name, pool in attackers.items()]
    cell_list += [("probs", like[0], like[1], d) for d in defences]
    cells = len(cell_list)
    while rungs and cells * sum(rungs) > max_queries:
        notes.append(f"rung {rungs[-1]:,} dropped: the ladder would spend {cells * sum(rungs):,} queries, more than "
                     f"--max-queries {max_queries:,}")
        rungs.pop()
    if not rungs:
        raise InputError(f"--max-queries {max_queries:,} is too small for any part: the smallest rung "
                         f"({min(ladder):,} queries) for {cells} cells needs {cells * min(ladder):,}")
    parts = [Part(a, name, pool, b, round(estimate_seconds(b, a, num_classes, extra), 1), d)
             for b in rungs for a, name, pool, d in cell_list]
    return parts, notes


def format_plan(parts: Sequence[Part], max_queries: int, done: set[str]) -> str:
    lines = [f"{'part':<42} {'queries':>8} {'est. time':>10}"]
    for p in parts:
        mark = "  (done: resumed)" if p.id in done else ""
        lines.append(f"{p.id:<42} {p.budget:>8,} {p.estimate_s:>9.0f}s{mark}")
    total = sum(p.budget for p in parts)
    est = sum(p.estimate_s for p in parts)
    lines.append(f"{'total':<42} {total:>8,} {est:>9.0f}s  (of --max-queries {max_queries:,}; "
                 "times are rough, one CPU thread)")
    return "\n".join(lines)


def run_part(part: Part, *, victim: str, key: str | None, top_k: int, dataset: str | None, data_dir: str | None,
             device: str, seed: int, extra: Sequence[str]) -> dict[str, Any]:
    """One extraction through a fresh oracle metered to the part's budget: the command's own pieces, in the
    command's order (:func:`stealkit.commands.extract_surrogate.surrogate_cmd`)."""
    from stealkit.commands.common import parse_kv
    from stealkit.commands.extract_surrogate import command_params, surrogate_config, surrogate_pool
    from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
    from stealkit.extract.registry import METHODS
    from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT
    from stealkit.serve.defences import parse_defence

    started = time.perf_counter()
    params = command_params(*recipe_args(part.budget, part.answers, part.pool, seed, extra))
    worn = (parse_defence(part.defence),) if part.defence else ()
    v = open_victim(victim, mode=part.answers, budget=part.budget, top_k=top_k, key=key, dataset=dataset,
                    device=device, seed=seed, defences=worn)
    try:
        resolved, config = surrogate_config(params, part.budget, v.num_classes, flip=v.dataset in FLIP_INVARIANT)
        splits = victim_splits(v, data_dir)
        x_pool, labels = surrogate_pool(part.pool, v, config, cap=part.budget, seed=seed, data_dir=data_dir)
        kwargs = parse_kv(tuple(params["student_args"]))
        result = METHODS["surrogate"].run(
            v.oracle, x_pool, make_student=student_factory(params["student"], v, seed, **kwargs), config=config,
            evaluator=make_evaluator(v, splits.test.x, splits.test.y, device), pool_labels=labels, device=device,
            checkpoint_dir=None, resume=False)
    finally:
        close = getattr(v.oracle, "close", None)
        if close is not None:
            close()
    queries = v.oracle.ledger.as_dict()
    served = None
    if part.defence and v.model is not None:  # the honest users' cost: top-1 accuracy of what is served (no query)
        from stealkit.studies.defences import served_accuracy

        served = served_accuracy(v.model, worn[0], splits.test.x, splits.test.y)
    return {"part": asdict(part), "id": part.id, "queries": queries, "total_queries": sum(queries.values()),
            "accuracy": result.accuracy, "fidelity": result.fidelity, "victim_accuracy": result.victim_accuracy,
            "served_accuracy": served, "preset_resolved": resolved,
            "elapsed_s": round(time.perf_counter() - started, 2)}


def q_at(points: Sequence[dict[str, Any]], threshold: float) -> int | None:
    """The fewest measured queries whose copy reached ``threshold`` fidelity (``None``: not reached)."""
    for p in sorted(points, key=lambda r: r["part"]["budget"]):
        if p.get("fidelity") is not None and p["fidelity"] >= threshold - TOLERANCE:
            return int(p["total_queries"])
    return None


def headline(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (answer kind, attacker): fidelity at each rung, Q90 and Q95 (or "not reached within N")."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        p = r["part"]
        cells.setdefault((p["answers"], p["attacker"], p.get("defence", "")), []).append(r)
    rows = []
    for (answers, attacker, defence), points in cells.items():
        points = sorted(points, key=lambda r: r["part"]["budget"])
        row: dict[str, Any] = {"answers": answers, "attacker": attacker}
        if any(k[2] for k in cells):
            row["defence"] = defence or "none"
            row["served accuracy"] = points[0].get("served_accuracy") if defence else points[0].get("victim_accuracy")
        for p in points:
            row[f"fidelity @{p['part']['budget']}"] = p["fidelity"]
        top = max(p["total_queries"] for p in points)
        for t in THRESHOLDS:
            q = q_at(points, t)
            row[f"Q{round(t * 100)}"] = q if q is not None else f"not reached within {top:,}"
        rows.append(row)
    return rows


def parse_fail_if(text: str) -> tuple[str | None, int, int]:
    """``"q90<1000"`` or ``"label:q95<5000"`` -> (answer kind or ``None`` for every kind, 90, 1000)."""
    import re

    m = re.fullmatch(r"(?:(label|topk|probs):)?q(90|95)<(\d+)", text.strip().lower().replace(" ", ""))
    if m is None:
        raise InputError(f"--fail-if takes q90<N or q95<N, optionally after an answer kind (label:q90<N); got {text!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def failed_gates(rows: Sequence[dict[str, Any]], gates: Sequence[str]) -> list[str]:
    """The gates an audit fails: an undefended cell of the attacker with data like the victim's whose Q90 (Q95)
    was reached with fewer queries than the gate's N."""
    out = []
    for gate in gates:
        answers, level, n = parse_fail_if(gate)
        for r in rows:
            q = r.get(f"Q{level}")
            if (r["attacker"] == "like" and r.get("defence", "none") == "none" and isinstance(q, int) and q < n
                    and answers in (None, r["answers"])):
                out.append(f"--fail-if {gate}: {r['answers']} answers reach {level} % fidelity with {q:,} queries")
    return out


def load_done(parts_dir: Path, parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    done = {}
    for p in parts:
        path = parts_dir / f"{p.id}.json"
        if path.exists():
            done[p.id] = json.loads(path.read_text(encoding="utf-8"))
    return done


def run_audit(parts: Sequence[Part], run: RunDir, *, on_part: PartHook | None = None, echo: Callable[[str], None],
              **kwargs: Any) -> list[dict[str, Any]]:
    """Run the parts not yet checkpointed in ``run``/parts, each one written atomically when it finishes."""
    from stealkit.fsutil import atomic_write_json

    parts_dir = run.path / "parts"
    done = load_done(parts_dir, parts)
    results = []
    for i, part in enumerate(parts, 1):
        if part.id in done:
            results.append(done[part.id])
            continue
        result = run_part(part, **kwargs)
        atomic_write_json(parts_dir / f"{part.id}.json", result)
        run.append_record(result)
        echo(f"[{i}/{len(parts)}] {part.id}: fidelity {_pct(result['fidelity'])}, accuracy "
             f"{_pct(result['accuracy'])}, {result['total_queries']:,} queries, {result['elapsed_s']:.0f}s")
        results.append(result)
        if on_part is not None:
            on_part(part, result)
    return results


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [[c for c in cols]] + [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def plain_words(rows: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]]) -> list[str]:
    """The report's opening sentences: the best copy per answer kind, and Q90 against the probabilities'."""
    words = {"label": "top-1 labels", "topk": "top-k answers", "probs": "probabilities"}
    out = []
    for answers in dict.fromkeys(r["part"]["answers"] for r in results):
        mine = [r for r in results if r["part"]["answers"] == answers and r["fidelity"] is not None]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["fidelity"], -r["total_queries"]))
        data = {"like": "data like yours", "unrelated": "only unrelated data"}.get(best["part"]["attacker"], "data")
        out.append(f"With {best['total_queries']:,} queries answered with {words[answers]} and {data} "
                   f"({best['part']['pool']}), an attacker gets a copy that agrees with your model on "
                   f"{100 * best['fidelity']:.1f} % of test inputs.")
    q = {(r["answers"], r["attacker"]): r["Q90"] for r in rows if r.get("defence", "none") == "none"}
    if ("probs", "like") in q and ("label", "like") in q:
        out.append(f"With data like yours, Q90 (queries to a 90 % copy) is {_words(q[('probs', 'like')])} with "
                   f"probabilities and {_words(q[('label', 'like')])} with top-1 labels only.")
    for r in rows:
        if r.get("defence", "none") != "none":
            out.append(f"Serving probabilities through the defence {r['defence']} gives honest users "
                       f"{_pct(r['served accuracy'])} accuracy and puts Q90 at {_words(r['Q90'])}.")
    return out


def _words(q: Any) -> str:
    return f"{q:,}" if isinstance(q, int) else str(q)


def summarise(parts: Sequence[Part], results: Sequence[dict[str, Any]], max_queries: int,
              notes: Sequence[str]) -> dict[str, Any]:
    rows = headline(results)
    spent = sum(r["total_queries"] for r in results)
    assert spent <= max_queries, (spent, max_queries)  # the plan fits, and each part's oracle is metered
    victim_accuracy = next((r["victim_accuracy"] for r in results if r.get("victim_accuracy") is not None), None)
    out: dict[str, Any] = {"method": "audit", "victim_accuracy": victim_accuracy, "queries": spent,
                           "max_queries": max_queries, "planned_queries": sum(p.budget for p in parts),
                           "headline": rows, "parts": list(results), "sentences": plain_words(rows, results)}
    if notes or any(r["fidelity"] is None for r in results):
        out["notes"] = [*notes] + ([] if all(r["fidelity"] is not None for r in results) else [
            "fidelity needs the victim's own labels of the test split, which a remote victim does not give: "
            "Q90/Q95 are not measured"])
    return out


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """The audit's report: the plain-words headline, fidelity against queries per answer kind and attacker,
    the Q90/Q95 table and every part (kind ``audit`` in :data:`stealkit.report.kinds.BUILDERS`)."""
    from stealkit.report.html import Figure, Section
    from stealkit.report.plots import line_plot

    results = summary.get("parts") or []
    rows = summary.get("headline") or []
    out = [Section("In plain words", paragraphs=[str(s) for s in summary.get("sentences") or []]),
           Section("Extraction risk: fidelity against queries, Q90 and Q95", paragraphs=[
               "Fidelity: agreement of the stolen copy with the victim on the test split. Q90/Q95: the fewest "
               "measured queries whose copy reached 90 %/95 % fidelity (the audit's ladder of budgets; each "
               "point is one run of the default `stealkit extract surrogate` recipe)."], tables=[("", rows)])]
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in sorted(results, key=lambda r: r["part"]["budget"]):
        if r.get("fidelity") is None:
            continue
        xs, ys = series.setdefault(f"fidelity, {r['part']['answers']} {r['part']['attacker']}", ([], []))
        xs.append(r["total_queries"])
        ys.append(r["fidelity"])
    if series:
        uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="fidelity on the test split",
                        logx=True, hlines={"90 %": 0.9, "95 %": 0.95}, ylim=(0, 1.02))
        out[1].figures.append(Figure(uri, "Fidelity of the stolen copy against queries, per answer kind and "
                                          "attacker"))
    table = [{"part": r["id"], "queries": r["total_queries"], "fidelity": r["fidelity"], "accuracy": r["accuracy"],
              "served accuracy": r.get("served_accuracy"), "recipe": r["preset_resolved"],
              "seconds": r["elapsed_s"]} for r in results]
    out.append(Section("Parts", tables=[("", table)]))
    return out


@click.command("audit")
@victim_option()
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--answers", default=",".join(ANSWERS), show_default=True,
              help="Answer kinds to audit (what the API gives, or could give): label, topk, probs.")
@click.option("--top-k", type=int, default=1, show_default=True, help="Classes a topk answer reveals.")
@click.option("--pool", default="pool", show_default=True,
              help="The data of the attacker with data like the victim's: a query source (pool: the attacker split).")
@click.option("--unrelated", default=DEFAULT_UNRELATED, show_default=True,
              help="The data of the attacker with only unrelated natural data: a query source (patches: crops of "
                   "natural photographs; or another data set).")
@click.option("--defence", "defences", multiple=True, metavar="SPEC",
              help="Also audit probabilities served through this output defence, side by side (repeat; the specs "
                   "of stealkit defences --defence and of a serve key's defences, e.g. round:decimals=1, topk:k=1, label, noise:sigma=0.05; a local "
                   "victim only).")
@click.option("--fail-if", "fail_if", multiple=True, metavar="q90<N",
              help="Exit 1 when an attacker with data like the victim's reaches 90 % (q90) or 95 % (q95) fidelity "
                   "with fewer than N queries (repeat; label:q90<N checks one answer kind): a deployment gate.")
@click.option("--budgets", default=None, help="The ladder of query budgets per cell (default "
              f"{','.join(map(str, LADDER))}; --quick {','.join(map(str, QUICK_LADDER))}).")
@click.option("--max-queries", type=int, default=DEFAULT_MAX_QUERIES, show_default=True,
              help="Cap on the whole audit's queries; rungs are dropped from the top of the ladder to fit.")
@click.option("--plan", "plan_only", is_flag=True, help="Print the plan and stop (no query).")
@click.option("--quick", is_flag=True, help=f"A small ladder ({','.join(map(str, QUICK_LADDER))}).")
@click.option("--recipe", "recipe", multiple=True, metavar="ARG",
              help="Extra `stealkit extract surrogate` argument of every part (repeat; e.g. --recipe=--epochs=5).")
@click.option("--dataset", default=None, help="Data set of the victim's task (default: from its model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--out", required=True, type=click.Path(),
              help="Audit directory (run again with the same plan: it resumes).")
@device_option
def audit_cmd(victim: str, key: str | None, answers: str, top_k: int, pool: str, unrelated: str,
              defences: tuple[str, ...], fail_if: tuple[str, ...], budgets: str | None, max_queries: int, plan_only: bool, quick: bool, recipe: tuple[str, ...],
              dataset: str | None, data_dir: str | None, seed: int, out: str, device: str) -> None:
    """Audit a victim's exposure to model extraction: the default surrogate recipe at a ladder of budgets, per
    answer kind and attacker; fidelity against queries and Q90/Q95 in one report. Prints the plan first."""
    failed = run_audit_command(victim=victim, key=key, answers=answers, top_k=top_k, pool=pool,
                      unrelated=unrelated, defences=defences, fail_if=fail_if, budgets=budgets, max_queries=max_queries, plan_only=plan_only, quick=quick, recipe=recipe,
                      dataset=dataset, data_dir=data_dir, seed=seed, out=out, device=device)
    for line in failed:
        click.echo(line, err=True)
    if failed:
        click.get_current_context().exit(1)


def run_audit_command(*, victim: str, key: str | None = None, answers: str = ",".join(ANSWERS), top_k: int = 1,
                      pool: str = "pool", unrelated: str = DEFAULT_UNRELATED, defences: Sequence[str] = (),
                      fail_if: Sequence[str] = (), budgets: str | None = None,
                      max_queries: int = DEFAULT_MAX_QUERIES, plan_only: bool = False, quick: bool = False,
                      recipe: Sequence[str] = (), dataset: str | None = None, data_dir: str | None = None,
                      seed: int = 0, out: str, device: str = "cpu", on_part: PartHook | None = None) -> list[str]:
    """The command's body (``on_part``: a hook called after each part, e.g. to stop a test's audit); returns
    the ``--fail-if`` gates the audit failed, one line each."""
    from stealkit.commands.extract_surrogate import command_params
    from stealkit.rundir import RunDir

    kinds = parse_answers(answers)
    for gate in fail_if:
        parse_fail_if(gate)
    if max_queries < 1:
        raise InputError(f"--max-queries must be a positive number of queries, got {max_queries}")
    ladder = parse_int_list(budgets) if budgets else (QUICK_LADDER if quick else LADDER)
    if min(ladder) < 1:
        raise InputError(f"--budgets must be positive query budgets, got {budgets}")
    extra = [a for r in recipe for a in r.split("=", 1)] if recipe else []
    for bad in ("--budget", "--mode", "--pool", "--seed", "--victim", "--out"):
        if bad in extra:
            raise InputError(f"--recipe {bad} is the audit's to set")
    command_params(*recipe_args(1, "label", "pool", seed, extra))  # refuse a bad recipe argument before any work
    from stealkit.extract.common import is_url
    from stealkit.serve.defences import parse_defence

    for spec in defences:
        parse_defence(spec)  # refuse a bad spec before any work
    if defences and is_url(victim):
        raise InputError("--defence audits a local victim; a remote victim's defences are its server's")
    num_classes = _num_classes(victim, key, dataset)
    attackers = {"like": pool, "unrelated": unrelated}
    parts, notes = make_plan(kinds, attackers, ladder, max_queries, num_classes=num_classes, extra=extra,
                             defences=list(dict.fromkeys(defences)))
    run = RunDir(out)
    config = {"victim": victim, "answers": list(kinds), "top_k": top_k, "attackers": attackers,
              "defences": list(dict.fromkeys(defences)),
              "ladder": sorted({p.budget for p in parts}), "max_queries": max_queries, "recipe": extra,
              "dataset": dataset, "parts": [p.id for p in parts]}
    done = _check_resume(run, config, seed)
    click.echo(format_plan(parts, max_queries, done))
    for n in notes:
        click.echo(f"note: {n}")
    if plan_only:
        return []
    run.create(command="audit", seed=seed, config=config)
    results = run_audit(parts, run, on_part=on_part, echo=lambda s: click.echo(s, err=True), victim=victim, key=key,
                        top_k=top_k, dataset=dataset, data_dir=data_dir, device=device, seed=seed, extra=extra)
    summary = summarise(parts, results, max_queries, notes)
    run.write_summary(summary)
    from stealkit.report.builders import write_report

    write_report(run)
    click.echo(format_table(summary["headline"]))
    click.echo(f"queries {summary['queries']:,} of --max-queries {max_queries:,} (from the ledgers); "
               f"report: {run.report_path}")
    return failed_gates(summary["headline"], fail_if)


def _num_classes(victim: str, key: str | None, dataset: str | None) -> int:
    """The victim's number of classes, read without a query (a model's metadata, a server's /v1/info)."""
    from stealkit.extract.common import open_victim

    v = open_victim(victim, mode="label", budget=0, key=key, dataset=dataset)
    close = getattr(v.oracle, "close", None)
    if close is not None:
        close()
    return v.num_classes


def _check_resume(run: RunDir, config: dict[str, Any], seed: int) -> set[str]:
    """The finished parts of an earlier audit in ``run`` with the same plan; another plan there is refused."""
    if not (run.path / "parts").is_dir():
        return set()
    old = run.load_config() if run.config_path.exists() else {}
    if old.get("command") != "audit" or old.get("config") != json.loads(json.dumps(config)) or old.get("seed") != seed:
        raise InputError(f"{run.path} holds an audit with another plan; run it with the same options to resume, "
                         "or choose another --out")
    return {p.stem for p in (run.path / "parts").glob("*.json")}


def register(cli: click.Group) -> None:
    cli.add_command(audit_cmd)
