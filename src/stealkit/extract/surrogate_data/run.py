"""The runner of ``stealkit extract surrogate``: :func:`run_surrogate` opens the victim, resolves the options to
the configuration it runs (:func:`resolve_surrogate`), queries the pool (:func:`surrogate_pool`), trains the
student and writes the run directory. The command, the Python API and the audit call it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.errors import InputError
from stealkit.extract.common import ExtractionRun, save_extraction, student_factory
from stealkit.extract.surrogate_data.presets import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_PRESET,
)
from stealkit.oracle.victim import Target, Victim, make_evaluator, own_data_config, victim_test
from stealkit.rundir import RunDir

if TYPE_CHECKING:
    import torch

    from stealkit.extract.surrogate_data.surrogate import SurrogateConfig
    from stealkit.oracle import Oracle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SurrogateOptions:
    """Every option of ``stealkit extract surrogate`` but the target's, the budget, ``--out`` and ``--resume``;
    the defaults are the command's. ``settings``: ``--set KEY=VALUE`` on the SurrogateConfig, already parsed."""

    mode: str = "probs"
    temperature: float = 1.0
    pool: str = "pool"
    max_distinct: int | None = None
    loss: str = "auto"
    tau: float | None = None
    schedule: str = "cyclic"
    lr: float | None = None
    strategy: str = "random"
    select: str | None = None
    ssl: str | None = None
    preset: str = DEFAULT_PRESET
    student: str = "conv2"
    student_kwargs: Mapping[str, Any] = field(default_factory=dict)
    epochs: int = DEFAULT_EPOCHS
    batch_size: int = DEFAULT_BATCH_SIZE
    eval_every: int = 5
    settings: Mapping[str, Any] = field(default_factory=dict)


def resolve_surrogate(options: SurrogateOptions, answers: int, num_classes: int, *, flip: bool = False,
                      seed: int = 0) -> tuple[str, SurrogateConfig]:
    """The name of what the preset resolved to and the configuration the command runs for ``options`` at
    ``answers`` distinct images of ``num_classes`` classes. ``strategy="knockoff"`` runs the ``paper`` preset (its
    own policy chooses every query); an explicit ``select/ssl/tau/lr`` and then ``settings`` win over the preset;
    ``flip``: FixMatch mirrors images (a flip-invariant data set) unless ``settings`` names ``fixmatch.flip``
    (:func:`stealkit.extract.surrogate_data.surrogate.resolve_config`)."""
    from stealkit.extract.surrogate_data.surrogate import resolve_config

    o = options
    flags = {k: v for k, v in (("select", o.select), ("ssl", o.ssl), ("tau", o.tau), ("lr", o.lr)) if v is not None}
    preset = o.preset if o.strategy == "random" else "paper"
    fields = {"max_distinct": o.max_distinct, "loss": o.loss, "epochs": o.epochs, "batch_size": o.batch_size,
              "schedule": o.schedule, "strategy": o.strategy, "eval_every": o.eval_every, "seed": seed}
    return resolve_config(preset, answers, num_classes, mode=o.mode, flip=flip,
                          settings={**flags, **dict(o.settings)}, **fields)


def load_surrogate_pool(spec: str, *, input_shape: tuple[int, ...], n: int | None, seed: int,
                        data_dir: str | None, victim_dataset: str | None, split_seed: int,
                        with_labels: bool = False, features: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Images of query source ``spec`` (see :mod:`stealkit.data.query_sources`); with ``with_labels``, also
    the source data set's own labels of the same images (Knockoff Nets' actions), or ``None`` where the
    source has none (synthetic) or they cannot be matched (then the policy clusters the pool instead).
    ``features``: a feature-vector victim's ranges (the owner's files are mapped by them)."""
    import torch

    from stealkit.data import adapt_images, keep_classes, load_query_source, load_splits, parse_source

    parsed = parse_source(spec)
    if parsed.is_synthetic and n is None:
        raise InputError(f"query source {spec!r} is synthetic: give a number of images")
    x = load_query_source(spec, input_shape=input_shape, n=n, seed=seed, data_dir=data_dir,
                          victim_dataset=victim_dataset, split_seed=split_seed, features=features)
    if not with_labels or parsed.is_synthetic or parsed.is_file or parsed.imbalance is not None:
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


def surrogate_pool(pool: str, v: Victim, config: SurrogateConfig, *, cap: int, seed: int,
                   data_dir: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The images (and, for Knockoff Nets' policy, their source labels) the method queries from: plain random
    queries take the first ``cap`` of a shuffle; the adaptive policy, active selection and FixMatch use the whole
    pool (a synthetic source draws four candidates per query it may make)."""
    from stealkit.data import parse_source

    knockoff = config.strategy == "knockoff"
    whole = knockoff or config.select != "random" or config.ssl != "none"
    n_pool = (4 * cap if parse_source(pool).is_synthetic else None) if whole else cap
    return load_surrogate_pool(pool, input_shape=v.input_shape, n=n_pool, seed=seed, data_dir=data_dir,
                               victim_dataset=v.dataset, split_seed=v.split_seed, with_labels=knockoff,
                               features=v.features)


def _refuse_resume() -> None:
    raise InputError("--resume continues active rounds; this run has --select random (nothing to resume)")


def run_surrogate(target: Target, budget: int, options: SurrogateOptions = SurrogateOptions(), *, out: str | Path,
                  resume: bool = False, defences: tuple[Any, ...] = (),
                  wrap_oracle: Callable[[Oracle], Any] | None = None, report: bool = True,
                  config_extra: Mapping[str, Any] | None = None) -> ExtractionRun:
    """Surrogate-data extraction of ``target`` with ``budget`` queries, written to ``out`` (config.json,
    records.jsonl, the student, summary.json and, with ``report``, report.html): exactly what the command runs.

    ``defences``: output defences the local victim wears; ``wrap_oracle``: called on the opened oracle, the method
    queries what it returns; ``config_extra``: merged into config.json's config. ``resume`` continues the active
    rounds checkpointed in ``out/checkpoint``."""
    from stealkit.extract.registry import METHODS
    from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT, resolve_loss
    from stealkit.models.zoo import student_for

    o = options
    resolve_loss(o.loss, o.mode)  # type: ignore[arg-type]  # refuse e.g. KL on labels before any work
    kwargs = dict(o.student_kwargs)
    method = METHODS["surrogate"]
    cap = min(budget, o.max_distinct) if o.max_distinct is not None else budget
    # refuse bad settings and resume mistakes before the victim is opened; one class gives the most answers per
    # class, so if even then nothing is checkpointed (the default selects by margin from 20 per class), nothing is
    _, widest = resolve_surrogate(o, cap, 1, seed=target.seed)
    if resume and widest.select == "random":
        _refuse_resume()
    run = RunDir(out)
    checkpoint = run.path / "checkpoint"
    if not resume and (checkpoint / "active.json").exists():
        raise InputError(f"{out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out")
    v = target.open(mode=o.mode, budget=budget, temperature=o.temperature, defences=defences)
    student = student_for(o.student, v.input_shape)  # a feature-vector victim: mlp in place of an image network
    if student != o.student:
        from stealkit.models.zoo import arch_defaults

        dropped = sorted(set(kwargs) - set(arch_defaults(student)))
        kwargs = {k: val for k, val in kwargs.items() if k not in dropped}
        log.info("the victim takes a vector of %d features: the student is %s, not the image network %s%s",
                 v.input_shape[0], student, o.student, f" (its options {dropped} left out)" if dropped else "")
    resolved, config = resolve_surrogate(o, cap, v.num_classes, flip=v.dataset in FLIP_INVARIANT, seed=target.seed)
    checkpointed = config.select != "random"
    if resume and not checkpointed:
        _refuse_resume()
    test = victim_test(v, target.data_dir)
    x_pool, labels = surrogate_pool(o.pool, v, config, cap=cap, seed=target.seed, data_dir=target.data_dir)
    cfg = {"victim": target.location, "mode": o.mode, "budget": budget, "pool": o.pool, "student": student,
           "preset": o.preset, "preset_resolved": resolved, "student_kwargs": kwargs, "dataset": v.dataset,
           "surrogate": config} | own_data_config(v, {"--pool": o.pool}, target.data_dir) | dict(config_extra or {})
    run.create(command="extract surrogate", seed=target.seed, config=cfg)
    oracle = wrap_oracle(v.oracle) if wrap_oracle is not None else v.oracle
    result = method.run(oracle, x_pool, make_student=student_factory(student, v, target.seed, **kwargs),
                        config=config, evaluator=make_evaluator(v, test.x, test.y, target.device),
                        pool_labels=labels, on_point=run.append_record, device=target.device,
                        checkpoint_dir=checkpoint if checkpointed else None, resume=resume)
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=target.seed, config=cfg,
                    report=report)
    return ExtractionRun(path=run.path, result=result, victim=v, config=cfg, preset_resolved=resolved)
