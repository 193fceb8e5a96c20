"""``stealkit study explanations``: Milli et al. Figures 2-4 (reconstruction accuracy against queries)."""

from __future__ import annotations

import click

from stealkit.commands.common import device_option, parse_int_list


@click.command("explanations")
@click.option("--out", required=True, type=click.Path())
@click.option("--quick", is_flag=True, help="Digits only, 1/10/100 queries, 200 steps.")
@click.option("--datasets", default="digits,fashion-mnist", show_default=True)
@click.option("--archs", default="logistic,mlp2,conv2", show_default=True)
@click.option("--figures", default="2,3,4", show_default=True)
@click.option("--queries", default="1,10,100,1000,10000", show_default=True)
@click.option("--steps", type=int, default=600, show_default=True, help="Training steps per reconstruction.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--data-dir", default=None, type=click.Path())
@device_option
def explanations_cmd(out: str, quick: bool, datasets: str, archs: str, figures: str, queries: str, steps: int,
                     seed: int, data_dir: str | None, device: str) -> None:
    """Figures 2-4 of Milli et al. (2019): gradient vs membership queries, unknown model class, Gaussian queries."""
    from stealkit.experiments.study_explanations import run_study

    if quick:
        datasets, queries, steps = "digits", "1,10,100", 200
    summary = run_study(out, datasets=tuple(datasets.split(",")), archs=tuple(archs.split(",")),
                        figures=parse_int_list(figures), queries=parse_int_list(queries), steps=steps, seed=seed,
                        device=device, data_dir=data_dir)
    for r in summary["reach"]:
        click.echo(f"fig {r['figure']} {r['dataset']:<13} {r['victim']:>8}->{r['student']:<8} {r['pool']:<8} "
                   f"{r['kind']:<10} queries to 0.95x victim: {r['queries_to_reach']}")
    click.echo(f"report: {out}/report.html")


def register(cli: click.Group) -> None:
    cli.commands["study"].add_command(explanations_cmd)  # type: ignore[attr-defined]
