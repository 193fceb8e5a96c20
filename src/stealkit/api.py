"""The Python API: one call per capability, with the CLI's options and the CLI's defaults.

Each function calls the runner the CLI's command calls (:func:`stealkit.extract.surrogate_data.run.run_surrogate`
for :func:`steal`: the same option defaults, the same preset resolution, the same query ledger), so a default can
never differ between ``stealkit extract surrogate`` and :func:`steal`. It returns a typed result::

    from stealkit.api import steal
    run = steal("standard:digits-conv2", budget=1000, mode="label")
    print(run)   # accuracy 0.9.., fidelity 0.9.., queries 1,000 predict / 0 explain; report: ...
    student = run.student                             # the stolen copy, an nn.Module
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.errors import InputError

if TYPE_CHECKING:
    from torch import nn

    from stealkit.extract.common import ExtractionRun


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


def read_extraction(path: str | os.PathLike[str]) -> Extraction:
    """The :class:`Extraction` an ``extract`` run directory holds."""
    p = Path(path)
    summary = json.loads((p / "summary.json").read_text())
    config = json.loads((p / "config.json").read_text()).get("config", {})
    return Extraction(path=p, queries=dict(summary["queries"]), accuracy=summary.get("accuracy"),
                      fidelity=summary.get("fidelity"), victim_accuracy=summary.get("victim_accuracy"),
                      config=config, summary=summary)


#: steal()'s keywords that are the Target's (the rest but ``resume`` and ``student_args`` are SurrogateOptions')
TARGET_KEYWORDS = ("key", "top_k", "dataset", "data_dir", "device", "seed")


def steal(victim: Any, *, budget: int, mode: str = "probs", out: str | os.PathLike[str] | None = None,
          input_shape: tuple[int, ...] | None = None, num_classes: int | None = None, **options: Any) -> Extraction:
    """Steal ``victim`` with ``budget`` queries: ``stealkit extract surrogate`` (DFME appendix A surrogate-data
    extraction, ``--preset auto`` by default), with every option of that command as a keyword (``pool=``,
    ``student=``, ``epochs=``, ``preset=``, ``dataset=``, ``seed=``, ``device=``, ``resume=``, ``settings={...}``,
    ``student_args={...}`` (or ``student_kwargs=``)).

    ``victim``: an ``nn.Module`` taking images in [0, 1] (with ``input_shape=(C, H, W)`` and ``dataset=``; called
    as it is), a model directory from ``stealkit train``, ``standard:NAME``, an ``.onnx``/``.pt`` file, or an
    ``http(s)://`` / ``v2+http://`` address. ``out``: the run directory (default: a temporary one, kept).
    """
    from torch import nn

    from stealkit.commands.common import check_arch, check_budget, check_source, dataset_name
    from stealkit.device import resolve_device
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate
    from stealkit.oracle.victim import Target

    check_budget(None, None, budget)
    fields = {f.name for f in dataclasses.fields(SurrogateOptions)}
    known = sorted(fields | set(TARGET_KEYWORDS) | {"student_args", "resume"})
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"steal(): unknown keyword {unknown[0]!r}; known: budget, mode, out, input_shape, "
                         f"num_classes, {', '.join(known)}")
    if "student_args" in options and "student_kwargs" in options:
        raise InputError("steal(): give student_args or student_kwargs, not both")
    opts = {k: v for k, v in options.items() if k in fields}
    opts["student_kwargs"] = dict(options.get("student_args") or opts.get("student_kwargs") or {})
    opts["settings"] = dict(opts.get("settings") or {})
    check_arch(None, None, opts.get("student"))
    check_source(None, None, opts.get("pool"))
    where = {k: options[k] for k in TARGET_KEYWORDS if k in options}
    if where.get("dataset") is not None:
        where["dataset"] = dataset_name(None, None, where["dataset"])
    where["device"] = resolve_device(where.get("device"))
    if isinstance(victim, (str, os.PathLike)):
        victim = os.fspath(victim)
        if victim.startswith("standard:"):
            from stealkit.victims import standard_victim

            victim = str(standard_victim(victim.split(":", 1)[1]).path)
    elif not isinstance(victim, nn.Module):
        raise InputError(f"victim must be an nn.Module, a model directory or file, standard:NAME or a URL; got "
                         f"{type(victim).__name__}")
    elif input_shape is None:
        raise InputError("an nn.Module victim needs input_shape=(C, H, W)")
    target = Target(victim, input_shape=tuple(input_shape) if input_shape is not None else None,
                    num_classes=num_classes, **where)
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="stealkit-")) / "run"
    run = run_surrogate(target, budget, SurrogateOptions(mode=mode, **opts), out=out,
                        resume=bool(options.get("resume", False)))
    return extraction_of(run)


def extraction_of(run: ExtractionRun) -> Extraction:
    """The :class:`Extraction` of a runner's result: its figures as its run directory's summary.json records them."""
    return read_extraction(run.path)
