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

    from stealkit.audit.run import AuditResult
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
TARGET_KEYWORDS = ("key", "top_k", "dataset", "data_dir", "device", "seed", "test_data")


def _victim(victim: Any, input_shape: tuple[int, ...] | None, num_classes: int | None) -> Any:
    """``victim`` as a runner's Target takes it: a path or address (``standard:NAME`` resolved; an ONNX or
    TorchScript file with ``input_shape`` / ``num_classes`` folded in as ``FILE?input_shape=C,H,W``, what the CLI's
    ``--input-shape`` does), or an ``nn.Module`` (``input_shape`` required)."""
    from torch import nn

    if isinstance(victim, (str, os.PathLike)):
        victim = os.fspath(victim)
        flags = {k: v for k, v in (("input_shape", ",".join(str(int(s)) for s in input_shape or ())),
                                   ("num_classes", str(num_classes) if num_classes is not None else "")) if v}
        if victim.startswith("standard:"):
            if flags:
                raise InputError(f"{'/'.join(flags)}= only apply to an nn.Module or an ONNX/TorchScript victim; "
                                 f"{victim} is a stealkit model whose model.json already says")
            from stealkit.victims import standard_victim

            return str(standard_victim(victim.split(":", 1)[1]).path)
        if flags:
            from stealkit.models.foreign_meta import join_victim

            try:
                return join_victim(victim, flags)
            except InputError as exc:
                raise InputError(str(exc).replace("--input-shape", "input_shape=")
                                 .replace("--num-classes", "num_classes=")) from None
        return victim
    if not isinstance(victim, nn.Module):
        raise InputError(f"victim must be an nn.Module, a model directory or file, standard:NAME or a URL; got "
                         f"{type(victim).__name__}")
    if input_shape is None:
        raise InputError("an nn.Module victim needs input_shape=(C, H, W)")
    return victim


def _own_data(options: dict[str, Any], test: Any, sources: tuple[str, ...]) -> None:
    """The owner's data in ``options`` as specs, checked now (before any work): ``test`` (or ``test_data=``) is a
    path or ``(x, y)``; each of ``sources`` (``pool``, ``unrelated``) a query source spec, a path, or an array or
    tensor of images (:func:`stealkit.data.own.own_spec`)."""
    from stealkit.data.own import own_spec

    if test is not None:
        if options.get("test_data") is not None:
            raise InputError("give test= or test_data=, not both")
        options["test_data"] = test
    if options.get("test_data") is not None:
        options["test_data"] = own_spec(options["test_data"], "test")
    for name in sources:
        if options.get(name) is not None and not isinstance(options[name], str):
            options[name] = own_spec(options[name], name)


def steal(victim: Any, *, budget: int, mode: str = "probs", out: str | os.PathLike[str] | None = None,
          input_shape: tuple[int, ...] | None = None, num_classes: int | None = None, test: Any = None,
          **options: Any) -> Extraction:
    """Steal ``victim`` with ``budget`` queries: ``stealkit extract surrogate`` (DFME appendix A surrogate-data
    extraction, ``--preset auto`` by default), with every option of that command as a keyword (``pool=``,
    ``student=``, ``epochs=``, ``preset=``, ``dataset=``, ``seed=``, ``device=``, ``resume=``, ``settings={...}``,
    ``student_args={...}`` (or ``student_kwargs=``)).

    ``victim``: an ``nn.Module`` taking images in [0, 1] (with ``input_shape=(C, H, W)`` and ``dataset=``; called
    as it is), a model directory from ``stealkit train``, ``standard:NAME``, an ``.onnx``/``.pt`` file (with
    ``input_shape=`` where its metadata lacks it), or an ``http(s)://`` / ``v2+http://`` address. ``pool=``: a
    query source, a ``.npy``/``.npz`` file or folder, or the images themselves (a numpy array or torch tensor);
    ``test=(x, y)`` (or a path, or ``test_data=``): the owner's labelled test split every figure is scored on.
    Arrays go through the checks a file's do and are recorded in config.json as source ``array`` with their
    sha256. ``out``: the run directory (default: a temporary one, kept).
    """
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
                         f"num_classes, test, {', '.join(known)}")
    if "student_args" in options and "student_kwargs" in options:
        raise InputError("steal(): give student_args or student_kwargs, not both")
    _own_data(options, test, ("pool",))
    opts = {k: v for k, v in options.items() if k in fields}
    opts["student_kwargs"] = dict(options.get("student_args") or opts.get("student_kwargs") or {})
    opts["settings"] = dict(opts.get("settings") or {})
    check_arch(None, None, opts.get("student"))
    check_source(None, None, opts.get("pool"))
    where = {k: options[k] for k in TARGET_KEYWORDS if k in options}
    if where.get("dataset") is not None:
        where["dataset"] = dataset_name(None, None, where["dataset"])
    where["device"] = resolve_device(where.get("device"))
    victim = _victim(victim, input_shape, num_classes)
    module = not isinstance(victim, str)
    target = Target(victim, input_shape=tuple(input_shape) if module and input_shape is not None else None,
                    num_classes=num_classes if module else None, **where)
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="stealkit-")) / "run"
    run = run_surrogate(target, budget, SurrogateOptions(mode=mode, **opts), out=out,
                        resume=bool(options.get("resume", False)))
    return extraction_of(run)


def extraction_of(run: ExtractionRun) -> Extraction:
    """The :class:`Extraction` of a runner's result: its figures as its run directory's summary.json records them."""
    return read_extraction(run.path)


def audit(victim: Any, *, out: str | os.PathLike[str] | None = None, input_shape: tuple[int, ...] | None = None,
          num_classes: int | None = None, budgets: Any = None, answers: Any = None, settings: dict[str, Any] | None = None,
          test: Any = None, **options: Any) -> AuditResult:
    """Audit ``victim`` as ``stealkit audit`` does (the same defaults): returns the
    :class:`~stealkit.audit.run.AuditResult` (``serving``: Q90/Q95, served accuracy and ECE per serving choice;
    ``verdict``; ``tables``; ``summary``: every figure; ``gates``; ``exit_code``; ``report``).

    ``victim``: what :func:`steal` takes, an ``nn.Module`` included (called as it is; give ``input_shape`` and
    ``dataset=``), an ONNX/TorchScript file with ``input_shape=`` where its metadata lacks it. ``pool=`` and
    ``unrelated=``: the two attackers' data (a query source, a path, or the images as a numpy array or torch
    tensor); ``test=(x, y)`` (or a path, or ``test_data=``): the owner's labelled test split, which every figure is
    scored on. Keywords: every option of :class:`~stealkit.audit.options.AuditOptions` (``quick=True``,
    ``max_queries=``, ``defences=[...]``, ``fail_if=[...]``, ``seed=``, ``device=``, ...), the part sizes of
    :class:`~stealkit.audit.options.Sizes` (``transfer_images=0``, ``seeds=3``, ...), ``budgets=(50, 100)`` and
    ``settings={...}`` for the surrogate recipe (``--set``). ``out``: the audit directory (default: a temporary
    one, kept; run again with the same options to resume)."""
    from stealkit.audit.options import AuditOptions, Sizes, parse_answers
    from stealkit.audit.run import run_audit

    size_names = {f.name for f in dataclasses.fields(Sizes)}
    known = {f.name for f in dataclasses.fields(AuditOptions)} - {"victim", "out", "sizes", "recipe", "budgets",
                                                                   "answers"}
    bad = sorted(set(options) - known - size_names)
    if bad:
        raise InputError(f"audit() has no option {', '.join(bad)}; known: {', '.join(sorted(known | size_names))}, "
                         "test")
    sizes = {k: options.pop(k) for k in list(options) if k in size_names}
    for name in ("defences", "fail_if"):
        if name in options:
            options[name] = tuple(options[name])
    _own_data(options, test, ("pool", "unrelated"))
    victim = _victim(victim, input_shape, num_classes)
    if not isinstance(victim, str):
        from stealkit.oracle.victim import Target

        victim = Target(victim, input_shape=tuple(input_shape or ()), num_classes=num_classes)
    if answers is not None:
        answers = parse_answers(answers if isinstance(answers, str) else ",".join(answers))
    opts = AuditOptions(victim=victim, out=os.fspath(out) if out is not None else tempfile.mkdtemp(prefix="stealkit-audit-"),
                        budgets=tuple(budgets) if budgets else None, sizes=sizes, recipe=dict(settings or {}),
                        **({"answers": answers} if answers is not None else {}), **options)
    return run_audit(opts)
