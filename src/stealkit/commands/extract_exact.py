"""``stealkit extract exact``: exact recovery of a two-layer ReLU victim (Milli et al. 2019, Sec. 3, App. C)
or one-query identification of a logistic victim (footnote 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_budget,
    dataset_name,
    device_option,
    parse_kv,
    run_options,
    set_option,
    victim_option,
)

VARIANTS = ("gradient", "mq", "logistic")


@click.command("exact")
@victim_option(help_text="Victim: a zoo mlp2 or logistic model directory, an http(s):// API, or standard:NAME.")
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--variant", type=click.Choice(VARIANTS), default="gradient", show_default=True,
              help="gradient: Algorithm 1 from gradient + membership queries; mq: Algorithm 1-MQ (membership "
                   "queries only); logistic: footnote 2's identification of a logistic model.")
@click.option("--hidden", type=int, default=None,
              help="The victim's hidden width h (default: read from a local victim's model.json).")
@click.option("--budget", type=int, default=None, callback=check_budget, is_eager=True, help="Victim queries the attack may spend (default: no limit).")
@click.option("--search", type=click.Choice(["secant", "bisect"]), default="secant", show_default=True,
              help="bisect: the paper's binary search; secant: jump to the kink from two values (fewer queries).")
@click.option("--lines", type=int, default=40, show_default=True,
              help="Search lines tried at most (retries on fresh random lines).")
@click.option("--anchors", type=int, default=500, show_default=True,
              help="Attacker-pool images seeding the search lines (free: they are not queried).")
@click.option("--epsilon", type=float, default=None, help="Search resolution in t (default: by precision).")
@click.option("--dataset", default=None, callback=dataset_name, help="Data set of the victim's task (default: from model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@set_option("check_points=32")
@run_options
@device_option
def exact_cmd(victim: str, key: str | None, variant: str, hidden: int | None, budget: int | None, search: str,
              lines: int, anchors: int, epsilon: float | None, dataset: str | None, data_dir: str | None,
              settings: tuple[str, ...], seed: int, out: str, device: str) -> None:
    """Recover a functionally equivalent copy of a two-layer ReLU (or logistic) victim from explanations."""
    from stealkit.extract.common import open_victim

    v = open_victim(victim, mode="probs" if variant == "logistic" else "logits", budget=budget, key=key,
                    explain=variant != "mq", dataset=dataset, device=device, seed=seed)
    result = run_exact(v, victim=victim, variant=variant, hidden=hidden, budget=budget, search=search, lines=lines,
                       anchors=anchors, epsilon=epsilon, data_dir=data_dir, settings=settings, seed=seed, out=out,
                       device=device)
    click.echo(f"accuracy {fmt.figure(result.accuracy)}, fidelity {fmt.figure(result.fidelity)}, "
               f"queries {fmt.queries(result.queries)}; "
               f"report: {Path(out) / 'report.html'}")


def run_exact(v: Any, *, victim: str, variant: str, hidden: int | None, budget: int | None, search: str = "secant",
              lines: int = 40, anchors: int = 500, epsilon: float | None = None, data_dir: str | None = None,
              settings: tuple[str, ...] = (), seed: int = 0, out: str, device: str = "cpu") -> Any:
    """The command's body after the victim ``v`` is opened (its oracle answering logits, or probabilities for
    the logistic variant, with explanations): the recovery, its scores and the run directory ``out``. Returns
    the :class:`~stealkit.extract.common.ExtractionResult`; a recovery that fails (or exhausts ``v``'s budget)
    raises, and ``v.oracle.ledger`` still holds what it spent (``stealkit audit`` reads it)."""
    import torch

    from stealkit.errors import InputError
    from stealkit.extract.common import ExtractionResult, make_evaluator, save_extraction, victim_splits
    from stealkit.extract.explanations.exact import relative_error
    from stealkit.extract.registry import METHODS
    from stealkit.rundir import RunDir
    from stealkit.settings import apply_settings

    splits = victim_splits(v, data_dir)
    if variant != "logistic" and hidden is None:
        hidden = _spec_hidden(v.spec)
        if hidden is None:
            raise InputError("pass --hidden, the victim's hidden width (the algorithm's input h)")
    cfg: dict[str, Any] = {"victim": victim, "variant": variant, "budget": budget, "dataset": v.dataset}
    run = RunDir(out).create(command="extract exact", seed=seed, config=cfg)
    extra: dict[str, Any] = {"variant": variant}
    method = METHODS[f"exact-{variant}"]
    if variant == "logistic":
        if settings:
            raise InputError("--set: the logistic identification has no settings")
        ident = method.run(v.oracle)
        student, arch, kwargs = ident.model, "logistic", {}
    else:
        assert hidden is not None
        config = method.config(search=search, lines=lines, epsilon=epsilon, seed=seed)  # type: ignore[misc]
        config = apply_settings(config, parse_kv(settings), who="exact")
        cfg.update(hidden=hidden, exact=config)
        pool = splits.attacker_pool.x[:anchors]
        rec = method.run(v.oracle, hidden, config, anchors=pool)
        student, arch, kwargs = rec.model.to_mlp2(), "mlp2", {"hidden": rec.model.hidden}
        extra |= {"hidden_found": rec.hidden_found, "lines": rec.lines, "fit_residual": rec.fit_residual}
        if v.model is not None:
            x_rand = torch.rand(10_000, *v.input_shape, generator=torch.Generator().manual_seed(seed))
            extra |= {"max_relative_error_test": relative_error(v.model.double(), rec.model, splits.test.x),
                      "max_relative_error_uniform": relative_error(v.model.double(), rec.model, x_rand)}
            v.model.float()
    evaluator = make_evaluator(v, splits.test.x, splits.test.y, device)
    scores = evaluator(student)
    result = ExtractionResult(method=f"exact-{variant}", student=student, queries=v.oracle.ledger.as_dict(),
                              accuracy=scores["accuracy"], fidelity=scores.get("fidelity"),
                              victim_accuracy=evaluator.victim_accuracy, extra=extra)
    save_extraction(run, result, v, student_arch=arch, student_kwargs=kwargs, seed=seed, config=cfg)
    return result


def _spec_hidden(spec: Any) -> int | None:
    """A local zoo mlp2's hidden width (its spec's kwargs, else the architecture default)."""
    if spec is None or getattr(spec, "arch", None) != "mlp2":
        return None
    from stealkit.models import arch_defaults

    return int({**arch_defaults("mlp2"), **(spec.kwargs or {})}["hidden"])


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(exact_cmd)  # type: ignore[attr-defined]
