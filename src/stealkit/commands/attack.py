"""``stealkit attack``: transfer attacks from a stolen substitute, decision-based attacks, the CoDFe study."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stealkit import fmt
from stealkit.commands.common import (
    check_budget,
    dataset_name,
    device_option,
    parse_kv,
    set_option,
    victim_option,
)
from stealkit.evade.registry import ATTACKS, DECISION, TRANSFER

TARGETS = ("second", "random", "least-likely")


@click.group("attack")
def attack() -> None:
    """Evasion attacks. Transfer: craft on a stolen substitute, count successes on the victim's oracle
    (fgsm, bim, pgd, mifgsm, cw). Decision-based, on the victim's labels only: boundary, hopskipjump, triangle."""


def _victim_opts(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        victim_option(),
        click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim."),
        click.option("--budget", type=int, default=None, callback=check_budget, is_eager=True,
                     help="Victim queries the attack may spend (default: no cap)."),
        click.option("--dataset", default=None, callback=dataset_name, help="Data set of the victim's task (default: from its model.json)."),
        click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files."),
        click.option("--n", "n", type=int, default=1000, show_default=True,
                     help="Test images to attack (a seeded sample of the test split)."),
        click.option("--targeted", type=click.Choice(TARGETS), default=None,
                     help="Targeted attack: class 1 (CoDFe's 'second class'), a random class, or the class the "
                          "substitute finds least likely. Default: untargeted."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", required=True, type=click.Path(), help="Run directory to write."),
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def _test_sample(v: Any, data_dir: str | None, n: int, seed: int) -> tuple[Any, Any]:
    import torch

    from stealkit.errors import InputError
    from stealkit.extract.common import victim_splits

    if n < 1:
        raise InputError(f"--n must be a positive number of images, got {n}")
    test = victim_splits(v, data_dir).test
    idx = torch.randperm(len(test.y), generator=torch.Generator().manual_seed(seed))[:n]
    return test.x[idx], test.y[idx]


def _save_npz(path: Path, arrays: dict[str, Any]) -> None:
    import numpy as np

    from stealkit.fsutil import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def _finish(run: Any, summary: dict[str, Any]) -> None:
    """Per-example records (from ``adversarial.npz``), the summary, the report."""
    from stealkit.report.builders import build_report

    npz = run.path / "adversarial.npz"
    if npz.exists():
        import numpy as np

        with np.load(npz) as data:
            delta = (data["x_adv"] - data["x"]).reshape(len(data["x"]), -1)
            l2, linf = np.linalg.norm(delta, axis=1), np.abs(delta).max(axis=1)
            for i in range(len(delta)):
                run.append_record({"index": i, "label": int(data["y"][i]),
                                   **{k: bool(data[k][i]) for k in ("attempted", "success") if k in data},
                                   "l2": float(l2[i]), "linf": float(linf[i])})
    run.write_summary(summary)
    run.write_report(build_report(run))


def _make_transfer(method: str) -> click.Command:
    @click.command(method, help=f"Transfer {method.upper()}: craft on --substitute, measure success on --victim.")
    @click.option("--substitute", required=True,
                  help="Substitute to craft on: a `stealkit extract` run directory (its student/ is used), a "
                       "model directory, or a TorchScript (.pt) file.")
    @_victim_opts
    @click.option("--eps", type=float, default=0.1, show_default=True, help="Perturbation budget (ignored by cw).")
    @click.option("--norm", type=click.Choice(["linf", "l2"]), default="linf", show_default=True)
    @click.option("--steps", type=int, default=10, show_default=True,
                  help="Iterations (cw: iterations per binary-search round).")
    @click.option("--step", type=float, default=None,
                  help="Step size (default: eps/steps for mifgsm, 2.5 eps/steps for bim and pgd).")
    @click.option("--restarts", type=int, default=1, show_default=True, help="PGD random restarts.")
    @click.option("--kappa", type=float, default=0.0, show_default=True, help="C&W confidence.")
    @click.option("--batch-size", type=int, default=256, show_default=True)
    @set_option("query_batch=128")
    @device_option
    def cmd(substitute: str, victim: str, key: str | None, budget: int | None, dataset: str | None,
            data_dir: str | None, n: int, targeted: str | None, seed: int, out: str, eps: float, norm: str,
            steps: int, step: float | None, restarts: int, kappa: float, batch_size: int,
            settings: tuple[str, ...], device: str) -> None:
        from stealkit.extract.common import open_victim
        from stealkit.models.locate import load_substitute
        from stealkit.rundir import RunDir
        from stealkit.settings import apply_settings

        sub = load_substitute(substitute, device=device)
        v = open_victim(victim, mode="label", budget=budget, key=key, dataset=dataset, device=device, seed=seed)
        x, y = _test_sample(v, data_dir, n, seed)
        spec = ATTACKS[method]
        cfg = spec.config(method=method, eps=eps, steps=steps, step=step, norm=norm, targeted=targeted,
                          restarts=restarts, kappa=kappa, seed=seed, batch_size=batch_size)
        cfg = apply_settings(cfg, parse_kv(settings), who=method)
        run = RunDir(out).create(command=f"attack {method}", seed=seed, config={
            "substitute": substitute, "victim": victim, "dataset": v.dataset, "n": n, "attack": cfg})
        res = spec.run(sub, v.oracle, x.to(device), y.to(device), cfg)
        _save_npz(run.path / "adversarial.npz", res.arrays())
        _finish(run, res.summary() | {"substitute": substitute, "victim": victim, "seed": seed})
        click.echo(f"ASR {fmt.figure(res.asr)} ({res.successes}/{res.attempts}), victim queries "
                   f"{fmt.queries(res.victim_queries)}; "
                   f"report: {run.report_path}")

    return cmd


DECISION_NAMES = {"boundary": "Boundary attack", "hopskipjump": "HopSkipJump", "triangle": "Triangle Attack"}


def _make_decision(method: str) -> click.Command:
    @click.command(method, help=f"{DECISION_NAMES.get(method, method)} on the victim's labels only (minimum L2); "
                                "every query is charged to the victim's ledger.")
    @_victim_opts
    @click.option("--max-queries", type=int, default=5000, show_default=True, help="Queries per image at most.")
    @click.option("--iterations", type=int, default=None,
                  help="Steps (boundary, default 5000), rounds (hopskipjump, default 40) or triangle searches "
                       "(triangle, default 100000: until --max-queries is spent).")
    @click.option("--substitute", default=None, type=click.Path(exists=True, file_okay=False),
                  help="A stolen model (its directory, or an extraction run directory holding student/): its "
                       "transfer example is the start and its gradient the prior. Default: no substitute.")
    @set_option("init_trials=200")
    @device_option
    def cmd(victim: str, key: str | None, budget: int | None, dataset: str | None, data_dir: str | None, n: int,
            targeted: str | None, seed: int, out: str, max_queries: int, iterations: int | None,
            substitute: str | None, settings: tuple[str, ...], device: str, preset: str = "paper",
            start_pool: str | None = None) -> None:
        from stealkit.errors import InputError
        from stealkit.extract.common import open_victim
        from stealkit.rundir import RunDir
        from stealkit.settings import apply_settings

        if targeted is not None:
            raise InputError("decision-based targeted attacks need start images of the target class; use the "
                             "Python API (starting_points=) or drop --targeted")
        if max_queries < 1:
            raise InputError(f"--max-queries must be a positive number of queries per image, got {max_queries}")
        if start_pool is not None and substitute is not None:
            raise InputError("--start-pool and --substitute both make the starting points: give one")
        v = open_victim(victim, mode="label", budget=budget, key=key, dataset=dataset, device=device, seed=seed)
        sub = _load_substitute(substitute, v, device) if substitute is not None else None
        x, y = _test_sample(v, data_dir, n, seed)
        pool = _load_start_pool(start_pool, v, data_dir) if start_pool is not None else None
        spec = ATTACKS[method]
        rounds: dict[str, object] = {"boundary": {"steps": iterations or 5000},
                                     "triangle": {"steps": iterations or 100_000}}.get(
                                         method, {"iterations": iterations or 40})
        if method == "hopskipjump" and preset == "tuned":
            from stealkit.evade.decision_based.hopskipjump import tuned_settings

            tuned = tuned_settings(substitute=sub is not None, shape=tuple(v.oracle.input_shape),
                                   budgeted=True, pool=pool is not None)  # --max-queries: a per-image budget
            rounds = rounds | tuned
        elif method == "triangle" and preset == "tuned":
            from stealkit.evade.decision_based.triangle import TUNED

            rounds = rounds | TUNED
        config = apply_settings(spec.config(seed=seed, **rounds), parse_kv(settings), who=method)  # type: ignore[misc]
        clean = v.oracle.query(x)  # which images the victim gets right (charged)
        from stealkit.oracle import labels_from_answer

        ok = (labels_from_answer(clean, v.oracle.mode).cpu() == y).nonzero().squeeze(1)
        if ok.numel() == 0:
            raise InputError(f"the victim classifies none of the {len(y)} sampled test images correctly, so there "
                             "is nothing to attack; raise --n or check the victim and --dataset")
        run_config = {"victim": victim, "dataset": v.dataset, "n": n, "max_queries": max_queries,
                      "iterations": iterations, "substitute": substitute} | (
                          {"preset": preset} if method in ("hopskipjump", "triangle") else {}) | (
                          {"settings": parse_kv(settings)} if settings else {}) | (
                          {"start_pool": start_pool, "start_pool_images": len(pool)} if pool is not None else {})
        run = RunDir(out).create(command=f"attack {method}", seed=seed, config=run_config)
        if v.oracle.ledger.budget is None:  # the query bar's end: every image may spend --max-queries
            from stealkit.progress import expect

            expect(v.oracle.ledger.total + int(ok.numel()) * max_queries)
        res = spec.run(v.oracle, x[ok], y[ok], max_queries=max_queries, config=config, substitute=sub,
                       **({"start_pool": pool} if pool is not None else {}))
        x_adv = x.clone()
        x_adv[ok] = res.x_adv
        import torch

        attempted = torch.zeros(len(y), dtype=torch.bool)
        attempted[ok] = True
        success = torch.zeros(len(y), dtype=torch.bool)
        success[ok] = res.success
        _save_npz(run.path / "adversarial.npz", {"x": x.numpy(), "x_adv": x_adv.numpy(), "y": y.numpy(),
                                                 "attempted": attempted.numpy(), "success": success.numpy()})
        per = res.extra["queries_per_example"].float()
        summary = {"method": method, "asr": res.success_rate if ok.numel() else None, "attempts": int(ok.numel()),
                   "successes": int(res.success.sum()), "victim_queries": v.oracle.ledger.as_dict(),
                   "median_norm_successful": res.summary()["median_norm_successful"],
                   "median_queries_per_image": float(per.median()) if per.numel() else None,
                   "victim": victim, "seed": seed}
        _finish(run, summary)
        click.echo(f"success {fmt.figure(summary['asr'])} ({summary['successes']}/{summary['attempts']}), "
                   f"median L2 {fmt.figure(summary['median_norm_successful'], 3)}, victim queries "
                   f"{fmt.queries(summary['victim_queries'])}; report: {run.report_path}")

    if method == "triangle":
        cmd = click.option(
            "--preset", type=click.Choice(["tuned", "paper"]), default="tuned", show_default=True,
            help="tuned: the settings chosen on validation images (docs/guide/attacks.md); paper: the "
                 "reference code's (Wang et al. 2022). --set overrides either.")(cmd)
    if method == "hopskipjump":
        cmd = click.option(
            "--preset", type=click.Choice(["tuned", "paper"]), default="tuned", show_default=True,
            help="tuned: the settings chosen on validation images (docs/guide/attacks.md), without or with "
                 "--substitute; paper: Chen et al.'s HopSkipJump (with --substitute: its prior and start only). "
                 "--set overrides either.")(cmd)
        cmd = click.option(
            "--start-pool", default=None, metavar="pool|FILE",
            help="Natural images the attacker owns, tried as start directions (one query each; with --preset "
                 "tuned the nearest image of each of 100 k-means clusters, after the opening): 'pool' = the "
                 "attacker split of the victim's data set (never the attacked test images; its labels are not "
                 "read), or a .npy / .safetensors file of images [N, C, H, W] in [0, 1] (loaded without pickle). "
                 "The attacker needs only unlabelled images of the victim's domain. Default: none (noise starts). "
                 "Not with --substitute.")(cmd)
    return cmd


def _load_start_pool(source: str, v: Any, data_dir: str | None) -> Any:
    """``--start-pool``: the attacker split of the victim's data set (``pool``) or images from a ``.npy`` /
    ``.safetensors`` file (no pickle); shape and range are checked by the attack (one-line errors)."""
    import torch

    from stealkit.errors import InputError
    from stealkit.extract.common import victim_splits

    if source == "pool":
        return victim_splits(v, data_dir).attacker_pool.x
    path = Path(source)
    if not path.is_file():
        raise InputError(f"--start-pool {source}: expected 'pool' or a .npy / .safetensors file of images")
    if path.suffix == ".npy":
        import numpy as np

        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise InputError(f"--start-pool {source}: not a plain numeric .npy array ({e})") from None
        if arr.dtype.kind not in "fiub":
            raise InputError(f"--start-pool {source}: expected a numeric array, got dtype {arr.dtype}")
        return torch.from_numpy(arr.astype("float32"))
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except (SafetensorError, ValueError, OSError) as e:
            raise InputError(f"--start-pool {source}: not a readable safetensors file ({e})") from None
        if len(tensors) != 1 and "x" not in tensors:
            raise InputError(f"--start-pool {source}: expected one tensor or one named 'x', got {sorted(tensors)}")
        return (tensors["x"] if "x" in tensors else next(iter(tensors.values()))).float()
    raise InputError(f"--start-pool {source}: expected 'pool' or a .npy / .safetensors file, got {path.suffix!r}")


def _load_substitute(path: str, v: Any, device: str) -> Any:
    """The substitute model at ``path``: a model directory, or an extraction run directory's ``student/``."""
    from stealkit.errors import InputError
    from stealkit.models import load_model
    from stealkit.models.io import SPEC_NAME

    p = Path(path)
    if not (p / SPEC_NAME).exists() and (p / "student" / SPEC_NAME).exists():
        p = p / "student"
    if not (p / SPEC_NAME).exists():
        raise InputError(f"--substitute {path}: expected a model directory (holding {SPEC_NAME}) or an extraction "
                         "run directory holding student/")
    model, spec = load_model(p, device=device)
    if tuple(spec.input_shape) != tuple(v.oracle.input_shape):
        raise InputError(f"--substitute {path} takes images of shape {list(spec.input_shape)}; the victim takes "
                         f"{list(v.oracle.input_shape)}")
    return model


def register(cli: click.Group) -> None:
    for m in TRANSFER:
        attack.add_command(_make_transfer(m))
    for m in DECISION:
        attack.add_command(_make_decision(m))
    cli.add_command(attack)
