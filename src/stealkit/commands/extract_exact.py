"""``stealkit extract exact``: exact recovery of a two-layer ReLU victim (Milli et al. 2019, Sec. 3, App. C)
or one-query identification of a logistic victim (footnote 2)."""

from __future__ import annotations

from pathlib import Path

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_budget,
    dataset_name,
    device_option,
    parse_kv,
    run_options,
    set_option,
    test_data_option,
    victim_option,
)

VARIANTS = ("gradient", "mq", "logistic")


@click.command("exact")
@victim_option(help_text="Victim: a zoo mlp2 or logistic model directory, an http(s):// API, or standard:NAME.")
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--variant", type=click.Choice(VARIANTS), default="gradient", show_default=True,
              help="gradient: Algorithm 1 from gradient + membership queries; mq: Algorithm 1-MQ (membership "
                   "queries only); logistic: footnote 2's identification of a logistic model.")
@click.option("--hidden", type=int, default=None,
              help="The victim's hidden width h (default: read from a local victim's model.json).")
@click.option("--budget", type=int, default=None, callback=check_budget, is_eager=True, help="Victim queries the attack may spend (default: no limit).")
@click.option("--search", type=click.Choice(["secant", "bisect"]), default="secant", show_default=True,
              help="bisect: the paper's binary search; secant: jump to the kink from two values (fewer queries).")
@click.option("--lines", type=int, default=40, show_default=True,
              help="Search lines tried at most (retries on fresh random lines).")
@click.option("--anchors", type=int, default=500, show_default=True,
              help="Attacker-pool images seeding the search lines (free: they are not queried).")
@click.option("--epsilon", type=float, default=None, help="Search resolution in t (default: by precision).")
@click.option("--dataset", default=None, callback=dataset_name, help="Data set of the victim's task (default: from model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@test_data_option
@set_option("check_points=32")
@run_options
@device_option
def exact_cmd(victim: str, key: str | None, variant: str, hidden: int | None, budget: int | None, search: str,
              lines: int, anchors: int, epsilon: float | None, dataset: str | None, data_dir: str | None,
              test_data: str | None, settings: tuple[str, ...], seed: int, out: str, device: str) -> None:
    """Recover a functionally equivalent copy of a two-layer ReLU (or logistic) victim from explanations."""
    from stealkit.extract.explanations.run import run_exact as runner
    from stealkit.oracle.victim import Target

    target = Target(victim, key=key, dataset=dataset, data_dir=data_dir, device=device, seed=seed,
                    test_data=test_data)
    r = runner(target, variant=variant, hidden=hidden, budget=budget, search=search, lines=lines, anchors=anchors,
               epsilon=epsilon, settings=parse_kv(settings), out=out)
    click.echo(f"accuracy {fmt.figure(r.accuracy)}, fidelity {fmt.figure(r.fidelity)}, "
               f"queries {fmt.queries(r.result.queries)}; "
               f"report: {Path(out) / 'report.html'}")


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(exact_cmd)  # type: ignore[attr-defined]
