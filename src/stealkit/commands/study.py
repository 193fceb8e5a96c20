"""``stealkit study ...``: commands that reproduce a paper's table or figure and write a run directory.

This module creates the ``study`` group when no other command module has yet, and adds the DFME appendix
studies: ``dfme-table4`` (Table 4), ``dfme-logits`` (appendix B) and ``dfme-hypothesis1`` (appendix D).
"""

from __future__ import annotations

from typing import Any

import click

from stealkit.commands.common import device_option
from stealkit.report.builders import register_builder
from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir


def _floats(text: str) -> tuple[float, ...]:
    from stealkit.errors import InputError

    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise InputError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip()) if text else ()


@click.command("dfme-table4")
@click.option("--preset", type=click.Choice(["cpu", "paper"]), default="cpu", show_default=True,
              help="cpu: Fashion-MNIST and digits CNNs; paper: CIFAR-10 / SVHN ResNet-18 victims (use --device cuda).")
@click.option("--victims", default=None, help="Comma-separated subset of the preset's victims.")
@click.option("--columns", default=None,
              help="Comma-separated subset of the columns (surrogate sources) by label, e.g. 'own pool,gaussian'.")
@click.option("--taus", default="1,3,5,10", show_default=True, help="Temperatures of A.2's grid.")
@click.option("--schedules", default="cyclic,step", show_default=True)
@click.option("--max-distinct", type=int, default=None, help="Override the cap on distinct samples of every victim.")
@click.option("--epochs", type=int, default=None, help="Override the student epochs of every victim.")
@click.option("--data-dir", default=None, type=click.Path())
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path())
@device_option
def table4_cmd(preset: str, victims: str | None, columns: str | None, taus: str, schedules: str, max_distinct: int | None,
               epochs: int | None, data_dir: str | None, seed: int, out: str, device: str) -> None:
    """DFME appendix Table 4: extraction accuracy for every (victim, surrogate source) pair."""
    from stealkit.experiments.study_dfme_table4 import Table4Config, run_table4

    config = Table4Config(preset=preset, victims=_names(victims), columns=_names(columns), taus=_floats(taus), schedules=_names(schedules),
                          max_distinct=max_distinct, epochs=epochs, seed=seed, device=device, data_dir=data_dir)
    run = RunDir(out).create(command="study dfme-table4", seed=seed, config={"table4": config})
    result = run_table4(config, on_row=run.append_record)
    run.write_summary({"table": result["table"], "victims": result["victims"],
                       "conclusions": result["conclusions"]})
    _write_report(run)
    for row in table4_rows(result["table"]):
        click.echo("  ".join(f"{k}={v}" for k, v in row.items()))
    click.echo(f"report: {run.report_path}")


@click.command("dfme-logits")
@click.option("--victims", default="fmnist-conv2,digits-conv2,digits-mlp2,digits-logistic", show_default=True,
              help="Standard victims to measure.")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="Temperature of the probs API.")
@click.option("--data-dir", default=None, type=click.Path())
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path())
@device_option
def logits_cmd(victims: str, temperature: float, data_dir: str | None, seed: int, out: str, device: str) -> None:
    """DFME appendix B: error of logits recovered from probabilities against the logits' mean and spread."""
    from stealkit.experiments.study_logits import LogitStudyConfig, logit_recovery_study

    config = LogitStudyConfig(victims=_names(victims), temperature=temperature, seed=seed, data_dir=data_dir,
                              device=device)
    run = RunDir(out).create(command="study dfme-logits", seed=seed, config={"logits": config})
    rows = logit_recovery_study(config)
    for row in rows:
        run.append_record(row)
    run.write_summary({"rows": rows})
    _write_report(run)
    for row in rows:
        click.echo(f"{row['victim']:16s} {row['inputs']:9s} |logit| {row['abs_logit']:.3f} spread {row['spread']:.3f} "
                   f"|mean| {row['abs_mean']:.3f} error {row['l1_error']:.3f} underflow {row['underflow_rows']:.3f}")
    click.echo(f"report: {run.report_path}")


@click.command("dfme-hypothesis1")
@click.option("--victims", default="fmnist-conv2,digits-conv2", show_default=True)
@click.option("--losses", default="kl,l1", show_default=True, help="Student losses to train with.")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--data-dir", default=None, type=click.Path())
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path())
@device_option
def hypothesis1_cmd(victims: str, losses: str, epochs: int, data_dir: str | None, seed: int, out: str,
                    device: str) -> None:
    """DFME appendix D: ||grad_x L_KL|| / ||grad_x L_l1|| on queried images along a student's training."""
    from stealkit.experiments.study_logits import Hypothesis1Config, hypothesis1_study

    config = Hypothesis1Config(victims=_names(victims), losses=_names(losses), epochs=epochs, seed=seed,
                               data_dir=data_dir, device=device)
    run = RunDir(out).create(command="study dfme-hypothesis1", seed=seed, config={"hypothesis1": config})
    result = hypothesis1_study(config, on_point=run.append_record)
    run.write_summary(result)
    _write_report(run)
    for key, v in result["verdicts"].items():
        click.echo(f"{key}: ratio {v['first_ratio']:.4f} -> {v['last_ratio']:.4f}; holds: {v['holds']}")
    click.echo(f"report: {run.report_path}")


def _write_report(run: RunDir) -> None:
    from stealkit.report.builders import build_report

    run.write_report(build_report(run))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table4_rows(table: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Our Table 4 as rows of strings: victim accuracy, then the best accuracy per surrogate column."""
    rows = []
    for name, cells in table.items():
        row = {"victim": name, "victim acc.": _pct(cells.get("victim"))}
        for col, c in cells.items():
            if isinstance(c, dict):
                row[f"{col} ({c['taxonomy']})"] = f"{_pct(c['accuracy'])} (tau {c['tau']:g}, {c['schedule']})"
        rows.append(row)
    return rows


@register_builder("study dfme-table4")
def table4_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    from stealkit.experiments.study_dfme_table4 import PAPER_TABLE4

    paper = [{"victim": v, **{k: "-" if x is None else f"{x:.1f}%" for k, x in cells.items()}}
             for v, cells in PAPER_TABLE4.items()]
    table = summary.get("table", {})
    concl = [{"claim": c["claim"], "holds on ours": c["holds"], "evidence": c["evidence"]}
             for c in summary.get("conclusions", [])]
    records = run.records()
    return [
        Section("Table 4: ours beside the paper's", paragraphs=[
            "Each cell is the best test accuracy of the extracted student over the grid tau in {1, 3, 5, 10} x "
            "{cyclic, step} schedules, at the cap of distinct samples given per victim (A.2). Columns are the "
            "surrogate source, with its letter in the A/B/C taxonomy of appendix A."],
            tables=[("ours", table4_rows(table)), ("paper (Truong et al. 2021, Table 4)", paper),
                    ("victims", [{"victim": k, **v} for k, v in summary.get("victims", {}).items()])]),
        Section("Where the conclusions agree", tables=[("", concl)]),
        Section("Every run", tables=[("", records)]),
    ]


@register_builder("study dfme-logits")
def logits_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    rows = summary.get("rows", [])
    return [Section("Recovered logits against the true ones", paragraphs=[
        "abs_logit: mean |v_i|; spread: std of v over classes; abs_mean: |mean_j v_j|, the per-image constant "
        "that log p - mean(log p) cannot recover; l1_error: mean |v*_i - v_i| for v* recovered from the float32 "
        "probabilities the API returns; centred_error: the numerical part of that error; underflow_rows: share "
        "of images with a probability below float32's smallest normal number. The paper's claim (Section 6.3) "
        "holds where abs_mean is small against spread and abs_logit."], tables=[("", rows)])]


@register_builder("study dfme-hypothesis1")
def hypothesis1_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    traces = summary.get("traces", {})
    series = {k: ([p["epoch"] for p in pts], [p["ratio"] for p in pts]) for k, pts in traces.items()}
    uri = line_plot(series, xlabel="epoch (0 = before training)", ylabel="median ||grad KL|| / ||grad l1||")
    verdicts = [{"run": k, **v} for k, v in summary.get("verdicts", {}).items()]
    rows = [p for pts in traces.values() for p in pts]
    return [Section("Hypothesis 1: KL vs l1 input gradients", paragraphs=[
        "Median over 256 queried images of the ratio of input-gradient norms, measured through both networks "
        "(D.2's losses, summed over classes). Hypothesis 1 holds if the ratio falls as the student converges "
        "and ends small (< 0.1)."], tables=[("verdicts", verdicts), ("trace", rows)],
        figures=[Figure(uri, "||grad_x L_KL|| / ||grad_x L_l1|| against training progress")])]


def register(cli: click.Group) -> None:
    if "study" not in cli.commands:

        @cli.group("study")
        def study() -> None:
            """Reproduce a paper's table or figure: one subcommand per study."""

    group = cli.commands["study"]
    for cmd in (table4_cmd, logits_cmd, hypothesis1_cmd):
        group.add_command(cmd)  # type: ignore[attr-defined]
