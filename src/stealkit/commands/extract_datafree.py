"""``stealkit extract dfme|maze|dast|codfe``: data-free extraction, no data at all (a generator makes the queries).

Every command takes the core's victim and run options, writes the student, ``summary.json`` (the extraction
contract plus ``losses`` and the run's timing) and ``report.html`` (accuracy and fidelity against queries,
losses against rounds, a grid of generator samples). ``--resume`` continues a stopped run from its checkpoint
in ``OUT/checkpoint`` without spending any query twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_arch,
    device_option,
    parse_kv,
    run_options,
    set_option,
    victim_options,
)
from stealkit.errors import InputError
from stealkit.extract.datafree.recipes import DEFAULT, PAPER, VALIDATED
from stealkit.extract.registry import DATAFREE, METHODS
from stealkit.rundir import RunDir
from stealkit.settings import typed_settings


def build_config(method: str, settings: dict[str, Any], loop: dict[str, Any]) -> Any:
    """The method's frozen config from ``--set`` style settings; unknown names are a clear error."""
    from stealkit.extract.datafree.datafree_loop import LoopConfig

    cls = METHODS[method].config
    assert cls is not None
    return cls(loop=LoopConfig(**loop), **typed_settings(cls, settings, who=method, exclude={"loop"}))


def datafree_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options every data-free command shares (module-local: common.py stays untouched)."""
    opts = [
        click.option("--student", default="conv2", show_default=True, callback=check_arch, help="Student (substitute) architecture."),
        click.option("--student-arg", "student_args", multiple=True, metavar="KEY=VALUE",
                     help="Student architecture option, e.g. c1=16."),
        click.option("--batch-size", type=int, default=None, help="Generator batch (default: the method's)."),
        click.option("--ngf", type=int, default=None, help="Generator width (reference: 64)."),
        set_option("directions=1 or lr_student=0.05"),
        click.option("--eval-every", type=int, default=50_000, show_default=True,
                     help="Score the student on the test split every N victim queries."),
        click.option("--eval-at", default="", help="Extra query counts to score at, comma-separated."),
        click.option("--checkpoint-every", type=int, default=100, show_default=True,
                     help="Iterations between checkpoints (0: only at the end)."),
        click.option("--max-iterations", type=int, default=None, help="Stop after N iterations (rounds)."),
        click.option("--resume", is_flag=True, help="Continue the stopped run in --out from its checkpoint."),
        click.option("--preset", type=click.Choice([VALIDATED, PAPER]), default=DEFAULT, show_default=True,
                     help=f"Settings recipe: the default ({VALIDATED}) was chosen on a validation split "
                          "(docs/guide/datafree.md), with the generator and conv2 student sizes it was validated at "
                          f"on small (8x8) inputs; {PAPER} is the paper's exact settings. --set, --ngf, "
                          "--batch-size and --student-arg override it."),
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def run_method(method: str, *, victim: str, key: str | None, mode: str, temperature: float, top_k: int,
               budget: int, dataset: str | None, data_dir: str | None, student: str,
               student_args: tuple[str, ...], batch_size: int | None, ngf: int | None, settings: dict[str, Any],
               eval_every: int, eval_at: str, checkpoint_every: int, max_iterations: int | None, resume: bool,
               seed: int, out: str, device: str, preset: str = DEFAULT) -> Any:
    """What each command does: open the victim, run the method, save student, summary and report."""
    from stealkit.commands.common import parse_int_list
    from stealkit.extract.common import (
        make_evaluator,
        open_victim,
        save_extraction,
        student_factory,
        victim_splits,
    )
    from stealkit.extract.datafree.recipes import recipe_settings, recipe_sizes

    recipe = recipe_settings(preset, method, mode)
    v = open_victim(victim, mode=mode, budget=budget, temperature=temperature, top_k=top_k, key=key,
                    dataset=dataset, device=device, seed=seed)
    sizes = recipe_sizes(preset, method, tuple(v.input_shape), student)  # explicit options override below
    settings = recipe | {k: val for k, val in sizes.items() if k != "student_kwargs"} | dict(settings)
    if batch_size is not None:
        settings["batch_size"] = batch_size
    if ngf is not None:
        settings["ngf"] = ngf
    settings["seed"] = seed
    loop = {"eval_every": eval_every, "eval_at": parse_int_list(eval_at) if eval_at else (),
            "checkpoint_every": checkpoint_every, "max_iterations": max_iterations}
    config = build_config(method, settings, loop)
    kwargs = sizes.get("student_kwargs", {}) | parse_kv(student_args)
    evaluator = None
    try:
        splits = victim_splits(v, data_dir)
        evaluator = make_evaluator(v, splits.test.x, splits.test.y, device)
    except InputError:
        if v.dataset:
            raise
        click.echo("the victim's data set is unknown: no accuracy curve (pass --dataset to get one)", err=True)
    cfg = {"victim": victim, "mode": mode, "budget": budget, "student": student, "student_kwargs": kwargs,
           "dataset": v.dataset, "recipe": preset, "recipe_sizes": sizes, method: config}
    run = RunDir(out)
    if not resume and (run.path / "checkpoint" / "checkpoint.json").exists():
        raise InputError(f"{out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out")
    run.create(command=f"extract {method}", seed=seed, config=cfg)
    result = METHODS[method].run(v.oracle, make_student=student_factory(student, v, seed, **kwargs),
                                 evaluator=evaluator, config=config, device=device,
                                 checkpoint_dir=run.path / "checkpoint", resume=resume, on_point=run.append_record,
                                 on_losses=lambda r: run.append_record({"kind": "losses", **r}))
    if result.samples is not None:
        from safetensors.torch import save_file

        from stealkit.fsutil import atomic_path

        with atomic_path(run.path / "samples.safetensors") as tmp:
            save_file({"samples": result.samples.contiguous()}, str(tmp))
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=seed, config=cfg)
    click.echo(f"{method} ({result.extra.get('variant', mode)}): accuracy {fmt.figure(result.accuracy)}, "
               f"fidelity {fmt.figure(result.fidelity)}, queries {fmt.queries(result.queries)}, "
               f"{result.extra['seconds']:.0f} s; report: {run.report_path}")
    return result


def _command(method: str, help_text: str) -> click.Command:
    @click.command(method, help=help_text)
    @victim_options
    @datafree_options
    @run_options
    @device_option
    def cmd(settings: tuple[str, ...], **kw: Any) -> None:
        run_method(method, settings=parse_kv(settings), **kw)

    return cmd


HELP = {
    "dfme": "DFME (Truong et al. 2021): generator + zeroth-order gradients + l1 on recovered logits. "
            "Label mode uses a documented smoothed-label adaptation.",
    "maze": "MAZE (Kariyappa et al. 2021): KL, zeroth-order gradients with 10 directions, experience replay. "
            "Label mode uses a documented smoothed-label adaptation.",
    "dast": "DaST (Zhou et al. 2020): label-controllable generator; DaST-L with --mode label, DaST-P otherwise.",
    "codfe": "CoDFe (confident data-free stealing): fixed noise set, cross-entropy substitute, confidence-"
             "maximising generator; CoDFe-L with --mode label, CoDFe-P otherwise.",
}


def register(cli: click.Group) -> None:
    group = cli.commands["extract"]
    for m in DATAFREE:
        group.add_command(_command(m, HELP[m]))  # type: ignore[attr-defined]
