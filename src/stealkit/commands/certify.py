"""``stealkit certify`` (certified L2 radii of a Gaussian-smoothed model) and ``stealkit train-robust``
(Gaussian augmentation, stability training, TRADES, PGD adversarial training)."""

from __future__ import annotations

import time

import click

from stealkit.commands.common import dataset_name, device_option, model_option, parse_kv, set_option

RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


@click.command("certify")
@model_option()
@click.option("--sigma", type=float, required=True, help="Standard deviation of the Gaussian noise (pixel scale).")
@click.option("--n0", type=int, default=100, show_default=True, help="Noisy samples that select the class.")
@click.option("--n", "n", type=int, default=1000, show_default=True, help="Noisy samples that estimate it.")
@click.option("--alpha", type=float, default=0.001, show_default=True, help="Failure probability.")
@click.option("--bound", type=click.Choice(["renyi", "cohen", "pixeldp", "all"]), default="all", show_default=True)
@click.option("--interval", type=click.Choice(["clopper-pearson", "sison-glaz"]), default="clopper-pearson",
              show_default=True, help="Bounds on (p1, p2) for the Renyi and PixelDP radii.")
@click.option("--num", "num", type=int, default=200, show_default=True, help="Test images to certify (first N).")
@click.option("--skip", type=int, default=1, show_default=True, help="Certify every SKIP-th test image.")
@click.option("--dataset", default=None, callback=dataset_name, help="Test data set (default: read from the model's model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@click.option("--batch-size", type=int, default=400, show_default=True, help="Noisy copies per forward pass.")
@click.option("--radii", default=",".join(f"{r:g}" for r in RADII), show_default=True,
              help="Radii at which to report certified accuracy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise.")
@click.option("--out", required=True, type=click.Path(), help="Run directory to write.")
@device_option
def certify_cmd(model_dir: str, sigma: float, n0: int, n: int, alpha: float, bound: str, interval: str, num: int,
                skip: int, dataset: str | None, data_dir: str | None, batch_size: int, radii: str, seed: int,
                out: str, device: str) -> None:
    """Certify test images of a model smoothed with Gaussian noise (Li et al. 2019, Alg. 1; Cohen et al.).

    Writes one record per test point (label or abstain, radius per bound, p-bounds, counts) to
    records.jsonl, certified accuracy by radius to summary.json, and report.html.
    """
    from stealkit.certify.evaluate import summarize
    from stealkit.certify.smoothing import SmoothingConfig, certify_iter
    from stealkit.data import load_splits
    from stealkit.errors import InputError
    from stealkit.models.locate import load_any_model
    from stealkit.progress import progress
    from stealkit.report.builders import build_report
    from stealkit.rundir import RunDir

    try:
        radii_list = [float(r) for r in radii.split(",") if r.strip()]
    except ValueError:
        raise InputError(f"--radii must be comma-separated numbers, got {radii!r}") from None
    if num < 1 or skip < 1:
        raise InputError("--num and --skip must be >= 1")
    bounds = ("cohen", "renyi", "pixeldp") if bound == "all" else (bound,)
    config = SmoothingConfig(sigma=sigma, n0=n0, n=n, alpha=alpha, bounds=bounds, interval=interval,  # type: ignore[arg-type]
                             batch_size=batch_size, seed=seed)
    model, spec = load_any_model(model_dir, device=device)
    name = dataset or spec.extra.get("dataset")
    if not name:
        raise InputError(f"{model_dir}: its model.json or metadata names no data set; pass --dataset")
    test = load_splits(name, data_dir=data_dir, seed=int(spec.extra.get("split_seed", 0))).test
    idx = list(range(0, len(test), skip))[:num]
    x, y = test.x[idx], test.y[idx]
    run = RunDir(out).create(command="certify", seed=seed, config={
        "model": model_dir, "dataset": name, "num": len(idx), "skip": skip, "radii": radii_list,
        "smoothing": config.to_dict(), "device": device})
    certs = []
    t0 = time.perf_counter()
    bar = progress(certify_iter(model, x, config, device=device), total=len(idx), desc="certify", unit="img")
    for j, cert in enumerate(bar):
        certs.append(cert)
        run.append_record({"index": idx[j], "y": int(y[j]), "correct": cert.label == int(y[j]), **cert.to_record()})
    seconds = time.perf_counter() - t0
    summary = {"method": "certify", "sigma": sigma, "n0": n0, "n": n, "alpha": alpha, "bounds": list(bounds),
               "interval": interval, "seconds": round(seconds, 2), "images_per_second": len(idx) / seconds,
               "model_test_accuracy": spec.metrics.get("test_accuracy"), "seed": seed,
               **summarize(certs, y, radii_list, bounds)}
    run.write_summary(summary)
    run.write_report(build_report(run))
    acc = summary["certified_accuracy"]
    click.echo("certified accuracy by radius: " + "; ".join(
        f"{b}: " + ", ".join(f"{r}={v:.3f}" for r, v in acc[b].items()) for b in bounds))
    click.echo(f"{len(idx)} images in {seconds:.1f}s; report: {run.report_path}")


@click.command("train-robust")
@click.option("--dataset", required=True, callback=dataset_name, help="digits, fashion-mnist or mnist.")
@click.option("--arch", default="conv2", show_default=True, help="Architecture from the model zoo.")
@click.option("--method", type=click.Choice(["none", "gaussian", "stability", "trades", "pgd"]), default="stability",
              show_default=True, help="gaussian = noise augmentation; stability = STN (Li et al. Sec. 5.1).")
@click.option("--sigma", type=float, default=0.5, show_default=True, help="Training noise (gaussian, stability).")
@click.option("--gamma", type=float, default=1.0, show_default=True, help="Weight of the stability term.")
@click.option("--beta", type=float, default=6.0, show_default=True, help="TRADES weight.")
@click.option("--eps", type=float, default=0.3, show_default=True, help="Linf radius of TRADES / PGD training.")
@click.option("--pgd-steps", type=int, default=10, show_default=True)
@click.option("--pgd-step", type=float, default=0.01, show_default=True)
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--lr", type=float, default=None, help="Learning rate (default 1e-3, Adam).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding the data set files.")
@click.option("--out", required=True, type=click.Path(), help="Directory for the model and its run files.")
@set_option("train.weight_decay=0")
@device_option
def train_robust_cmd(dataset: str, arch: str, method: str, sigma: float, gamma: float, beta: float, eps: float,
                     pgd_steps: int, pgd_step: float, epochs: int, batch_size: int, lr: float | None, seed: int,
                     data_dir: str | None, out: str, settings: tuple[str, ...], device: str) -> None:
    """Train a base classifier for smoothing (or an adversarially trained baseline) and save it."""
    from stealkit.certify.training import RobustTrainConfig
    from stealkit.report.builders import build_report
    from stealkit.rundir import RunDir
    from stealkit.settings import apply_settings
    from stealkit.train import TrainConfig
    from stealkit.victims import RobustRecipe, robust_victim

    cfg = RobustTrainConfig(method=method, sigma=sigma, gamma=gamma, beta=beta, eps=eps, step=pgd_step,  # type: ignore[arg-type]
                            steps=pgd_steps, train=TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed))
    cfg = apply_settings(cfg, parse_kv(settings), who="train-robust")
    recipe = RobustRecipe(dataset, arch, cfg)
    run = RunDir(out).create(command="train-robust", seed=seed, config={"dataset": dataset, "arch": arch,
                                                                         "robust_train": cfg.to_dict()})
    trained = robust_victim(recipe, cache_dir=out, data_dir=data_dir, device=device)
    run.write_summary({"test_accuracy": trained.metrics["test_accuracy"], "seed": seed, **trained.metrics})
    run.write_report(build_report(run))
    click.echo(f"clean test accuracy {trained.metrics['test_accuracy']:.4f}; model saved to {out}")


def register(cli: click.Group) -> None:
    cli.add_command(certify_cmd)
    cli.add_command(train_robust_cmd)
