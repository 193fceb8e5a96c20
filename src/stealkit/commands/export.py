"""``stealkit export``: write a stolen (or any stealkit) model as ONNX, TorchScript or one safetensors file."""

from __future__ import annotations

import click

from stealkit.commands.common import device_option


@click.command("export")
@click.argument("run", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["onnx", "torchscript", "safetensors"]), default=None,
              help="Format to write (default: from the suffix of --out: .onnx, .pt, .safetensors).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="File to write (atomically).")
@click.option("--check-batch", type=int, default=64, show_default=True,
              help="Random images on which the export's logits are compared with the model's.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the check images.")
@device_option
def export_cmd(run: str, fmt: str | None, out: str, check_batch: int, seed: int, device: str) -> None:
    """Export RUN (an extraction run directory, whose student/ is exported, or a model directory).

    The export embeds the input shape, value range, normalisation and classes, is loaded back (onnxruntime,
    torch.jit or stealkit) and compared with the model on a batch: the max |logit difference| is printed, and
    above 1e-4 nothing is written.
    """
    from stealkit.models.export import export_model
    from stealkit.models.io import load_model
    from stealkit.models.locate import locate_model_dir

    model_dir = locate_model_dir(run)
    model, spec = load_model(model_dir, device=device)
    res = export_model(model, spec, out, fmt, batch=check_batch, seed=seed, device=device)
    click.echo(f"wrote {res.path} ({res.format}, {res.bytes} bytes) from {model_dir}; checked on "
               f"{res.checked_images} images: max |logit difference| {res.max_abs_diff:.3g}")


def register(cli: click.Group) -> None:
    cli.add_command(export_cmd)
