"""The runner of ``stealkit extract dfme|maze|dast|codfe``: :func:`run_datafree` opens the victim, builds the
method's config from its recipe and options, runs the resumable loop and writes the run directory."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.extract.common import ExtractionRun, save_extraction, student_factory
from stealkit.extract.datafree.recipes import DEFAULT
from stealkit.extract.registry import METHODS
from stealkit.oracle.victim import Target, make_evaluator, own_data_config, victim_test
from stealkit.rundir import RunDir
from stealkit.settings import typed_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataFreeOptions:
    """Every option of a data-free command but the target's, the budget, the mode, ``--out`` and ``--resume``;
    the defaults are the commands'. ``settings``: ``--set KEY=VALUE`` on the method's config, already parsed."""

    temperature: float = 1.0
    student: str = "conv2"
    student_kwargs: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    ngf: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    eval_every: int = 50_000
    eval_at: tuple[int, ...] = ()
    checkpoint_every: int = 100
    max_iterations: int | None = None
    preset: str = DEFAULT


def build_config(method: str, settings: dict[str, Any], loop: dict[str, Any]) -> Any:
    """The method's frozen config from ``--set`` style settings; unknown names are a clear error."""
    from stealkit.extract.datafree.loop import LoopConfig

    cls = METHODS[method].config
    assert cls is not None
    return cls(loop=LoopConfig(**loop), **typed_settings(cls, settings, who=method, exclude={"loop"}))


def run_datafree(method: str, target: Target, budget: int, *, mode: str = "label",
                 options: DataFreeOptions = DataFreeOptions(), out: str | Path, resume: bool = False) -> ExtractionRun:
    """Data-free extraction of ``target`` by ``method`` (dfme, maze, dast, codfe) with ``budget`` queries answered
    in ``mode``, written to ``out`` (student, summary.json, report.html, samples.safetensors): exactly what the
    command runs. ``resume`` continues the stopped run checkpointed in ``out/checkpoint``."""
    from stealkit.extract.datafree.recipes import recipe_settings, recipe_sizes

    o = options
    seed, device = target.seed, target.device
    recipe = recipe_settings(o.preset, method, mode)
    v = target.open(mode=mode, budget=budget, temperature=o.temperature)
    if v.features is not None:  # a local victim of d features (a remote one is refused when opened)
        raise InputError(f"data-free extraction's generators make images, and {target.location} takes a vector of "
                         f"{v.features.d} features; extract it with your own data: stealkit extract surrogate "
                         "--pool FILE.npz (or uniform)")
    sizes = recipe_sizes(o.preset, method, tuple(v.input_shape), o.student)  # explicit options override below
    settings = recipe | {k: val for k, val in sizes.items() if k != "student_kwargs"} | dict(o.settings)
    if o.batch_size is not None:
        settings["batch_size"] = o.batch_size
    if o.ngf is not None:
        settings["ngf"] = o.ngf
    settings["seed"] = seed
    loop = {"eval_every": o.eval_every, "eval_at": tuple(o.eval_at), "checkpoint_every": o.checkpoint_every,
            "max_iterations": o.max_iterations}
    config = build_config(method, settings, loop)
    kwargs = sizes.get("student_kwargs", {}) | dict(o.student_kwargs)
    evaluator = None
    try:
        test = victim_test(v, target.data_dir)
        evaluator = make_evaluator(v, test.x, test.y, device)
    except InputError:
        if v.dataset:
            raise
        log.warning("the victim's data set is unknown: no accuracy curve (pass --dataset or --test-data to get one)")
    cfg = {"victim": target.location, "mode": mode, "budget": budget, "student": o.student, "student_kwargs": kwargs,
           "dataset": v.dataset, "recipe": o.preset, "recipe_sizes": sizes, method: config,
           **own_data_config(v, data_dir=target.data_dir)}
    run = RunDir(out)
    if not resume and (run.path / "checkpoint" / "checkpoint.json").exists():
        raise InputError(f"{out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out")
    run.create(command=f"extract {method}", seed=seed, config=cfg)
    result = METHODS[method].run(v.oracle, make_student=student_factory(o.student, v, seed, **kwargs),
                                 evaluator=evaluator, config=config, device=device,
                                 checkpoint_dir=run.path / "checkpoint", resume=resume, on_point=run.append_record,
                                 on_losses=lambda r: run.append_record({"kind": "losses", **r}))
    if result.samples is not None:
        from safetensors.torch import save_file

        from stealkit.fsutil import atomic_path

        with atomic_path(run.path / "samples.safetensors") as tmp:
            save_file({"samples": result.samples.contiguous()}, str(tmp))
    save_extraction(run, result, v, student_arch=o.student, student_kwargs=kwargs, seed=seed, config=cfg)
    return ExtractionRun(path=run.path, result=result, victim=v, config=cfg)
