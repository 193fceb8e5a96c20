"""``stealkit demo``: the end-to-end demo on embedded digits data."""

from __future__ import annotations

import click

from stealkit.commands.common import device_option, parse_int_list


@click.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(), help="Run directory.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--budgets", default="20,50,100,200,400", show_default=True, help="Query budgets to steal at.")
@device_option
def demo_cmd(out: str, seed: int, budgets: str, device: str) -> None:
    """Train a digits victim, steal it at several budgets through probs and label oracles, write a report."""
    from stealkit.demo import run_demo

    summary = run_demo(out, seed=seed, budgets=parse_int_list(budgets), device=device)
    click.echo(f"victim accuracy {summary['victim_accuracy']:.4f}")
    for p in summary["extraction"]:
        click.echo(f"  probs oracle, {p['queries']:>4} queries: accuracy {p['accuracy']:.4f} fidelity {p['fidelity']:.4f}")
    click.echo(f"report: {out}/report.html ({summary['wall_seconds']} s)")


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)
