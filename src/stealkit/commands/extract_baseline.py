"""``stealkit extract baseline``: label a pool through the oracle and train a student on the answers."""

from __future__ import annotations

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_arch,
    check_source,
    device_option,
    parse_int_list,
    parse_kv,
    run_options,
    set_option,
    victim_options,
)


@click.command("baseline")
@victim_options
@click.option("--pool", default="pool", show_default=True, callback=check_source,
              help="Query source: pool (the attacker split), a data set name, gaussian, uniform, patches; "
                   "options as NAME:classes=0-4:imbalance=0.1.")
@click.option("--checkpoints", default=None, help="Comma-separated query counts to score a student at "
              "(default: the budget only).")
@click.option("--student", default="conv2", show_default=True, callback=check_arch, help="Student architecture.")
@click.option("--student-arg", "student_args", multiple=True, metavar="KEY=VALUE")
@click.option("--epochs", type=int, default=30, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@set_option("train.lr=0.01")
@run_options
@device_option
def baseline_cmd(victim: str, key: str | None, mode: str, temperature: float, top_k: int, budget: int,
                 dataset: str | None, data_dir: str | None, test_data: str | None, pool: str, checkpoints: str | None, student: str,
                 student_args: tuple[str, ...], epochs: int, batch_size: int, settings: tuple[str, ...], seed: int,
                 out: str, device: str) -> None:
    """Plain extraction: query a pool through the victim's oracle and train a student on the answers."""
    from stealkit.data import load_query_source
    from stealkit.errors import InputError
    from stealkit.extract.common import save_extraction, student_factory
    from stealkit.extract.registry import METHODS
    from stealkit.oracle.victim import make_evaluator, open_victim, own_data_config, victim_test
    from stealkit.rundir import RunDir
    from stealkit.settings import apply_settings
    from stealkit.train import TrainConfig

    if budget < 1:
        raise InputError(f"--budget must be at least 1 query, got {budget}")
    cps = parse_int_list(checkpoints) if checkpoints else (budget,)
    kwargs = parse_kv(student_args)
    v = open_victim(victim, mode=mode, budget=budget, temperature=temperature, top_k=top_k, key=key,
                    dataset=dataset, device=device, seed=seed, feature_data=(test_data,))
    v.test_data = test_data
    test = victim_test(v, data_dir)
    x_pool = load_query_source(pool, input_shape=v.input_shape, n=max(cps), seed=seed, data_dir=data_dir,
                               victim_dataset=v.dataset, split_seed=v.split_seed, features=v.features)
    from stealkit.models.zoo import student_for

    student = student_for(student, v.input_shape)  # a feature-vector victim: mlp in place of an image network
    method = METHODS["baseline"]
    config = method.config(checkpoints=cps, seed=seed,  # type: ignore[misc]
                           train=TrainConfig(epochs=epochs, batch_size=batch_size, seed=seed))
    config = apply_settings(config, parse_kv(settings), who="baseline")
    cfg = {"victim": victim, "mode": mode, "budget": budget, "pool": pool, "student": student,
           "student_kwargs": kwargs, "dataset": v.dataset, "baseline": config,
           **own_data_config(v, {"--pool": pool}, data_dir)}
    run = RunDir(out).create(command="extract baseline", seed=seed, config=cfg)
    result = method.run(v.oracle, x_pool, make_student=student_factory(student, v, seed, **kwargs),
                        evaluator=make_evaluator(v, test.x, test.y, device),
                        config=config, on_point=run.append_record, device=device)
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=seed, config=cfg)
    click.echo(f"accuracy {fmt.figure(result.accuracy)}, fidelity {fmt.figure(result.fidelity)}, "
               f"queries {fmt.queries(result.queries)}; "
               f"report: {run.report_path}")


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(baseline_cmd)  # type: ignore[attr-defined]
