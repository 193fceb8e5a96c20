"""``stealkit study codfe``: CoDFe Figure 2 and Table 3 (CoDFe against DaST, probability against label access)."""

from __future__ import annotations

from typing import Any

import click

from stealkit.commands.common import device_option


@click.command("codfe")
@click.option("--out", required=True, type=click.Path())
@click.option("--datasets", default="digits,fashion-mnist", show_default=True,
              help="digits (victim digits-conv2) and/or fashion-mnist (victim fmnist-cnn4, the paper's CNN).")
@click.option("--budget", type=int, default=None,
              help="One query budget for every data set (default: 200k on digits, 500k on Fashion-MNIST).")
@click.option("--quick", is_flag=True, help="Digits only, 20k queries.")
@click.option("--diversity", type=float, default=0.0, show_default=True,
              help="CoDFe class-balance weight (a stealkit option, not in the paper; 0 is the paper's loss).")
@click.option("--replay", "replay_capacity", type=int, default=0, show_default=True,
              help="CoDFe experience-replay capacity in images (a stealkit option, not in the paper; 0 = off).")
@click.option("--noise-set", type=int, default=None, help="CoDFe's fixed noise set size M (default 1000).")
@click.option("--seed", type=int, default=0, show_default=True)
@device_option
def codfe_cmd(out: str, datasets: str, budget: int | None, quick: bool, diversity: float, replay_capacity: int,
              noise_set: int | None, seed: int, device: str) -> None:
    """CoDFe Figure 2 and Table 3: substitute accuracy against queries, and queries to maximum accuracy."""
    from stealkit.errors import InputError
    from stealkit.experiments.study_codfe import VICTIMS, run_study

    chosen = ("digits",) if quick else tuple(d.strip() for d in datasets.split(",") if d.strip())
    unknown = set(chosen) - set(VICTIMS)
    if unknown or not chosen:
        raise InputError(f"unknown data sets {sorted(unknown)}; choose from {sorted(VICTIMS)}")
    if budget is not None and budget <= 0:
        raise InputError(f"--budget must be positive, got {budget}")
    budgets = {d: 20_000 if quick else (budget or (200_000 if d == "digits" else 500_000)) for d in chosen}
    if replay_capacity < 0:
        raise InputError(f"--replay must be >= 0 images, got {replay_capacity}")
    overrides: dict[str, Any] = {"diversity": diversity, "replay_capacity": replay_capacity}
    if noise_set:
        overrides["noise_set"] = noise_set
    summary = run_study(out, datasets=chosen, budgets=budgets, codfe_overrides=overrides, seed=seed, device=device)
    for r in summary["rows"]:
        click.echo(f"{r['dataset']:<13} {r['variant']:<8} final {r['final_accuracy']:.3f}  max {r['max_accuracy']:.3f} "
                   f"at {r['queries_to_max']} queries (paper: {r['paper_queries_to_max']})")
    click.echo(f"report: {out}/report.html")


def register(cli: click.Group) -> None:
    cli.commands["study"].add_command(codfe_cmd)  # type: ignore[attr-defined]
