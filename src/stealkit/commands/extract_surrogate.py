"""``stealkit extract surrogate``: surrogate-data extraction (DFME appendix A; Knockoff Nets' adaptive policy;
ActiveThief's active selection and FixMatch on the unqueried pool). ``--preset`` picks the combination; its
default is ``stealkit.extract.surrogate_data.presets.DEFAULT_PRESET``, chosen on the validation split
(docs/guide/surrogate.md). The command is options in, one
:func:`~stealkit.extract.surrogate_data.run.run_surrogate` call, the closing line out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_arch,
    check_source,
    device_option,
    parse_kv,
    run_options,
    set_option,
    victim_options,
)
from stealkit.extract.surrogate_data.presets import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_PRESET,
    PRESET_NAMES,
)

if TYPE_CHECKING:

    from stealkit.extract.surrogate_data.run import SurrogateOptions

#: the command's options that are SurrogateOptions fields (the rest: the Target's, budget, out, resume)
OPTION_FIELDS = ("mode", "temperature", "pool", "max_distinct", "loss", "tau", "schedule", "lr", "strategy", "select",
                 "ssl", "preset", "student", "epochs", "batch_size", "eval_every")


@click.command("surrogate")
@victim_options
@click.option("--pool", default="pool", show_default=True, callback=check_source,
              help="Surrogate source: pool (the attacker split), pool:classes=0-4 (skewed), another data set "
                   "(adapted by resizing and channel repetition), patches, gaussian, or your own images (a .npy/.npz "
                   "file or a folder of PNG/JPEG images, adapted the same way).")
@click.option("--max-distinct", type=int, default=None,
              help="Cap on distinct images queried (DFME A.2 uses 50000); default: the budget.")
@click.option("--loss", type=click.Choice(["auto", "kl", "ce", "l1"]), default="auto", show_default=True,
              help="auto: tau^2 KL for probs/topk/logits, cross entropy for labels; l1 on (recovered) logits.")
@click.option("--tau", type=float, default=None,
              help="Temperature of the KL loss (A.1). Default: the preset's (1; the default preset with probability "
                   "answers: 2).")
@click.option("--schedule", type=click.Choice(["cyclic", "step", "constant"]), default="cyclic", show_default=True,
              help="Learning-rate schedule of A.2: one-cycle, or x0.2 at 30/60/80%; or constant.")
@click.option("--lr", type=float, default=None,
              help="Maximum learning rate of the student's SGD. Default: the preset's (the default preset with "
                   "probability answers: 0.05), else 0.1 (DFME A.2).")
@click.option("--strategy", type=click.Choice(["random", "knockoff"]), default="random", show_default=True,
              help="Which images to query: a random shuffle, or Knockoff Nets' adaptive policy.")
@click.option("--select", type=click.Choice(["random", "entropy", "margin", "kcenter"]), default=None,
              help="Which images to query, in rounds of query -> train -> select (ActiveThief): the student's "
                   "uncertainty (entropy, margin) or coverage (kcenter); random: one shuffle. Default: the preset's.")
@click.option("--ssl", type=click.Choice(["none", "fixmatch"]), default=None,
              help="Also train on the unqueried pool with FixMatch consistency (Jagielski et al. 2020). "
                   "Default: the preset's.")
@click.option("--preset", type=click.Choice(list(PRESET_NAMES)), default=DEFAULT_PRESET, show_default=True,
              help="auto: with probability answers (--mode probs) random queries with equal-sized batches, tau 2, "
                   "lr 0.05, --set grad_clip=5 and at least --set min_steps=3000 training steps at every budget; with "
                   "other answers FixMatch on the unqueried pool with label smoothing 0.1 below 10 queries per class, "
                   "equal-sized batches with label smoothing 0.1 from 10 per class (--set batching=ragged: a small "
                   "last batch); from 20 per class half the queries chosen by margin (--select margin, --set "
                   "active.initial=0.5) (config.json records what it resolved to); paper: random queries, no SSL "
                   "(DFME appendix A) (docs/guide/surrogate.md).")
@click.option("--resume", is_flag=True, help="Continue the stopped active rounds in --out from their checkpoint.")
@click.option("--student", default="conv2", show_default=True, callback=check_arch, help="Student architecture.")
@click.option("--student-arg", "student_args", multiple=True, metavar="KEY=VALUE")
@click.option("--epochs", type=int, default=DEFAULT_EPOCHS, show_default=True,
              help="Student epochs; with probability answers the default raises them to at least 3,000 steps "
                   "(--set min_steps=0 keeps them as given).")
@click.option("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, show_default=True,
              help="Student batch size (64: the batch every validation screen of the default used).")
@click.option("--eval-every", type=int, default=5, show_default=True, help="Score the student every N epochs.")
@set_option("knockoff.alpha=0.2")
@run_options
@device_option
def surrogate_cmd(victim: str, key: str | None, mode: str, temperature: float, top_k: int, budget: int,
                  dataset: str | None, data_dir: str | None, test_data: str | None, pool: str,
                  max_distinct: int | None, loss: str,
                  tau: float | None, schedule: str, lr: float | None, strategy: str, select: str | None, ssl: str | None,
                  preset: str, resume: bool, student: str, student_args: tuple[str, ...], epochs: int,
                  batch_size: int, eval_every: int, settings: tuple[str, ...], seed: int, out: str,
                  device: str) -> None:
    """Surrogate-data extraction: query a surrogate pool, distil the answers with the tau-scaled KL (DFME A)."""
    from stealkit.extract.surrogate_data.run import run_surrogate
    from stealkit.oracle.victim import Target

    params = dict(click.get_current_context().params)
    target = Target(victim, key=key, top_k=top_k, dataset=dataset, data_dir=data_dir, device=device, seed=seed,
                    test_data=test_data)
    r = run_surrogate(target, budget, surrogate_options(params), out=out, resume=resume)
    click.echo(f"accuracy {fmt.figure(r.accuracy)}, fidelity {fmt.figure(r.fidelity)}, "
               f"queries {fmt.queries(r.result.queries)}; "
               f"report: {r.path / 'report.html'}")


def surrogate_options(params: dict[str, Any]) -> SurrogateOptions:
    """The :class:`~stealkit.extract.surrogate_data.run.SurrogateOptions` of the command's parsed ``params``
    (``student_args`` and ``settings`` as ``KEY=VALUE`` strings)."""
    from stealkit.extract.surrogate_data.run import SurrogateOptions

    return SurrogateOptions(**{k: params[k] for k in OPTION_FIELDS},
                            student_kwargs=parse_kv(tuple(params.get("student_args", ()))),
                            settings=parse_kv(tuple(params.get("settings", ()))))


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(surrogate_cmd)  # type: ignore[attr-defined]
