"""``stealkit report``: re-render a run directory's report.html."""

from __future__ import annotations

import click


@click.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False))
def report_cmd(run_dir: str) -> None:
    """Rebuild RUN_DIR/report.html from its config.json, summary.json and records.jsonl."""
    from stealkit.report.builders import build_report
    from stealkit.rundir import RunDir

    run = RunDir(run_dir)
    run.write_report(build_report(run))
    click.echo(str(run.report_path))


def register(cli: click.Group) -> None:
    cli.add_command(report_cmd)
