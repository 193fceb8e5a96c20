"""``stealkit extract surrogate``: surrogate-data extraction (DFME appendix A; Knockoff Nets' adaptive policy;
ActiveThief's active selection and FixMatch on the unqueried pool). ``--preset`` picks the combination; its
default is ``stealkit.extract.surrogate_data.surrogate_presets.DEFAULT_PRESET``, chosen on the validation split
(docs/guide/surrogate.md). :func:`surrogate_config` turns the command's options into the configuration it runs;
``benchmarks/surrogate_extraction.py`` calls it for its default rows (with :func:`command_params`)."""

from __future__ import annotations

import logging
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
from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate_presets import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_PRESET,
    PRESET_NAMES,
)
from stealkit.rundir import RunDir

if TYPE_CHECKING:
    import torch

    from stealkit.extract.common import Victim
    from stealkit.extract.surrogate_data.surrogate import SurrogateConfig

log = logging.getLogger(__name__)


def load_surrogate_pool(spec: str, *, input_shape: tuple[int, ...], n: int | None, seed: int,
                        data_dir: str | None, victim_dataset: str | None, split_seed: int,
                        with_labels: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Images of query source ``spec`` (see :mod:`stealkit.data.query_sources`); with ``with_labels``, also
    the source data set's own labels of the same images (Knockoff Nets' actions), or ``None`` where the
    source has none (synthetic) or they cannot be matched (then the policy clusters the pool instead)."""
    import torch

    from stealkit.data import adapt_images, keep_classes, load_query_source, load_splits, parse_source

    parsed = parse_source(spec)
    if parsed.is_synthetic and n is None:
        raise InputError(f"query source {spec!r} is synthetic: give a number of images")
    x = load_query_source(spec, input_shape=input_shape, n=n, seed=seed, data_dir=data_dir,
                          victim_dataset=victim_dataset, split_seed=split_seed)
    if not with_labels or parsed.is_synthetic or parsed.imbalance is not None:
        return x, None
    name = victim_dataset if parsed.name == "pool" else parsed.name
    ds = load_splits(str(name), data_dir=data_dir, seed=split_seed).attacker_pool
    if parsed.classes is not None:
        ds = keep_classes(ds, parsed.classes)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    if n is not None:
        order = order[:n]
    if order.numel() != x.shape[0] or not torch.equal(adapt_images(ds.x[order], input_shape), x):
        log.warning("could not match labels to the query source %r; knockoff will cluster the pool", spec)
        return x, None
    return x, ds.y[order]


@click.command("surrogate")
@victim_options
@click.option("--pool", default="pool", show_default=True, callback=check_source,
              help="Surrogate source: pool (the attacker split), pool:classes=0-4 (skewed), another data set "
                   "(adapted by resizing and channel repetition), patches, gaussian.")
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
                  dataset: str | None, data_dir: str | None, pool: str, max_distinct: int | None, loss: str,
                  tau: float | None, schedule: str, lr: float | None, strategy: str, select: str | None, ssl: str | None,
                  preset: str, resume: bool, student: str, student_args: tuple[str, ...], epochs: int,
                  batch_size: int, eval_every: int, settings: tuple[str, ...], seed: int, out: str,
                  device: str) -> None:
    """Surrogate-data extraction: query a surrogate pool, distil the answers with the tau-scaled KL (DFME A)."""
    from stealkit.extract.common import (
        make_evaluator,
        open_victim,
        save_extraction,
        student_factory,
        victim_splits,
    )
    from stealkit.extract.registry import METHODS
    from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT, resolve_loss

    resolve_loss(loss, mode)  # type: ignore[arg-type]  # refuse e.g. KL on labels before any work
    kwargs = parse_kv(student_args)
    method = METHODS["surrogate"]
    cap = min(budget, max_distinct) if max_distinct is not None else budget
    params = {"mode": mode, "max_distinct": max_distinct, "loss": loss, "tau": tau, "schedule": schedule, "lr": lr,
              "strategy": strategy, "select": select, "ssl": ssl, "preset": preset, "epochs": epochs,
              "batch_size": batch_size, "eval_every": eval_every, "settings": settings, "seed": seed}

    def refuse_resume() -> None:
        raise InputError("--resume continues active rounds; this run has --select random (nothing to resume)")

    # refuse bad settings and resume mistakes before the victim is opened; one class gives the most answers per
    # class, so if even then nothing is checkpointed (the default selects by margin from 20 per class), nothing is
    _, widest = surrogate_config(params, cap, 1)
    if resume and widest.select == "random":
        refuse_resume()
    run = RunDir(out)
    checkpoint = run.path / "checkpoint"
    if not resume and (checkpoint / "active.json").exists():
        raise InputError(f"{out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out")
    v = open_victim(victim, mode=mode, budget=budget, temperature=temperature, top_k=top_k, key=key,
                    dataset=dataset, device=device, seed=seed)
    resolved, config = surrogate_config(params, cap, v.num_classes, flip=v.dataset in FLIP_INVARIANT)
    checkpointed = config.select != "random"
    if resume and not checkpointed:
        refuse_resume()
    splits = victim_splits(v, data_dir)
    x_pool, labels = surrogate_pool(pool, v, config, cap=cap, seed=seed, data_dir=data_dir)
    cfg = {"victim": victim, "mode": mode, "budget": budget, "pool": pool, "student": student, "preset": preset,
           "preset_resolved": resolved, "student_kwargs": kwargs, "dataset": v.dataset, "surrogate": config}
    run.create(command="extract surrogate", seed=seed, config=cfg)
    result = method.run(v.oracle, x_pool, make_student=student_factory(student, v, seed, **kwargs),
                        config=config, evaluator=make_evaluator(v, splits.test.x, splits.test.y, device),
                        pool_labels=labels, on_point=run.append_record, device=device,
                        checkpoint_dir=checkpoint if checkpointed else None, resume=resume)
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=seed, config=cfg)
    click.echo(f"accuracy {fmt.figure(result.accuracy)}, fidelity {fmt.figure(result.fidelity)}, "
               f"queries {fmt.queries(result.queries)}; "
               f"report: {run.report_path}")


def surrogate_pool(pool: str, v: Victim, config: SurrogateConfig, *, cap: int, seed: int,
                   data_dir: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The images (and, for Knockoff Nets' policy, their source labels) the command queries from: plain random
    queries take the first ``cap`` of a shuffle; the adaptive policy, active selection and FixMatch use the whole
    pool (a synthetic source draws four candidates per query it may make)."""
    from stealkit.data import parse_source

    knockoff = config.strategy == "knockoff"
    whole = knockoff or config.select != "random" or config.ssl != "none"
    n_pool = (4 * cap if parse_source(pool).is_synthetic else None) if whole else cap
    return load_surrogate_pool(pool, input_shape=v.input_shape, n=n_pool, seed=seed, data_dir=data_dir,
                               victim_dataset=v.dataset, split_seed=v.split_seed, with_labels=knockoff)


def surrogate_config(params: dict[str, Any], answers: int, num_classes: int, *,
                     flip: bool = False) -> tuple[str, SurrogateConfig]:
    """The configuration the command runs for its options ``params`` (keyed by the command's parameter names:
    ``mode``, ``preset``, ``epochs``, ``batch_size``, ``settings`` as ``KEY=VALUE`` strings, ...; see
    :func:`command_params`) at ``answers`` distinct images of ``num_classes`` classes, and the name of what the
    preset resolved to. ``--strategy knockoff`` runs the ``paper`` preset (its own policy chooses every query); an
    explicit ``--select/--ssl/--tau/--lr`` and then ``--set`` win over the preset; ``flip``: FixMatch mirrors
    images (a flip-invariant data set) unless ``--set fixmatch.flip`` says otherwise
    (:func:`stealkit.extract.surrogate_data.surrogate.resolve_config`)."""
    from stealkit.extract.surrogate_data.surrogate import resolve_config

    flags = {k: params[k] for k in ("select", "ssl", "tau", "lr") if params.get(k) is not None}
    preset = params["preset"] if params["strategy"] == "random" else "paper"
    fields = {k: params[k] for k in ("max_distinct", "loss", "epochs", "batch_size", "schedule", "strategy",
                                     "eval_every", "seed")}
    return resolve_config(preset, answers, num_classes, mode=params["mode"], flip=flip,
                          settings={**flags, **parse_kv(tuple(params["settings"]))}, **fields)


def command_params(*args: str) -> dict[str, Any]:
    """The options ``stealkit extract surrogate ARGS`` runs with, parsed by the command itself (its own
    defaults for every option ``args`` does not give; the required ``--victim`` and ``--out`` need
    not be given, then they read ``-``; ``--budget`` must be): what
    :func:`surrogate_config` takes. E.g. ``command_params("--budget", "100", "--mode", "label")``."""
    given = {a.split("=", 1)[0] for a in args}
    head = [x for flag, v in (("--victim", "."), ("--out", "-")) if flag not in given for x in (flag, v)]
    from stealkit.device import keep_resolved

    with keep_resolved(), surrogate_cmd.make_context("surrogate", [*head, *args]) as ctx:
        return dict(ctx.params)


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(surrogate_cmd)  # type: ignore[attr-defined]
