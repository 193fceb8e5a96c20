"""``stealkit extract surrogate``: surrogate-data extraction (DFME appendix A; Knockoff Nets' adaptive policy;
ActiveThief's active selection and FixMatch on the unqueried pool). ``--preset`` picks the combination; its
default is ``stealkit.extract.surrogate_data.surrogate_presets.DEFAULT_PRESET``, chosen on the validation split (docs/surrogate-active.md)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click

from stealkit.commands.common import device_option, parse_kv, run_options, set_option, victim_options
from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate_presets import DEFAULT_PRESET, PRESET_NAMES, resolve_preset
from stealkit.rundir import RunDir

if TYPE_CHECKING:
    import torch

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
@click.option("--pool", default="pool", show_default=True,
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
              help="Maximum learning rate of the student's optimiser (--set optimizer=sgd|adam). "
                   "Default: the preset's (the default preset with probability answers: 0.05 with SGD), else 0.1 "
                   "with SGD, 1e-3 with Adam.")
@click.option("--strategy", type=click.Choice(["random", "knockoff"]), default="random", show_default=True,
              help="Which images to query: a random shuffle, or Knockoff Nets' adaptive policy.")
@click.option("--select", type=click.Choice(["random", "entropy", "margin", "kcenter", "mix"]), default=None,
              help="Which images to query, in rounds of query -> train -> select (ActiveThief): the student's "
                   "uncertainty (entropy, margin), coverage (kcenter), or both (mix); random: one shuffle. "
                   "Default: the preset's.")
@click.option("--ssl", type=click.Choice(["none", "fixmatch", "soft"]), default=None,
              help="Also train on the unqueried pool (Jagielski et al. 2020): FixMatch consistency, or soft "
                   "sharpened teacher targets (soft, MixMatch label guessing). "
                   "Default: the preset's.")
@click.option("--pretrain", type=click.Choice(["none", "rotation", "simclr"]), default=None,
              help="Before any query, train the student on the whole pool without the victim (rotation: RotNet; "
                   "simclr: contrastive) and start every student from it; saved in OUT/checkpoint, reused on "
                   "--resume; settings: --set pretraining.epochs=5 etc. Default: the preset's.")
@click.option("--cold-start", type=click.Choice(["random", "typiclust", "kcenter"]), default=None,
              help="How the first queries are chosen before any answer: random, TypiClust (typical points of "
                   "k-means clusters) or k-center, in the pretrained features (pixels without --pretrain). "
                   "Default: the preset's.")
@click.option("--preset", type=click.Choice(list(PRESET_NAMES)), default=DEFAULT_PRESET, show_default=True,
              help="auto: with probability answers (--mode probs) plain with equal-sized batches, tau 2, lr 0.05, "
                   "--set grad_clip=5 and at least --set min_steps=3000 training steps at every budget; with other "
                   "answers semi with label smoothing 0.1 below 10 queries per class, plain with equal-sized batches "
                   "from 10 per class (--set batching=ragged: a small last batch, as before); from 20 per class half "
                   "the queries chosen by margin (--select margin, --set active.initial=0.5) (config.json records "
                   "what it resolved to); paper: random queries, no SSL (DFME appendix A); "
                   "plain: the same with label smoothing 0.1 on label answers from 10 queries per class (probabilities train as paper); semi: random queries + FixMatch on the "
                   "unqueried pool (warm-up, mean teacher, distribution alignment); active: k-center selection + "
                   "FixMatch; typiclust: rotation pretraining on the pool + TypiClust for the first "
                   "10 queries per class, random after; pretrained students up to 10 queries per class "
                   "(docs/surrogate-active.md).")
@click.option("--resume", is_flag=True, help="Continue the stopped active rounds in --out from their checkpoint.")
@click.option("--augment", type=click.Choice(["none", "shift", "shift-flip"]), default="none", show_default=True,
              help="Train on shifted/flipped copies of queried images with their cached answers (no queries).")
@click.option("--student", default="conv2", show_default=True, help="Student architecture.")
@click.option("--student-arg", "student_args", multiple=True, metavar="KEY=VALUE")
@click.option("--epochs", type=int, default=30, show_default=True,
              help="Student epochs; with probability answers the default raises them to at least 3,000 steps "
                   "(--set min_steps=0 keeps them as given).")
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--eval-every", type=int, default=5, show_default=True, help="Score the student every N epochs.")
@set_option("knockoff.alpha=0.2")
@run_options
@device_option
def surrogate_cmd(victim: str, key: str | None, mode: str, temperature: float, top_k: int, budget: int,
                  dataset: str | None, data_dir: str | None, pool: str, max_distinct: int | None, loss: str,
                  tau: float | None, schedule: str, lr: float | None, strategy: str, select: str | None, ssl: str | None,
                  pretrain: str | None, cold_start: str | None, preset: str, resume: bool, augment: str, student: str,
                  student_args: tuple[str, ...], epochs: int, batch_size: int, eval_every: int,
                  settings: tuple[str, ...], seed: int, out: str, device: str) -> None:
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
    from stealkit.settings import apply_settings

    resolve_loss(loss, mode)  # type: ignore[arg-type]  # refuse e.g. KL on labels before any work
    kwargs = parse_kv(student_args)
    method = METHODS["surrogate"]
    cap = min(budget, max_distinct) if max_distinct is not None else budget
    given = parse_kv(settings)

    def configure(num_classes: int) -> tuple[str, Any]:
        """The preset resolved for the budget and answer kind (``auto`` depends on the answers per class and, with
        probabilities, sets tau, lr and grad_clip), then the options: an explicit ``--tau``/``--lr``/``--set`` wins."""
        resolved, chosen = resolve_preset(preset if strategy == "random" else "paper", cap, num_classes, mode=mode)
        if str(given.get("optimizer", "sgd")) != "sgd":
            chosen.pop("lr", None)  # the preset's learning rate is SGD's; another optimiser keeps its own default
        options = (("select", select), ("ssl", ssl), ("pretrain", pretrain), ("cold_start", cold_start),
                   ("tau", tau), ("lr", lr))
        chosen.update({k: v for k, v in options if v is not None})  # knockoff: its own policy, as paper
        config = method.config(max_distinct=max_distinct, loss=loss, epochs=epochs,  # type: ignore[misc]
                               batch_size=batch_size, schedule=schedule, strategy=strategy,
                               augment=augment, eval_every=eval_every, seed=seed)
        return resolved, apply_settings(config, {**chosen, **given}, who="surrogate")  # "active.initial" keys too

    def checkpointed(config: Any) -> bool:
        return config.select != "random" or config.pretrain != "none" or config.cold_start != "random"

    def refuse_resume() -> None:
        raise InputError("--resume continues active rounds or reuses pretrained weights; this run has --select "
                         "random, --pretrain none and --cold-start random (nothing to resume)")

    # refuse bad settings and resume mistakes before the victim is opened; one class gives the most answers per
    # class, so if even then nothing is checkpointed (the default selects by margin from 20 per class), nothing is
    _, widest = configure(1)
    if resume and not checkpointed(widest):
        refuse_resume()
    run = RunDir(out)
    checkpoint = run.path / "checkpoint"
    if not resume and (checkpoint / "active.json").exists():
        raise InputError(f"{out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out")
    v = open_victim(victim, mode=mode, budget=budget, temperature=temperature, top_k=top_k, key=key,
                    dataset=dataset, device=device, seed=seed)
    resolved, config = configure(v.num_classes)
    if resume and not checkpointed(config):
        refuse_resume()
    if "fixmatch.flip" not in given:  # mirror images only where the data set is flip-invariant
        config = apply_settings(config, {"fixmatch.flip": v.dataset in FLIP_INVARIANT}, who="surrogate")
    splits = victim_splits(v, data_dir)
    from stealkit.data import parse_source

    knockoff = strategy == "knockoff"
    # plain random queries the first ``cap`` of a shuffle; the adaptive policy, active selection, FixMatch
    # and the noisy student use the whole pool (a synthetic source draws four candidates per query it may make)
    whole = knockoff or checkpointed(config) or config.ssl != "none" or config.noisy_student.rounds > 0
    n_pool = (4 * cap if parse_source(pool).is_synthetic else None) if whole else cap
    x_pool, labels = load_surrogate_pool(pool, input_shape=v.input_shape, n=n_pool, seed=seed, data_dir=data_dir,
                                         victim_dataset=v.dataset, split_seed=v.split_seed, with_labels=knockoff)
    cfg = {"victim": victim, "mode": mode, "budget": budget, "pool": pool, "student": student, "preset": preset,
           "preset_resolved": resolved, "student_kwargs": kwargs, "dataset": v.dataset, "surrogate": config}
    run.create(command="extract surrogate", seed=seed, config=cfg)
    result = method.run(v.oracle, x_pool, make_student=student_factory(student, v, seed, **kwargs),
                        config=config, evaluator=make_evaluator(v, splits.test.x, splits.test.y, device),
                        pool_labels=labels, on_point=run.append_record, device=device,
                        checkpoint_dir=checkpoint if checkpointed(config) else None, resume=resume)
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=seed, config=cfg)
    click.echo(f"accuracy {result.accuracy:.4f}, fidelity {result.fidelity}, queries {result.queries}; "
               f"report: {run.report_path}")


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(surrogate_cmd)  # type: ignore[attr-defined]
