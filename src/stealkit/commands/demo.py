"""``stealkit demo``: the end-to-end demo on embedded digits data."""

from __future__ import annotations

import click

from stealkit.commands.common import device_option, parse_int_list


@click.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(), help="Run directory.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--budgets", default="20,50,100,400", show_default=True, help="Query budgets to steal at.")
@device_option
def demo_cmd(out: str, seed: int, budgets: str, device: str) -> None:
    """Train a digits victim, steal it at several budgets through probs and label oracles, write a report."""
    from stealkit.demo import run_demo

    summary = run_demo(out, seed=seed, budgets=parse_int_list(budgets), device=device)
    click.echo(summary_table(summary))
    click.echo(f"report: {out}/report.html ({summary['wall_seconds']} s)")


def summary_table(summary: dict) -> str:
    """The demo's results as one short table: both oracles, accuracy and fidelity at every budget."""
    lines = [f"victim (digits conv2) test accuracy {summary['victim_accuracy']:.3f}; the student copied through:",
             f"{'queries':>8}  {'probabilities':>21}  {'labels only':>21}",
             f"{'':>8}  {'accuracy':>10} {'fidelity':>10}  {'accuracy':>10} {'fidelity':>10}"]
    label = {p["queries"]: p for p in summary.get("extraction_label", [])}
    for p in summary["extraction"]:
        q = label.get(p["queries"], {})
        lines.append(f"{p['queries']:>8,}  {p['accuracy']:>10.3f} {p['fidelity']:>10.3f}  "
                     f"{q.get('accuracy', float('nan')):>10.3f} {q.get('fidelity', float('nan')):>10.3f}")
    return "\n".join(lines)


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)
