"""``stealkit audit``: the options of :class:`stealkit.audit.options.AuditOptions` as flags, one
:func:`stealkit.audit.run.run_audit` call, the tables out; ``--fail-if`` exits 1 when a gate fails."""

from __future__ import annotations

import os

import click

from stealkit.audit.options import (
    ANSWERS,
    DEFAULT_MAX_QUERIES,
    DEFAULT_SIZES,
    DEFAULT_UNRELATED,
    LADDER,
    QUICK_LADDER,
    QUICK_SIZES,
    AuditOptions,
    parse_answers,
    parse_gradmatch,
    parse_ints,
    recipe_from_args,
)
from stealkit.commands.common import device_option, parse_kv, test_data_option, victim_option

D, Q = DEFAULT_SIZES, QUICK_SIZES


def _ladder(ladder: tuple[int, ...]) -> str:
    return ",".join(map(str, ladder))


@click.command("audit")
@victim_option()
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--answers", default=",".join(ANSWERS), show_default=True,
              help="Answer kinds to audit (what the API gives, or could give): label, topk, probs.")
@click.option("--top-k", type=int, default=1, show_default=True, help="Classes a topk answer reveals.")
@click.option("--pool", default="pool", show_default=True,
              help="The data of the attacker with data like the victim's: a query source (pool: the attacker split; "
                   "or your own images, a .npy/.npz file or a folder of PNG/JPEG images).")
@click.option("--unrelated", default=DEFAULT_UNRELATED, show_default=True,
              help="The data of the attacker with only unrelated natural data: a query source (patches: crops of "
                   "natural photographs; or another data set).")
@click.option("--defence", "defences", multiple=True, metavar="SPEC",
              help="Also audit probabilities served through this output defence, side by side (repeat; the specs "
                   "of stealkit defences --defence and of a serve key's defences, e.g. round:decimals=1, topk:k=1, "
                   "label, noise:sigma=0.05; and am[:keep=0.95,nu=1000], Adaptive Misinformation, trained on the "
                   "victim's own training split; a local victim only). Without it a local victim's probabilities are "
                   "audited through round:decimals=2 and noise:sigma=0.05 (on the lowest and middle rungs); "
                   "--defence none turns them off.")
@click.option("--fail-if", "fail_if", multiple=True, metavar="q90<N",
              help="A deployment gate: exit 1 when an attacker with data like the victim's reaches 90 % (q90) or 95 % "
                   "(q95) fidelity with fewer than N queries (q90>N: when N queries do not), 0 only when measured "
                   "and held, 3 when it cannot be decided (not measured, or the pool or --max-queries stops the "
                   "ladder below N); where the ladder leaves it open, rungs are added up to N (repeat; label:q90<N "
                   "checks one answer kind).")
@click.option("--budgets", default=None,
              help=f"The ladder of query budgets per cell (default {_ladder(LADDER)}; --quick {_ladder(QUICK_LADDER)}).")
@click.option("--max-queries", type=int, default=DEFAULT_MAX_QUERIES, show_default=True,
              help="Cap on the whole audit's queries; rungs are dropped from the top of the ladder to fit.")
@click.option("--transfer-images", type=int, default=None,
              help=f"Test images PGD attacks from the best stolen copy (default {D.transfer_images}, --quick "
                   f"{Q.transfer_images}; 0 leaves the part out).")
@click.option("--decision-images", type=int, default=None,
              help=f"Test images HopSkipJump attacks, without and with the copy (default {D.decision_images}, "
                   f"--quick {Q.decision_images}; 0 leaves the parts out).")
@click.option("--decision-queries", type=int, default=None,
              help=f"HopSkipJump's queries per image (default {D.decision_queries}, --quick {Q.decision_queries}).")
@click.option("--datafree-budget", type=int, default=None,
              help=f"Cap on the data-free attacker's queries; it gets what the plan leaves, up to this (default "
                   f"{D.datafree_budget:,}, --quick {Q.datafree_budget:,}; 0 leaves it out).")
@click.option("--gradmatch-budgets", default=None,
              help="Gradient matching's ladder of inputs queried, each one answer and one explanation (default "
                   f"{_ladder(D.gradmatch)}, --quick {_ladder(Q.gradmatch)}; 0 leaves it out); a victim that serves "
                   "explanations only.")
@click.option("--exact-budget", type=int, default=None,
              help=f"Cap on exact recovery's queries (125 per hidden unit up to this; default {D.exact_budget:,}; 0 "
                   "leaves it out); a two-layer ReLU (mlp2) victim that serves explanations only.")
@click.option("--seeds", type=int, default=None,
              help="Seeds in all of the spread of Q90/Q95 (the ladder of the attacker with data like the victim's "
                   f"repeated at --seed+1, ... where the plan has room; default {D.seeds}, --quick {Q.seeds}; 1: "
                   "no spread).")
@click.option("--plan", "plan_only", is_flag=True, help="Print the plan and stop (no query).")
@click.option("--quick", is_flag=True, help=f"A small ladder ({_ladder(QUICK_LADDER)}).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="The surrogate recipe of every extraction part: an `extract surrogate` option (epochs=5, "
                   "student=mlp2), student.KEY=VALUE for the student, or a setting of its config (min_steps=0).")
@click.option("--recipe", "recipe", multiple=True, metavar="ARG", hidden=True,
              help="Deprecated: an `extract surrogate` flag of every part (--recipe=--epochs=5); use --set.")
@click.option("--dataset", default=None, help="Data set of the victim's task (default: from its model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@test_data_option
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--out", required=True, type=click.Path(),
              help="Audit directory (run again with the same plan: it resumes).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parts run at once, each a process of one torch thread (default: the CPU cores on the CPU, 1 on "
                   "a GPU); the figures do not depend on it.")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: parts in processes here (--jobs); ray: each part a Ray task on a cluster (the `ray` "
                   "extra); the figures do not depend on it.")
@click.option("--address", default=None,
              help="Address of an existing Ray cluster (auto, HOST:PORT or ray://HOST:10001; with --backend ray; "
                   "default: start a local Ray of --jobs CPUs).")
@device_option
def audit_cmd(victim: str, key: str | None, answers: str, top_k: int, pool: str, unrelated: str,
              defences: tuple[str, ...], fail_if: tuple[str, ...], budgets: str | None, max_queries: int,
              transfer_images: int | None, decision_images: int | None, decision_queries: int | None,
              datafree_budget: int | None, gradmatch_budgets: str | None, exact_budget: int | None,
              seeds: int | None, plan_only: bool, quick: bool, settings: tuple[str, ...], recipe: tuple[str, ...],
              dataset: str | None, data_dir: str | None, test_data: str | None, seed: int, out: str, jobs: int | None,
              backend: str, address: str | None, device: str) -> None:
    """Audit a victim's exposure to model extraction: the default surrogate recipe at a ladder of budgets, per
    answer kind and attacker, and a data-free attacker; fidelity against queries and Q90/Q95 (with their spread
    over seeds where the plan has room); what the stolen copy enables (transfer PGD, HopSkipJump with and without
    it); explanations (gradient matching, exact recovery of a two-layer ReLU victim) when the victim serves them;
    one report. Prints the plan first."""
    options = command_options(
        victim=victim, key=key, answers=answers, top_k=top_k, pool=pool, unrelated=unrelated, defences=defences,
        fail_if=fail_if, budgets=budgets, max_queries=max_queries, quick=quick, settings=settings, recipe=recipe,
        dataset=dataset, data_dir=data_dir, test_data=test_data, seed=seed, out=out, device=device,
        backend=backend, address=address,
        jobs=jobs or (os.cpu_count() or 1 if device == "cpu" else 1),
        sizes={"transfer_images": transfer_images, "decision_images": decision_images,
               "decision_queries": decision_queries, "datafree_budget": datafree_budget,
               "gradmatch": parse_gradmatch(gradmatch_budgets) if gradmatch_budgets is not None else None,
               "exact_budget": exact_budget, "seeds": seeds})
    from stealkit.audit.report import terminal_lines
    from stealkit.audit.run import run_audit

    result = run_audit(options, plan_only=plan_only, echo=click.echo, progress=lambda s: click.echo(s, err=True))
    if plan_only:
        return
    for line in terminal_lines(result.summary, result.report):
        click.echo(line)
    for gate in result.gates:
        click.echo(gate.line, err=True)
    if result.exit_code:
        click.get_current_context().exit(result.exit_code)


def command_options(*, answers: str, budgets: str | None, settings: tuple[str, ...] = (),
                    recipe: tuple[str, ...] = (), defences: tuple[str, ...] = (), fail_if: tuple[str, ...] = (),
                    **kw: object) -> AuditOptions:
    """The command's flags as :class:`AuditOptions` (the old ``--recipe ARG`` spelling translated, with a warning)."""
    given = parse_kv(settings)
    if recipe:
        click.echo("warning: --recipe is deprecated; write the same as --set KEY=VALUE (e.g. --set epochs=5)",
                   err=True)
        given = {**recipe_from_args(recipe), **given}
    return AuditOptions(answers=parse_answers(answers), budgets=parse_ints(budgets) if budgets else None,
                        recipe=given, defences=tuple(defences), fail_if=tuple(fail_if), **kw)  # type: ignore[arg-type]


def register(cli: click.Group) -> None:
    cli.add_command(audit_cmd)
