"""``stealkit reproduce``: every paper study at one scale, one combined report."""

from __future__ import annotations

import click

from stealkit.commands.common import device_option


@click.command("reproduce")
@click.option("--scale", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="small: CPU scale (measured wall time in docs/results.md#reproduce); full: the papers' settings (meant for a GPU).")
@click.option("--out", default="runs/reproduce", show_default=True, type=click.Path())
@click.option("--only", multiple=True, help="Run only these studies (repeat): a name from --list or from `stealkit study list`.")
@click.option("--list", "list_only", is_flag=True, help="List the studies of this scale and exit.")
@click.option("--force", is_flag=True, help="Re-run finished steps.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Studies run at once, each in its own process (default: the number of CPU cores).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: studies in processes here; ray: each study a Ray task (the `ray` extra).")
@click.option("--address", default=None,
              help="Address of an existing Ray cluster (with --backend ray; default: start a local Ray).")
@device_option
def reproduce_cmd(scale: str, out: str, only: tuple[str, ...], list_only: bool, force: bool, jobs: int | None,
                  backend: str, address: str | None, device: str) -> None:
    """Run every study that reproduces a paper result and write OUT/report.html (papers beside ours)."""
    from stealkit.experiments.config import load_config
    from stealkit.experiments.reproduce import config_paths, reproduce, study_aliases
    from stealkit.raytasks import check_backend

    check_backend(backend, address)
    if list_only:
        configs = [load_config(p) for p in config_paths(scale)]
        aliases = study_aliases(configs)
        for cfg in configs:
            also = sorted(a for a, names in aliases.items() if cfg.name in names)
            click.echo(f"{cfg.name:<28} {cfg.description}" + (f" (study {', '.join(also)})" if also else ""))
        return
    import os

    summary = reproduce(scale, out, only=only, force=force, jobs=jobs or os.cpu_count() or 1,
                        device=device, backend=backend, address=address)
    for s in summary["studies"]:
        click.echo(f"{s['name']:<28} {s['seconds']:>8.1f} s")
    click.echo(f"total {summary['compute_seconds']} s of study time ({summary['wall_seconds']} s in this run); "
               f"report: {out}/report.html")
    if summary["failed"]:
        from stealkit.errors import StealkitError

        raise StealkitError(f"{len(summary['failed'])} studies failed: {', '.join(summary['failed'])}; the report "
                            "says why. Fix them and run the same command again: finished steps are kept")


def register(cli: click.Group) -> None:
    cli.add_command(reproduce_cmd)
