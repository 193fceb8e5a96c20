"""Every study command: ``stealkit study ...``, ``stealkit attack study``, ``stealkit certify-study`` and
``stealkit defences``.

Each command only turns its options into the study's ``Config`` and calls
:func:`stealkit.studies.registry.execute`; the studies themselves live in :mod:`stealkit.studies`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_source,
    dataset_name,
    device_option,
    parse_int_list,
    run_options,
    test_data_option,
    victim_file_option,
)
from stealkit.errors import InputError


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise InputError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip()) if text else ()


def study_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--data-dir, --seed, --out and --device: what every study command takes."""
    data_dir = click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
    return data_dir(run_options(device_option(fn)))


def _execute(name: str, config: Any, out: str, *, seed: int | None = None) -> dict[str, Any]:
    from stealkit.studies.registry import execute

    return execute(name, config, out, seed=seed)[1]


@click.command("list")
def list_cmd() -> None:
    """List every study: its name, the run kind it writes, and the paper result it reproduces."""
    from stealkit.studies.registry import STUDIES

    for name, study in STUDIES.items():
        click.echo(f"{name:<18} {study.KIND:<24} {study.SOURCE}")


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
@click.option("--batch-size", type=int, default=None, help="Override the student batch size of every victim.")
@study_options
def table4_cmd(preset: str, victims: str | None, columns: str | None, taus: str, schedules: str, max_distinct: int | None,
               epochs: int | None, batch_size: int | None, data_dir: str | None, seed: int, out: str,
               device: str) -> None:
    """DFME appendix Table 4: extraction accuracy for every (victim, surrogate source) pair."""
    from stealkit.studies.dfme_table4 import Table4Config, table4_rows

    config = Table4Config(preset=preset, victims=_names(victims), columns=_names(columns), taus=_floats(taus),
                          schedules=_names(schedules), max_distinct=max_distinct, epochs=epochs,
                          batch_size=batch_size, seed=seed, device=device, data_dir=data_dir)
    summary = _execute("dfme-table4", config, out)
    for row in table4_rows(summary["table"]):
        click.echo("  ".join(f"{k}={fmt.figure(v, 3)}" for k, v in row.items()))
    click.echo(f"report: {out}/report.html")


@click.command("dfme-logits")
@click.option("--victims", default="fmnist-conv2,digits-conv2,digits-mlp2,digits-logistic", show_default=True,
              help="Standard victims to measure.")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="Temperature of the probs API.")
@study_options
def logits_cmd(victims: str, temperature: float, data_dir: str | None, seed: int, out: str, device: str) -> None:
    """DFME appendix B: error of logits recovered from probabilities against the logits' mean and spread."""
    from stealkit.studies.dfme_logits import LogitStudyConfig

    config = LogitStudyConfig(victims=_names(victims), temperature=temperature, seed=seed, data_dir=data_dir,
                              device=device)
    summary = _execute("dfme-logits", config, out)
    for row in summary["rows"]:
        click.echo(f"{row['victim']:16s} {row['inputs']:9s} |logit| {row['abs_logit']:.3f} spread {row['spread']:.3f} "
                   f"|mean| {row['abs_mean']:.3f} error {row['l1_error']:.3f} underflow {row['underflow_rows']:.3f}")
    click.echo(f"report: {out}/report.html")


@click.command("dfme-hypothesis1")
@click.option("--victims", default="fmnist-conv2,digits-conv2", show_default=True)
@click.option("--losses", default="kl,l1", show_default=True, help="Student losses to train with.")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Students (seeds) per victim and loss.")
@study_options
def hypothesis1_cmd(victims: str, losses: str, epochs: int, repeats: int, data_dir: str | None, seed: int, out: str,
                    device: str) -> None:
    """DFME appendix D: ||grad_x L_KL|| / ||grad_x L_l1|| on queried images along a student's training."""
    from stealkit.studies.dfme_hypothesis1 import Hypothesis1Config

    config = Hypothesis1Config(victims=_names(victims), losses=_names(losses), epochs=epochs, seed=seed,
                               repeats=repeats, data_dir=data_dir, device=device)
    summary = _execute("dfme-hypothesis1", config, out)
    for key, v in summary["verdicts"].items():
        click.echo(f"{key}: ratio {v['first_ratio']:.4f} -> {v['last_ratio']:.4f} (mean over {v['seeds']} seeds), "
                   f"fall {v['fall_mean']:.2f} +- {v['fall_std']:.2f}x; holds (fall >= {v['fall_factor']:g}x in "
                   f"every seed): {fmt.figure(v['holds'])}")
    click.echo(f"report: {out}/report.html")


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
    from stealkit.studies.codfe_figure2 import CoDFeStudyConfig

    chosen = ("digits",) if quick else _names(datasets)
    if budget is not None and budget <= 0:
        raise InputError(f"--budget must be positive, got {budget}")
    if replay_capacity < 0:
        raise InputError(f"--replay must be >= 0 images, got {replay_capacity}")
    budgets = {d: 20_000 if quick else (budget or (200_000 if d == "digits" else 500_000)) for d in chosen}
    overrides: dict[str, Any] = {"diversity": diversity, "replay_capacity": replay_capacity}
    if noise_set:
        overrides["noise_set"] = noise_set
    config = CoDFeStudyConfig(datasets=chosen, budgets=budgets, codfe_overrides=overrides, seed=seed, device=device)
    summary = _execute("codfe", config, out)
    for r in summary["rows"]:
        click.echo(f"{r['dataset']:<13} {r['variant']:<8} final {r['final_accuracy']:.3f}  max {r['max_accuracy']:.3f} "
                   f"at {r['queries_to_max']} queries (paper: {r['paper_queries_to_max']})")
    click.echo(f"report: {out}/report.html")


@click.command("explanations")
@click.option("--quick", is_flag=True, help="Digits only, 1/10/100 queries, 200 steps.")
@click.option("--datasets", default="digits,fashion-mnist", show_default=True)
@click.option("--archs", default="logistic,mlp2,conv2", show_default=True)
@click.option("--figures", default="2,3,4", show_default=True)
@click.option("--queries", default="1,10,100,1000,10000", show_default=True)
@click.option("--steps", type=int, default=600, show_default=True, help="Training steps per reconstruction.")
@study_options
def explanations_cmd(out: str, quick: bool, datasets: str, archs: str, figures: str, queries: str, steps: int,
                     seed: int, data_dir: str | None, device: str) -> None:
    """Figures 2-4 of Milli et al. (2019): gradient vs membership queries, unknown model class, Gaussian queries."""
    from stealkit.studies.explanations import ExplanationsConfig

    if quick:
        datasets, queries, steps = "digits", "1,10,100", 200
    config = ExplanationsConfig(datasets=_names(datasets), archs=_names(archs), figures=parse_int_list(figures),
                                queries=parse_int_list(queries), steps=steps, seed=seed, device=device,
                                data_dir=data_dir)
    summary = _execute("explanations", config, out)
    for r in summary["reach"]:
        click.echo(f"fig {r['figure']} {r['dataset']:<13} {r['victim']:>8}->{r['student']:<8} {r['pool']:<8} "
                   f"{r['kind']:<10} queries to 0.95x victim: {r['queries_to_reach']}")
    click.echo(f"report: {out}/report.html")


@click.command("study")
@click.option("--dataset", type=click.Choice(["digits", "fashion-mnist"]), default="digits", show_default=True)
@click.option("--victim", default=None, help="Standard victim (default: digits-conv2 / fmnist-cnn4).")
@click.option("--n", "n", type=int, default=1000, show_default=True, help="Test images attacked.")
@click.option("--substitute-arch", default="cnn3", show_default=True)
@click.option("--real-budget", type=int, default=None, help="Queries for the Real-P/L substitutes (default: pool).")
@click.option("--real-epochs", type=int, default=20, show_default=True)
@click.option("--datafree", default="dast,codfe", show_default=True,
              help="Data-free methods to train here (comma-separated; empty for none).")
@click.option("--datafree-budget", type=int, default=20_000, show_default=True)
@click.option("--substitute", "substitutes", multiple=True, metavar="LABEL=DIR",
              help="An extra substitute model directory, e.g. CoDFe-P=runs/codfe/student (repeat).")
@click.option("--quick", is_flag=True, help="Smoke run: 100 images, 2,000 data-free queries, 3 epochs.")
@study_options
def transfer_cmd(dataset: str, victim: str | None, n: int, substitute_arch: str, real_budget: int | None,
                 real_epochs: int, datafree: str, datafree_budget: int, substitutes: tuple[str, ...], quick: bool,
                 data_dir: str | None, seed: int, out: str, device: str) -> None:
    """CoDFe Tables 1-2: FGSM/BIM/PGD transfer ASR from substitutes stolen in probability and label mode."""
    from stealkit.studies.codfe_transfer import StudyConfig

    if quick:
        n, datafree_budget, real_epochs = min(n, 100), min(datafree_budget, 2000), min(real_epochs, 3)
    if any("=" not in s for s in substitutes):
        raise InputError("--substitute takes LABEL=DIR, e.g. CoDFe-P=runs/codfe/student")
    subs = dict(s.split("=", 1) for s in substitutes)
    config = StudyConfig(dataset=dataset, victim=victim, substitute_arch=substitute_arch, n=n,
                         real_budget=real_budget, real_epochs=real_epochs, datafree=_names(datafree),
                         datafree_budget=datafree_budget, substitutes=subs, seed=seed, device=device,
                         data_dir=data_dir)
    summary = _execute("transfer", config, out)
    click.echo(summary["markdown"])
    for note in summary["notes"]:
        click.echo(f"note: {note}")


@click.command("certify-study")
@click.option("--dataset", type=click.Choice(["digits", "fashion-mnist"]), default="digits", show_default=True)
@click.option("--parts", default="bounds,certify,ablation,table1,empirical,soundness", show_default=True,
              help="Comma-separated parts of the study to run.")
@click.option("--quick", is_flag=True, help="Smoke run: few images, few samples, 2-epoch models.")
@click.option("--scale", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="full: the paper's sizes (n = 100k noise samples, 500 test points, four sigmas); for a GPU.")
@study_options
def certify_study_cmd(dataset: str, parts: str, quick: bool, scale: str, seed: int, data_dir: str | None, out: str,
                      device: str) -> None:
    """Li et al. (2019) Sec. 6 at CPU scale: bounds, certified accuracy, ablation, Table 1, EOT attacks,
    soundness check. Models are trained once and cached in runs/victims."""
    from stealkit.studies.stn_certify import PARTS, StudyConfig

    chosen = _names(parts)
    if not chosen or any(p not in PARTS for p in chosen):
        raise InputError(f"--parts must name some of {', '.join(PARTS)}, got {parts!r}")
    config = dataclasses.replace(StudyConfig.for_dataset(dataset, quick=quick, full=scale == "full"), seed=seed,
                                 parts=chosen, device=device, data_dir=data_dir)
    summary = _execute("stn-certify", config, out)
    click.echo(f"study done in {summary['seconds']:.0f}s; report: {out}/report.html")


def _defence_victim(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A standard victim's bare name as the study takes it; anything else as ``--victim`` resolves it (a model
    directory, an ONNX/TorchScript file with ``--input-shape`` etc. folded in, ``standard:NAME``)."""
    from stealkit.commands.common import foreign_flags, resolve_victim
    from stealkit.victims import RECIPES

    if value in RECIPES:
        if foreign_flags(ctx):
            raise InputError(f"--{'/--'.join(k.replace('_', '-') for k in foreign_flags(ctx))} only apply to an ONNX "
                             f"or TorchScript victim; {value} is a standard victim whose model.json already says")
        return value
    return str(resolve_victim(ctx, param, value))


@click.command("defences")
@victim_file_option(click.option("--victim", default="digits-conv2", show_default=True, callback=_defence_victim,
                                 help="Victim: a standard victim's name (digits-conv2, fmnist-conv2, ...) or "
                                      "standard:NAME, a model directory, or an ONNX (.onnx) or TorchScript (.pt) "
                                      "file. Not an HTTP API: each defence is put on the victim's own answers."))
@click.option("--dataset", default=None, callback=dataset_name,
              help="Data set of the victim's task (default: read from the victim's model or file).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@test_data_option
@click.option("--pool", default="pool", show_default=True, callback=check_source,
              help="The baseline's query source: pool (the data set's attacker pool), a data set, gaussian, "
                   "uniform, patches, or your own .npy/.npz file or folder of images.")
@click.option("--budget", type=int, default=300, show_default=True, help="Queries of each baseline extraction.")
@click.option("--defence", "defences", multiple=True, metavar="SPEC",
              help="Defence spec (repeat), e.g. round:decimals=2, topk:k=1, label, "
                   "reverse_sigmoid:beta=1.0,gamma=0.1, noise:sigma=0.05; 'none' is the baseline. Default: a set.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Attack seeds.")
@click.option("--student", default="conv2", show_default=True)
@click.option("--epochs", type=int, default=30, show_default=True)
@click.option("--out", required=True, type=click.Path(), help="Run directory to write.")
@device_option
def defences_cmd(victim: str, dataset: str | None, data_dir: str | None, test_data: str | None, pool: str,
                 budget: int, defences: tuple[str, ...], seeds: str, student: str, epochs: int, out: str,
                 device: str) -> None:
    """The defence table: served accuracy and baseline-extraction accuracy through each output defence."""
    from stealkit.studies.defences import DEFAULT_DEFENCES, DefenceStudyConfig
    from stealkit.train import TrainConfig

    if budget < 1:
        raise InputError("--budget must be at least 1")
    config = DefenceStudyConfig(victim=victim, dataset=dataset, data_dir=data_dir, test_data=test_data, pool=pool,
                                budget=budget, defences=tuple(defences) or DEFAULT_DEFENCES,
                                seeds=parse_int_list(seeds), student=student,
                                train=TrainConfig(epochs=epochs, batch_size=64), device=device)
    summary = _execute("defences", config, out, seed=config.seeds[0])
    for r in summary["rows"]:
        click.echo(f"{r['defence']:<38} served {r['served_accuracy']:.4f}  extracted "
                   f"{r['extraction_accuracy_mean']:.4f} +- {r['extraction_accuracy_std']:.4f}")
    click.echo(f"report: {out}/report.html")


def register(cli: click.Group) -> None:
    from stealkit.commands.attack import attack

    group = cli.commands["study"]
    for cmd in (list_cmd, table4_cmd, logits_cmd, hypothesis1_cmd, codfe_cmd, explanations_cmd):
        group.add_command(cmd)  # type: ignore[attr-defined]
    group.add_command(certify_study_cmd, name="certify")  # type: ignore[attr-defined]
    attack.add_command(transfer_cmd)
    cli.add_command(certify_study_cmd)
    cli.add_command(defences_cmd)
