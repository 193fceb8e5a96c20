"""``stealkit extract dfme|maze|dast|codfe``: data-free extraction, no data at all (a generator makes the queries).

Every command takes the core's victim and run options, writes the student, ``summary.json`` (the extraction
contract plus ``losses`` and the run's timing) and ``report.html`` (accuracy and fidelity against queries,
losses against rounds, a grid of generator samples). ``--resume`` continues a stopped run from its checkpoint
in ``OUT/checkpoint`` without spending any query twice. Each command is options in, one
:func:`~stealkit.extract.datafree.run.run_datafree` call, the closing line out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_arch,
    device_option,
    parse_int_list,
    parse_kv,
    run_options,
    set_option,
    victim_options,
)
from stealkit.extract.datafree.recipes import DEFAULT, PAPER, VALIDATED
from stealkit.extract.registry import DATAFREE

if TYPE_CHECKING:
    from stealkit.extract.datafree.run import DataFreeOptions


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


def datafree_options_of(*, temperature: float, student: str, student_args: tuple[str, ...], batch_size: int | None,
                        ngf: int | None, settings: dict[str, Any], eval_every: int, eval_at: str,
                        checkpoint_every: int, max_iterations: int | None, preset: str) -> DataFreeOptions:
    """The :class:`~stealkit.extract.datafree.run.DataFreeOptions` of the command's parsed options."""
    from stealkit.extract.datafree.run import DataFreeOptions

    return DataFreeOptions(temperature=temperature, student=student, student_kwargs=parse_kv(student_args),
                           batch_size=batch_size, ngf=ngf, settings=dict(settings), eval_every=eval_every,
                           eval_at=parse_int_list(eval_at) if eval_at else (), checkpoint_every=checkpoint_every,
                           max_iterations=max_iterations, preset=preset)


def _command(method: str, help_text: str) -> click.Command:
    @click.command(method, help=help_text)
    @victim_options
    @datafree_options
    @run_options
    @device_option
    def cmd(victim: str, key: str | None, mode: str, top_k: int, budget: int, dataset: str | None,
            data_dir: str | None, test_data: str | None, resume: bool, seed: int, out: str, device: str, settings: tuple[str, ...],
            **kw: Any) -> None:
        from stealkit.extract.datafree.run import run_datafree
        from stealkit.oracle.victim import Target

        target = Target(victim, key=key, top_k=top_k, dataset=dataset, data_dir=data_dir, device=device, seed=seed,
                        test_data=test_data)
        r = run_datafree(method, target, budget, mode=mode, options=datafree_options_of(settings=parse_kv(settings),
                                                                                        **kw),
                         out=out, resume=resume)
        result = r.result
        click.echo(f"{method} ({result.extra.get('variant', mode)}): accuracy {fmt.figure(result.accuracy)}, "
                   f"fidelity {fmt.figure(result.fidelity)}, queries {fmt.queries(result.queries)}, "
                   f"{result.extra['seconds']:.0f} s; report: {r.path / 'report.html'}")

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
