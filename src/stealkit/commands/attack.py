"""``stealkit attack``: transfer attacks from a stolen substitute, decision-based attacks, the CoDFe study. Each\ncommand is options in, one :mod:`stealkit.evade.run` runner call, the closing line out."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_budget,
    dataset_name,
    device_option,
    parse_kv,
    set_option,
    test_data_option,
    victim_option,
)
from stealkit.evade.registry import DECISION, TRANSFER

TARGETS = ("second", "random", "least-likely")


@click.group("attack")
def attack() -> None:
    """Evasion attacks. Transfer: craft on a stolen substitute, count successes on the victim's oracle
    (fgsm, bim, pgd, mifgsm, cw). Decision-based, on the victim's labels only: boundary, hopskipjump, triangle."""


def _victim_opts(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        victim_option(),
        click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim."),
        click.option("--budget", type=int, default=None, callback=check_budget, is_eager=True,
                     help="Victim queries the attack may spend (default: no cap)."),
        click.option("--dataset", default=None, callback=dataset_name, help="Data set of the victim's task (default: from its model.json)."),
        click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files."),
        test_data_option,
        click.option("--n", "n", type=int, default=1000, show_default=True,
                     help="Test images to attack (a seeded sample of the test split)."),
        click.option("--targeted", type=click.Choice(TARGETS), default=None,
                     help="Targeted attack: class 1 (CoDFe's 'second class'), a random class, or the class the "
                          "substitute finds least likely. Default: untargeted."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", required=True, type=click.Path(), help="Run directory to write."),
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def _make_transfer(method: str) -> click.Command:
    @click.command(method, help=f"Transfer {method.upper()}: craft on --substitute, measure success on --victim.")
    @click.option("--substitute", required=True,
                  help="Substitute to craft on: a `stealkit extract` run directory (its student/ is used), a "
                       "model directory, or a TorchScript (.pt) file.")
    @_victim_opts
    @click.option("--eps", type=float, default=0.1, show_default=True, help="Perturbation budget (ignored by cw).")
    @click.option("--norm", type=click.Choice(["linf", "l2"]), default="linf", show_default=True)
    @click.option("--steps", type=int, default=10, show_default=True,
                  help="Iterations (cw: iterations per binary-search round).")
    @click.option("--step", type=float, default=None,
                  help="Step size (default: eps/steps for mifgsm, 2.5 eps/steps for bim and pgd).")
    @click.option("--restarts", type=int, default=1, show_default=True, help="PGD random restarts.")
    @click.option("--kappa", type=float, default=0.0, show_default=True, help="C&W confidence.")
    @click.option("--batch-size", type=int, default=256, show_default=True)
    @set_option("query_batch=128")
    @device_option
    def cmd(substitute: str, victim: str, key: str | None, budget: int | None, dataset: str | None,
            data_dir: str | None, test_data: str | None, n: int, targeted: str | None, seed: int, out: str, eps: float, norm: str,
            steps: int, step: float | None, restarts: int, kappa: float, batch_size: int,
            settings: tuple[str, ...], device: str) -> None:
        from stealkit.evade.run import run_transfer

        r = run_transfer(_target(victim, key, dataset, data_dir, device, seed, test_data), method, substitute, n=n,
                         budget=budget, targeted=targeted, eps=eps, norm=norm, steps=steps, step=step,
                         restarts=restarts, kappa=kappa, batch_size=batch_size, settings=parse_kv(settings), out=out)
        click.echo(f"ASR {fmt.figure(r.asr)} ({r.successes}/{r.attempts}), victim queries "
                   f"{fmt.queries(r.queries)}; "
                   f"report: {r.report}")

    return cmd


DECISION_NAMES = {"boundary": "Boundary attack", "hopskipjump": "HopSkipJump", "triangle": "Triangle Attack"}


def _make_decision(method: str) -> click.Command:
    @click.command(method, help=f"{DECISION_NAMES.get(method, method)} on the victim's labels only (minimum L2); "
                                "every query is charged to the victim's ledger.")
    @_victim_opts
    @click.option("--max-queries", type=int, default=5000, show_default=True, help="Queries per image at most.")
    @click.option("--iterations", type=int, default=None,
                  help="Steps (boundary, default 5000), rounds (hopskipjump, default 40) or triangle searches "
                       "(triangle, default 100000: until --max-queries is spent).")
    @click.option("--substitute", default=None, type=click.Path(exists=True, file_okay=False),
                  help="A stolen model (its directory, or an extraction run directory holding student/): its "
                       "transfer example is the start and its gradient the prior. Default: no substitute.")
    @set_option("init_trials=200")
    @device_option
    def cmd(victim: str, key: str | None, budget: int | None, dataset: str | None, data_dir: str | None,
            test_data: str | None, n: int, targeted: str | None, seed: int, out: str, max_queries: int, iterations: int | None,
            substitute: str | None, settings: tuple[str, ...], device: str, preset: str = "paper",
            start_pool: str | None = None) -> None:
        from stealkit.evade.run import run_decision

        r = run_decision(_target(victim, key, dataset, data_dir, device, seed, test_data), method, max_queries=max_queries, n=n,
                         budget=budget, iterations=iterations, substitute=substitute, start_pool=start_pool,
                         preset=preset, targeted=targeted, settings=parse_kv(settings), out=out)
        click.echo(f"success {fmt.figure(r.asr)} ({r.successes}/{r.attempts}), "
                   f"median L2 {fmt.figure(r.median_l2, 3)}, victim queries "
                   f"{fmt.queries(r.queries)}; report: {r.report}")

    if method == "triangle":
        cmd = click.option(
            "--preset", type=click.Choice(["tuned", "paper"]), default="tuned", show_default=True,
            help="tuned: the settings chosen on validation images (docs/guide/attacks.md); paper: the "
                 "reference code's (Wang et al. 2022). --set overrides either.")(cmd)
    if method == "hopskipjump":
        cmd = click.option(
            "--preset", type=click.Choice(["tuned", "paper"]), default="tuned", show_default=True,
            help="tuned: the settings chosen on validation images (docs/guide/attacks.md), without or with "
                 "--substitute; paper: Chen et al.'s HopSkipJump (with --substitute: its prior and start only). "
                 "--set overrides either.")(cmd)
        cmd = click.option(
            "--start-pool", default=None, metavar="pool|FILE",
            help="Natural images the attacker owns, tried as start directions (one query each; with --preset "
                 "tuned the nearest image of each of 100 k-means clusters, after the opening): 'pool' = the "
                 "attacker split of the victim's data set (never the attacked test images; its labels are not "
                 "read), or a .npy / .safetensors file of images [N, C, H, W] in [0, 1] (loaded without pickle). "
                 "The attacker needs only unlabelled images of the victim's domain. Default: none (noise starts). "
                 "Not with --substitute.")(cmd)
    return cmd


def _target(victim: str, key: str | None, dataset: str | None, data_dir: str | None, device: str,
            seed: int, test_data: str | None = None) -> Any:
    from stealkit.oracle.victim import Target

    return Target(victim, key=key, dataset=dataset, data_dir=data_dir, device=device, seed=seed, test_data=test_data)


def register(cli: click.Group) -> None:
    for m in TRANSFER:
        attack.add_command(_make_transfer(m))
    for m in DECISION:
        attack.add_command(_make_decision(m))
    cli.add_command(attack)
