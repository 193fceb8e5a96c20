"""Options and helpers shared by the CLI commands (not a command module itself)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from stealkit.errors import InputError
from stealkit.settings import (
    parse_int_list,  # noqa: F401  (the commands import it from here)
    parse_value,
)

MODES = ("label", "topk", "probs", "logits")


def parse_kv(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("hidden=64", "width=0.5")`` -> ``{"hidden": 64, "width": 0.5}`` (ints, floats, bools, strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise InputError(f"expected KEY=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        out[k.strip().replace("-", "_")] = parse_value(v.strip())
    return out


def set_option(example: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--set KEY=VALUE`` (repeatable): any setting of the command's config dataclass, checked by name and type
    (:func:`stealkit.settings.apply_settings`); ``example`` shows one in the help."""
    return click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                        help=f"Any setting of the config, e.g. {example} (repeat; a.b=v sets a nested one).")


def _resolve_device(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str:
    from stealkit.device import ENV_VAR, resolve_device

    from_env = ctx is not None and ctx.get_parameter_source("device") == click.core.ParameterSource.ENVIRONMENT
    return resolve_device(value, source=f"${ENV_VAR}" if from_env else "--device")


def device_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--device auto|cpu|cuda|cuda:N|mps`` (else ``$STEALKIT_DEVICE``, else auto), resolved and checked by
    :func:`stealkit.device.resolve_device`: the command receives a canonical device (``cpu``, ``cuda:0``)."""
    return click.option(
        "--device", default="auto", show_default=True, envvar="STEALKIT_DEVICE", callback=_resolve_device,
        help="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:N, mps; default "
             "$STEALKIT_DEVICE, else auto.",
    )(fn)


VICTIM_HELP = ("Victim: a model directory, an ONNX (.onnx) or TorchScript (.pt) file, an http(s):// API address, "
               "a v2 (Open Inference Protocol: KServe, Triton, MLServer) endpoint v2+http://HOST:PORT with --model "
               "NAME, or standard:NAME (a cached standard victim, trained on first use, e.g. standard:digits-conv2).")
_FOREIGN_FLAGS = "stealkit.foreign_flags"  # ctx.meta key: what --input-shape etc. said
_V2_FLAGS = "stealkit.v2_flags"  # ctx.meta key: what --model and --protocol said
FOREIGN_HELP = {
    "input_shape": "ONNX/TorchScript victim: input shape C,H,W, when its metadata lacks it (e.g. 1,28,28).",
    "num_classes": "ONNX/TorchScript victim: number of classes (checked against its output).",
    "value_range": "ONNX/TorchScript victim: pixel range it expects, LO,HI (default 0,1; 0,255 for bytes).",
    "normalize": "ONNX/TorchScript victim: normalisation before it: none, MEAN,STD or M1,M2,M3/S1,S2,S3.",
    "output": "ONNX/TorchScript victim: what it returns, logits or probs (after a softmax), overriding its "
              "metadata; default: its metadata, else probed when opened (rows of probabilities read as probs).",
}
#: a click type for the flags that take one of a few words (the others are checked by the loader's parser)
FOREIGN_TYPES: dict[str, click.ParamType] = {"output": click.Choice(["logits", "probs"])}


def _store_foreign_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None and param.name:
        ctx.meta.setdefault(_FOREIGN_FLAGS, {})[param.name] = value


def foreign_flags(ctx: click.Context) -> dict[str, str]:
    """What ``--input-shape``, ``--output`` etc. said on this command line."""
    return dict(ctx.meta.get(_FOREIGN_FLAGS, {}))


def _store_v2_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None and param.name:
        ctx.meta.setdefault(_V2_FLAGS, {})[param.name] = value


def _v2_victim(value: str, v2: dict[str, str], flags: dict[str, str]) -> str:
    """A v2 endpoint with ``--model`` (and ``--num-classes``) folded in: ``v2+http://HOST:PORT/v2/models/NAME``."""
    from stealkit.oracle.http_v2 import is_v2, v2_address

    if v2.get("protocol") == "v1" or not (is_v2(value) or v2.get("protocol") == "v2"):
        raise InputError(f"--model/--protocol v2 name a model on a v2 (Open Inference Protocol) server; {value} is "
                         "not one (write it v2+http://HOST:PORT)")
    other = sorted(set(flags) - {"num_classes"})
    if other:
        raise InputError(f"--{'/--'.join(k.replace('_', '-') for k in other)} only apply to an ONNX or TorchScript "
                         f"file; a v2 endpoint's metadata says its input shape (only --num-classes applies)")
    k = flags.get("num_classes")
    if k is not None and not k.isdigit():
        raise InputError(f"--num-classes must be an integer, got {k!r}")
    return v2_address(value, v2.get("v2_model"), int(k) if k is not None else None)


def resolve_victim(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """``standard:NAME`` -> the directory of that cached standard victim (trained on first use); an ONNX or
    TorchScript file with ``--input-shape``, ``--output`` etc. -> ``FILE?input_shape=...&output=...`` (read by the loader, recorded in
    config.json); else as given."""
    flags = dict(ctx.meta.get(_FOREIGN_FLAGS, {})) if ctx is not None else {}
    v2 = dict(ctx.meta.get(_V2_FLAGS, {})) if ctx is not None else {}
    if value and (v2.get("protocol") == "v2" or "v2_model" in v2 or value.startswith("v2+") or "/v2/models/" in value):
        return _v2_victim(value, v2, flags)
    if value and value.startswith("standard:"):
        if flags:
            raise InputError(f"--{'/--'.join(k.replace('_', '-') for k in flags)} only apply to an ONNX or TorchScript "
                             f"victim; {value} is a stealkit model whose model.json already says")
        from stealkit.victims import standard_victim

        return str(standard_victim(value.split(":", 1)[1]).path)
    if value:
        check_victim_form(value, "--victim" if param is None or param.name == "victim" else "--model")
    if value and flags:
        from stealkit.models.foreign_meta import join_victim

        return join_victim(value, flags)
    return value


VICTIM_FORMS = ("a model directory written by `stealkit train` (or an extraction run's student/), standard:NAME "
                "(e.g. standard:digits-conv2), an .onnx or .pt file, an http(s):// URL, or v2+http://HOST:PORT")


def check_victim_form(value: str, option: str = "--victim") -> None:
    """Refuse, at once and before any model is loaded, a victim that is none of the accepted forms: a local path
    that does not exist (the usual typo) gets one line naming every form the option accepts."""
    from pathlib import Path

    if "://" in value or value.startswith("standard:"):
        return
    path = Path(value.split("?", 1)[0])
    if not path.exists():
        raise InputError(f"{option} {value}: no such file or directory; {option} takes {VICTIM_FORMS}")


def dataset_name(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """``--dataset`` in its one canonical spelling (``fmnist``, ``fashion_mnist`` -> ``fashion-mnist``), so
    model.json, the ONNX metadata and the report store one name; an unknown name is refused at once."""
    if value is None:
        return None
    from stealkit.data.sources import canonical_dataset

    return canonical_dataset(value)


def check_arch(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """``--student``: a zoo architecture, refused at once (before any victim is loaded) with the list."""
    if value is not None and value not in ARCH_NAMES:
        name = "--" + (param.name or "student").replace("_", "-") if param is not None else "--student"
        raise InputError(f"{name} {value}: unknown architecture; choose one of: {', '.join(ARCH_NAMES)}")
    return value


#: the zoo's architectures (stealkit.models.zoo.ARCHITECTURES; a test keeps them equal), named here so that a
#: mistyped --student is refused without importing torch
ARCH_NAMES = ("cnn3", "cnn4", "conv2", "lenet5", "logistic", "mlp", "mlp2", "resnet", "vgg11")


def check_source(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """``--pool``: a query source spec, checked at once (before any victim is loaded)."""
    if value is not None:
        from stealkit.data import parse_source

        try:
            parse_source(value)
        except InputError as exc:
            raise InputError(f"--pool {value}: {exc}") from None
    return value


TEST_DATA_HELP = ("Your own labelled test data, which every figure (fidelity, accuracy) is scored on instead of the "
                  "data set's test split: a .npz with x (images, flat or [N, C, H, W]) and y (labels), or a folder "
                  "of PNG/JPEG images in one subfolder per class (the folder's name is the label). The data set "
                  "may then be unknown.")


def check_test_data(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """``--test-data``: an existing ``.npy``/``.npz`` file or folder, checked at once (its content when read)."""
    if value is not None:
        from stealkit.data.own import check_own_path

        check_own_path(value, "--test-data")
    return value


def test_data_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--test-data PATH`` (passed as ``test_data``): the owner's labelled test split."""
    return click.option("--test-data", default=None, metavar="PATH", callback=check_test_data,
                        help=TEST_DATA_HELP)(fn)


def check_budget(ctx: click.Context | None, param: click.Parameter | None, value: int | None) -> int | None:
    """``--budget`` must be a positive number of victim queries (or absent where the command allows no cap)."""
    if value is not None and value < 1:
        raise InputError(f"--budget {value}: the budget is the number of victim queries (images) the attack may "
                         "spend; give a positive integer, e.g. --budget 1000")
    return value


def victim_option(*, help_text: str = VICTIM_HELP) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--victim`` option of every command that attacks a victim (``standard:NAME`` resolved here), with
    ``--input-shape/--num-classes/--value-range/--normalize/--output`` for ONNX/TorchScript files (eager, so they are
    read before ``--victim`` is resolved), and ``--model``/``--protocol`` for a v2 (Open Inference Protocol)
    endpoint."""
    v2 = [
        click.option("--model", "v2_model", default=None, is_eager=True, expose_value=False, callback=_store_v2_flag,
                     help="v2 endpoint: the model's name on the server (GET /v2/models/NAME)."),
        click.option("--protocol", type=click.Choice(["v1", "v2"]), default=None, is_eager=True,
                     expose_value=False, callback=_store_v2_flag,
                     help="HTTP victim's protocol: v1 (stealkit serve's /v1 API, the default for http://) or v2 "
                          "(the Open Inference Protocol, the default for v2+http://)."),
    ]
    main = _model_file_option(click.option("--victim", required=True, callback=resolve_victim, help=help_text))
    return lambda fn: main(functools.reduce(lambda f, o: o(f), reversed(v2), fn))


MODEL_HELP = ("Model: a model directory (model.json + model.safetensors), an extraction run directory (its "
              "student/), an ONNX (.onnx) or TorchScript (.pt) file, or standard:NAME.")


def model_option(*, help_text: str = MODEL_HELP) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--model`` (passed as ``model_dir``) of the commands that run a model themselves (certify, serve): what
    ``--victim`` accepts, with the same ``--input-shape`` etc. flags for ONNX/TorchScript files."""
    return _model_file_option(click.option("--model", "model_dir", required=True, callback=resolve_victim,
                                           help=help_text))


def _model_file_option(main: Callable[[Callable[..., Any]], Callable[..., Any]]
                       ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    opts = [main] + [
        click.option(f"--{name.replace('_', '-')}", name, default=None, is_eager=True, expose_value=False,
                     type=FOREIGN_TYPES.get(name), callback=_store_foreign_flag,
                     help=text.replace("victim", "victim or model", 1))
        for name, text in FOREIGN_HELP.items()
    ]
    return lambda fn: functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def victim_file_option(main: Callable[[Callable[..., Any]], Callable[..., Any]]
                       ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``main`` (a ``--victim``-like option whose callback calls :func:`resolve_victim`) with the
    ``--input-shape/--num-classes/--value-range/--normalize/--output`` flags of ONNX/TorchScript files."""
    return _model_file_option(main)


def victim_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--victim/--key/--mode/--temperature/--top-k/--budget: how to reach the victim and what it returns."""
    opts = [
        victim_option(),
        click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim."),
        click.option("--mode", type=click.Choice(MODES), default="probs", show_default=True,
                     help="What the oracle returns."),
        click.option("--temperature", type=float, default=1.0, show_default=True,
                     help="Softmax temperature of a local probs/topk oracle."),
        click.option("--top-k", type=int, default=1, show_default=True, help="Classes a topk oracle reveals."),
        click.option("--budget", type=int, required=True, callback=check_budget, is_eager=True,
                     help="Victim queries (images) the attack may spend (a positive integer)."),
        click.option("--dataset", default=None, callback=dataset_name,
                     help="Data set of the victim's task (default: read from the victim's model.json)."),
        click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files."),
        test_data_option,
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice."),
        click.option("--out", required=True, type=click.Path(), help="Run directory to write."),
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)
