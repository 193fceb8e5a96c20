"""``stealkit train``: train a victim model on a named data set."""

from __future__ import annotations

import click

from stealkit.commands.common import dataset_name, device_option, parse_kv, set_option


@click.command("train")
@click.option("--dataset", required=True, callback=dataset_name, help="digits, fashion-mnist, mnist, cifar10 or svhn.")
@click.option("--arch", default="conv2", show_default=True, help="Architecture from the model zoo.")
@click.option("--arch-arg", "arch_args", multiple=True, metavar="KEY=VALUE", help="Architecture argument (repeat).")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="adam", show_default=True)
@click.option("--lr", type=float, default=None, help="Learning rate (default 0.1 for SGD, 1e-3 for Adam).")
@click.option("--schedule", type=click.Choice(["step", "onecycle", "cosine", "none"]), default="cosine",
              show_default=True, help="step = x0.2 at 30/60/80%; onecycle = cyclic.")
@click.option("--weight-decay", type=float, default=5e-4, show_default=True)
@click.option("--noise-sigma", type=float, default=0.0, show_default=True,
              help="Gaussian data augmentation (for certified robustness).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split-seed", type=int, default=0, show_default=True, help="Seed of the data split.")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding the data set files.")
@click.option("--out", required=True, type=click.Path(), help="Directory for model.safetensors/json, metrics.json.")
@set_option("max_steps=200")
@device_option
def train_cmd(dataset: str, arch: str, arch_args: tuple[str, ...], epochs: int, batch_size: int, optimizer: str,
              lr: float | None, schedule: str, weight_decay: float, noise_sigma: float, seed: int, split_seed: int,
              data_dir: str | None, out: str, settings: tuple[str, ...], device: str) -> None:
    """Train a victim on the victim-train split and save it (safetensors + JSON spec)."""
    from stealkit.report.builders import build_report
    from stealkit.rundir import RunDir
    from stealkit.settings import apply_settings
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    config = TrainConfig(epochs=epochs, batch_size=batch_size, optimizer=optimizer, lr=lr,  # type: ignore[arg-type]
                         schedule=schedule, weight_decay=weight_decay, seed=seed,  # type: ignore[arg-type]
                         noise_sigma=noise_sigma)
    config = apply_settings(config, parse_kv(settings), who="train")
    kwargs = parse_kv(arch_args)
    run = RunDir(out).create(command="train", seed=seed, config={
        "dataset": dataset, "arch": arch, "arch_kwargs": kwargs, "split_seed": split_seed, "train": config.to_dict()})
    trained = train_victim(dataset, arch, config, out=out, arch_kwargs=kwargs, data_dir=data_dir,
                           split_seed=split_seed, device=device)
    for epoch in trained.history:
        run.append_record(epoch)
    run.write_summary({"test_accuracy": trained.metrics["test_accuracy"], "seed": seed, **trained.metrics,
                       "history": trained.history})
    run.write_report(build_report(run))
    click.echo(f"test accuracy {trained.metrics['test_accuracy']:.4f}; model saved to {out}")


def register(cli: click.Group) -> None:
    cli.add_command(train_cmd)
