"""``stealkit extract gradient-matching``: reconstruct a victim from explanations (Milli et al. 2019, Sec. 4)."""

from __future__ import annotations

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_arch,
    check_budget,
    check_source,
    dataset_name,
    device_option,
    parse_int_list,
    parse_kv,
    run_options,
    set_option,
    test_data_option,
    victim_option,
)


@click.command("gradient-matching")
@victim_option()
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--budget", type=int, required=True, callback=check_budget, is_eager=True, help="Inputs the attack may query (each costs one membership "
              "query and, with gradients, one explanation query).")
@click.option("--checkpoints", default=None, help="Comma-separated query counts to score a reconstruction at "
              "(default: the budget only), e.g. 1,10,100,1000.")
@click.option("--membership-only", is_flag=True, help="Train on l_M alone (the baseline without explanations).")
@click.option("--explanation", type=click.Choice(["gradient", "smoothgrad"]), default="gradient", show_default=True)
@click.option("--smooth-sigma", type=float, default=0.3, show_default=True, help="SmoothGrad noise sigma.")
@click.option("--smooth-samples", type=int, default=10, show_default=True, help="SmoothGrad samples N.")
@click.option("--lam", type=float, default=1.0, show_default=True, help="lambda, weight of l_M in l_G + lambda l_M.")
@click.option("--pool", default="pool", show_default=True, callback=check_source,
              help="Query source: pool (the attacker split), gaussian (Sec. 5.3), a data set name, uniform, or your "
                   "own images (a .npy/.npz file or a folder of PNG/JPEG images).")
@click.option("--student", default="conv2", show_default=True, callback=check_arch, help="Reconstruction architecture (Sec. 5.2).")
@click.option("--student-arg", "student_args", multiple=True, metavar="KEY=VALUE")
@click.option("--steps", type=int, default=600, show_default=True, help="Training minibatches per checkpoint.")
@click.option("--dataset", default=None, callback=dataset_name, help="Data set of the victim's task (default: from model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@test_data_option
@set_option("batch_size=128")
@run_options
@device_option
def gradmatch_cmd(victim: str, key: str | None, budget: int, checkpoints: str | None, membership_only: bool,
                  explanation: str, smooth_sigma: float, smooth_samples: int, lam: float, pool: str, student: str,
                  student_args: tuple[str, ...], steps: int, dataset: str | None, data_dir: str | None,
                  test_data: str | None, settings: tuple[str, ...], seed: int, out: str, device: str) -> None:
    """Train a reconstruction on the victim's answers and input-gradient explanations (l_G + lambda l_M)."""
    from stealkit.extract.explanations.run import GradMatchOptions, run_gradient_matching
    from stealkit.oracle.victim import Target

    cps = parse_int_list(checkpoints) if checkpoints else None
    options = GradMatchOptions(membership_only=membership_only, explanation=explanation, smooth_sigma=smooth_sigma,
                               smooth_samples=smooth_samples, lam=lam, pool=pool, student=student,
                               student_kwargs=parse_kv(student_args), steps=steps, settings=parse_kv(settings))
    target = Target(victim, key=key, dataset=dataset, data_dir=data_dir, device=device, seed=seed,
                    test_data=test_data)
    r = run_gradient_matching(target, budget, checkpoints=cps, options=options, out=out)
    click.echo(f"accuracy {fmt.figure(r.accuracy)}, fidelity {fmt.figure(r.fidelity)}, "
               f"queries {fmt.queries(r.result.queries)}; "
               f"report: {r.path / 'report.html'}")


def register(cli: click.Group) -> None:
    cli.commands["extract"].add_command(gradmatch_cmd)  # type: ignore[attr-defined]
