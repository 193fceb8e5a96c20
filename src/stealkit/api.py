"""The Python API: one call per capability, with the CLI's options and the CLI's defaults.

Each function runs the very command the CLI runs (the same option parsing, the same preset resolution, the
same query ledger), so a default can never differ between ``stealkit extract surrogate`` and
:func:`steal`. It returns a typed result read back from the run directory::

    from stealkit.api import steal
    run = steal("standard:digits-conv2", budget=1000, mode="label")
    print(run)   # accuracy 0.9.., fidelity 0.9.., queries 1,000 predict / 0 explain; report: ...
    student = run.student                             # the stolen copy, an nn.Module
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.errors import InputError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Extraction:
    """What an extraction run wrote: its ledger, figures, student and report (all read from ``path``)."""

    path: Path
    queries: dict[str, int]
    accuracy: float | None
    fidelity: float | None
    victim_accuracy: float | None
    config: dict[str, Any] = field(repr=False)
    summary: dict[str, Any] = field(repr=False)

    @property
    def student(self) -> nn.Module:
        """The stolen copy (loaded from ``path/student``, in eval mode on the CPU)."""
        from stealkit.models import load_model

        return load_model(self.path / "student")[0]

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    @property
    def curve(self) -> list[dict[str, Any]]:
        """Accuracy/fidelity against queries, one point per evaluation."""
        return list(self.summary.get("curve", []))

    def __str__(self) -> str:
        """The CLI's closing line: ``accuracy 0.912, fidelity 0.930, queries 1,000 predict / 0 explain; report: ...``."""
        from stealkit import fmt

        return (f"accuracy {fmt.figure(self.accuracy, 3)}, fidelity {fmt.figure(self.fidelity, 3)}, queries "
                f"{fmt.queries(self.queries)}; report: {self.report}")


def _victim_args(victim: Any, *, input_shape: tuple[int, ...] | None, num_classes: int | None,
                 workdir: Path) -> list[str]:
    """``--victim`` (and the flags a TorchScript file needs) for what the user has: a model directory or file,
    ``standard:NAME``, a URL, or an ``nn.Module`` (traced to TorchScript in ``workdir``)."""
    from torch import nn

    if isinstance(victim, (str, os.PathLike)):
        return ["--victim", os.fspath(victim)]
    if not isinstance(victim, nn.Module):
        raise InputError(f"victim must be an nn.Module, a model directory or file, standard:NAME or a URL; got "
                         f"{type(victim).__name__}")
    if input_shape is None:
        raise InputError("an nn.Module victim needs input_shape=(C, H, W)")
    import torch

    was_training = victim.training
    victim.eval()
    example = torch.zeros(1, *input_shape)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace: the .pt victim loader reads it
        k = num_classes or int(victim(example).shape[-1])
        traced = torch.jit.trace(victim, example)
    victim.train(was_training)
    path = workdir / "victim.pt"
    traced.save(str(path))
    return ["--victim", str(path), "--input-shape", ",".join(map(str, input_shape)), "--num-classes", str(k),
            "--value-range", "0,1", "--normalize", "none"]


def _options(options: dict[str, Any]) -> list[str]:
    """Keyword options as the command's flags: ``student_args={"hidden": 8}`` -> ``--student-arg hidden=8``,
    ``settings={"min_steps": 0}`` -> ``--set min_steps=0``, ``x=True`` -> ``--x``, ``x=None`` left out."""
    args: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        if name in ("student_args", "settings"):
            flag = "--student-arg" if name == "student_args" else "--set"
            for k, v in dict(value).items():
                args += [flag, f"{k}={v}"]
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def surrogate_args(victim: Any, *, budget: int, out: str | os.PathLike[str] | None = None, workdir: Path,
                   input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
                   **options: Any) -> list[str]:
    """The ``stealkit extract surrogate`` arguments :func:`steal` runs (for a test or a log)."""
    out = out if out is not None else workdir / "run"
    return [*_victim_args(victim, input_shape=input_shape, num_classes=num_classes, workdir=workdir),
            "--budget", str(budget), *_options(options), "--out", os.fspath(out)]


def read_extraction(path: str | os.PathLike[str]) -> Extraction:
    """The :class:`Extraction` an ``extract`` run directory holds."""
    p = Path(path)
    summary = json.loads((p / "summary.json").read_text())
    config = json.loads((p / "config.json").read_text()).get("config", {})
    return Extraction(path=p, queries=dict(summary["queries"]), accuracy=summary.get("accuracy"),
                      fidelity=summary.get("fidelity"), victim_accuracy=summary.get("victim_accuracy"),
                      config=config, summary=summary)


def steal(victim: Any, *, budget: int, mode: str = "probs", out: str | os.PathLike[str] | None = None,
          input_shape: tuple[int, ...] | None = None, num_classes: int | None = None, **options: Any) -> Extraction:
    """Steal ``victim`` with ``budget`` queries: ``stealkit extract surrogate`` (DFME appendix A surrogate-data
    extraction, ``--preset auto`` by default), with every option of that command as a keyword (``pool=``,
    ``student=``, ``epochs=``, ``preset=``, ``dataset=``, ``seed=``, ``device=``, ``settings={...}``,
    ``student_args={...}``).

    ``victim``: an ``nn.Module`` taking images in [0, 1] (with ``input_shape=(C, H, W)`` and ``dataset=``;
    traced to TorchScript), a
    model directory from ``stealkit train``, ``standard:NAME``, an ``.onnx``/``.pt`` file, or an
    ``http(s)://`` / ``v2+http://`` address. ``out``: the run directory (default: a temporary one, kept).
    """
    from stealkit.commands.extract_surrogate import surrogate_cmd

    workdir = Path(tempfile.mkdtemp(prefix="stealkit-"))
    args = surrogate_args(victim, budget=budget, out=out, workdir=workdir, input_shape=input_shape,
                          num_classes=num_classes, mode=mode, **options)
    import contextlib
    import io

    # the command's closing line is the caller's to print (``print(run)``); progress and logs stay on stderr
    with contextlib.redirect_stdout(io.StringIO()), surrogate_cmd.make_context("surrogate", list(args)) as ctx:
        surrogate_cmd.invoke(ctx)
    return read_extraction(args[args.index("--out") + 1])
