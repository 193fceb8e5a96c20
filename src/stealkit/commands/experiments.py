"""``stealkit run`` and ``stealkit sweep``: experiments as TOML configs, sweeps locally or on Ray."""

from __future__ import annotations

import os

import click

from stealkit import fmt
from stealkit.commands.common import device_option


@click.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--out", default=None, type=click.Path(), help="Run directory (default: runs/<config name>).")
@click.option("--force", is_flag=True, help="Re-run steps that are already finished.")
@device_option
def run_cmd(config: str, out: str | None, force: bool, device: str) -> None:
    """Run the experiment CONFIG (a TOML file of steps); finished steps are not redone. --device goes to every
    step that takes one and does not set its own."""
    from stealkit.experiments.config import load_config
    from stealkit.experiments.runner import run_experiment

    cfg = load_config(config)
    out = out or f"runs/{cfg.name}"
    for o in run_experiment(cfg, out, force=force, device=device):
        click.echo(f"{o.id:>12}  {'skipped (finished)' if o.skipped else f'{o.seconds:.1f} s'}  {o.out}")


@click.command("sweep")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--grid", "grid", multiple=True, required=True, metavar="KEY=V1,V2",
              help="A swept value: seed or STEP.ARG (repeat for a product grid).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", default=None,
              help="Address of an existing Ray cluster (with --backend ray; default: start a local one).")
@click.option("--jobs", "--workers", "workers", type=click.IntRange(min=1), default=None,
              help="Concurrent trials, each a process with its own thread budget (local processes or CPUs of a "
                   "local Ray instance; default: the number of CPU cores).")
@click.option("--out", required=True, type=click.Path(), help="Sweep directory; one sub-directory per trial.")
@device_option
def sweep_cmd(config: str, grid: tuple[str, ...], backend: str, address: str | None, workers: int | None, out: str,
              device: str) -> None:
    """Run CONFIG at every point of a grid, as local processes or Ray tasks."""
    from stealkit.experiments.config import load_config
    from stealkit.experiments.sweep import parse_grid, run_sweep
    from stealkit.raytasks import check_backend

    check_backend(backend, address)
    trials = run_sweep(load_config(config), parse_grid(grid), out, backend=backend,  # type: ignore[arg-type]
                       address=address, workers=workers or os.cpu_count() or 1, device=device)
    for t in trials:
        final = t["final"]
        shown = fmt.record({k: final[k] for k in ("accuracy", "fidelity", "asr", "test_accuracy") if k in final})
        point = ", ".join(f"{k}={v}" for k, v in t["values"].items())
        click.echo(f"{point}  {shown}  {t['dir']}")


def register(cli: click.Group) -> None:
    cli.add_command(run_cmd)
    cli.add_command(sweep_cmd)
