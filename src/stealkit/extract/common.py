"""What every extraction method shares: the victim handle, metered batch querying, results and records."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit import __version__
from stealkit.errors import InputError, StealkitError
from stealkit.metrics import Evaluator, predict_labels
from stealkit.oracle import Oracle, OutputMode
from stealkit.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass
class Victim:
    """An oracle over the victim, and what the experimenter knows about it for evaluation."""

    oracle: Oracle
    input_shape: tuple[int, int, int]
    num_classes: int
    dataset: str | None
    split_seed: int = 0
    model: nn.Module | None = None  # only for local victims: evaluation, never attacks
    spec: Any = None
    location: str = ""

    @property
    def is_local(self) -> bool:
        return self.model is not None


def is_url(victim: str) -> bool:
    return victim.startswith(("http://", "https://", "v2+http://", "v2+https://"))


def open_victim(
    victim: str | Path,
    *,
    mode: str | OutputMode = "probs",
    budget: int | None = None,
    temperature: float = 1.0,
    top_k: int = 1,
    key: str | None = None,
    explain: bool = False,
    dataset: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    defences: tuple[Any, ...] = (),
) -> Victim:
    """Open a victim given as a model directory, an ONNX or TorchScript file, an ``http(s)://`` API address, or a
    v2 (Open Inference Protocol) endpoint ``v2+http://host:port/v2/models/NAME`` (:mod:`stealkit.oracle.http_v2`).

    A file may carry what its metadata lacks as ``FILE?input_shape=C,H,W&num_classes=K&...`` (see
    :mod:`stealkit.models.foreign_meta`; the CLI's ``--input-shape`` etc. are folded in this way). It is wrapped
    as an ``nn.Module`` and answered by the same :class:`~stealkit.oracle.LocalOracle`, so the ledger counts
    the same. (The CLI's ``--victim standard:NAME`` is resolved to a directory by the command layer, which may
    build victims; this layer only opens them.) ``defences`` (:func:`stealkit.serve.defences.parse_defence`)
    perturb a local victim's answers, as a ``stealkit serve`` key's ``defences`` do; a remote victim's are its server's.
    """
    victim = str(victim)
    if victim.startswith("standard:"):
        raise InputError(f"{victim}: resolve standard victims first (stealkit.victims.standard_victim(NAME).path)")
    if is_url(victim):
        if defences:
            raise InputError(f"{victim} is a remote victim: its defences are its server's (a stealkit serve key's defences)")
        try:
            from stealkit.oracle.http import HttpOracle
            from stealkit.oracle.http_v2 import V2HttpOracle, is_v2
        except ImportError:
            raise StealkitError("HTTP victims need stealkit.oracle.http, which this install lacks") from None
        remote: HttpOracle
        if is_v2(victim):  # the Open Inference Protocol: a key only if the server wants one
            remote = V2HttpOracle(victim, key=key, mode=mode, budget=budget)
        elif not key:
            raise InputError("an HTTP victim needs an API key: pass --key KEY")
        else:
            remote = HttpOracle(victim, key=key, mode=mode, budget=budget)
        return Victim(
            oracle=remote,
            input_shape=remote.input_shape,
            num_classes=remote.num_classes,
            dataset=dataset or getattr(remote, "dataset", None),
            split_seed=int(getattr(remote, "split_seed", 0) or 0),
            location=victim,
        )
    from stealkit.models import load_model
    from stealkit.models.foreign import is_foreign, load_foreign
    from stealkit.oracle import LocalExplanationOracle, LocalOracle

    model: nn.Module
    spec: Any  # a ModelSpec, or a ForeignMeta for an ONNX/TorchScript file
    if is_foreign(victim):
        model, spec = load_foreign(victim, device=device)
        if explain and spec.format == "onnx":
            raise InputError(f"{spec.path} is an ONNX victim: onnxruntime gives no gradients, so it cannot answer "
                             "explanations; use a TorchScript (.pt) or stealkit model directory for explanation modes")
    else:
        model, spec = load_model(victim, device=device)
    cls = LocalExplanationOracle if explain else LocalOracle
    kwargs: dict[str, Any] = {"seed": seed} if explain else {}
    oracle = cls(
        model,
        spec.input_shape,
        num_classes=spec.num_classes,
        mode=mode,
        temperature=temperature,
        top_k=top_k,
        budget=budget,
        device=device,
        defences=defences,
        **kwargs,
    )
    from stealkit.progress import ledger_progress

    ledger_progress(oracle.ledger)
    extra = spec.extra or {}
    return Victim(
        oracle=oracle,
        input_shape=tuple(spec.input_shape),
        num_classes=spec.num_classes,
        dataset=dataset or extra.get("dataset"),
        split_seed=int(extra.get("split_seed", 0)),
        model=model,
        spec=spec,
        location=victim,
    )


def make_evaluator(victim: Victim, test_x: torch.Tensor, test_y: torch.Tensor, device: str = "cpu") -> Evaluator:
    """Evaluation on the test split; fidelity needs the victim's labels, computed without the ledger."""
    labels = predict_labels(victim.model, test_x, device=device) if victim.model is not None else None
    return Evaluator(test_x, test_y, labels, device=device)


def query_all(oracle: Oracle, x: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """Send ``x`` through the oracle in batches; every query is charged to its ledger."""
    outs = [oracle.query(x[i : i + batch_size]) for i in range(0, x.shape[0], batch_size)]
    return torch.cat(outs) if outs else torch.empty(0)


def affordable(oracle: Oracle, n: int, *, cost_per_item: int = 1) -> int:
    """How many of ``n`` items the oracle's remaining budget can pay for."""
    left = oracle.ledger.remaining()
    return n if left is None else max(0, min(n, left // max(1, cost_per_item)))


@dataclass
class ExtractionResult:
    """A stolen model and how it was got. ``queries`` are the ledger's counts, never arithmetic."""

    method: str
    student: nn.Module
    queries: dict[str, int]
    accuracy: float | None
    fidelity: float | None
    victim_accuracy: float | None
    curve: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The stable ``summary.json`` contract of every ``stealkit extract`` run."""
        return {
            "method": self.method,
            "queries": dict(self.queries),
            "accuracy": self.accuracy,
            "fidelity": self.fidelity,
            "victim_accuracy": self.victim_accuracy,
            "curve": self.curve,
            "stealkit_version": __version__,
            **self.extra,
        }


def curve_point(oracle: Oracle, evaluator: Evaluator, student: nn.Module, **extra: Any) -> dict[str, Any]:
    """One point of the accuracy-vs-queries curve, its query counts read from the ledger."""
    counts = oracle.ledger.as_dict()
    return {"queries": sum(counts.values()), **{f"queries_{k}": v for k, v in counts.items()},
            **evaluator(student), **extra}


def save_extraction(
    run: RunDir,
    result: ExtractionResult,
    victim: Victim,
    *,
    student_arch: str,
    student_kwargs: dict[str, Any] | None = None,
    seed: int,
    config: dict[str, Any],
) -> Path:
    """Write the student (safetensors + JSON), ``summary.json`` and ``report.html``; returns the student dir."""
    from stealkit.models import ModelSpec, save_model
    from stealkit.report.builders import build_report

    spec = ModelSpec(
        arch=student_arch,
        input_shape=tuple(victim.input_shape),
        num_classes=victim.num_classes,
        kwargs=dict(student_kwargs or {}),
        mean=_norm(result.student, "mean", victim.input_shape[0]),
        std=_norm(result.student, "std", victim.input_shape[0]),
        class_names=list(getattr(victim.spec, "class_names", []) or [str(i) for i in range(victim.num_classes)]),
        metrics={"accuracy": result.accuracy, "fidelity": result.fidelity},
        stealkit_version=__version__,
        extra={"dataset": victim.dataset, "stolen_from": victim.location, "method": result.method, "seed": seed},
    )
    student_dir = run.path / "student"
    save_model(result.student, spec, student_dir)
    notes = extraction_notes(result, victim)
    for note in notes:
        log.warning("%s", note)
    summary = result.summary() | {"seed": seed, "student_dir": str(student_dir), "config": config}
    if notes:
        summary["notes"] = notes
    run.write_summary(summary)
    run.write_report(build_report(run))
    return student_dir


#: what a data-free method was measured to need, for the chance-level note (sources named in each line)
_DATA_FREE_SCALE = {
    "dfme": "on the Fashion-MNIST CNN it reached 0.79x the victim only at 2M queries (docs/notebook/benchmarks.md)",
    "maze": "on the Fashion-MNIST CNN it reached 0.805x the victim at 500k queries (docs/notebook/benchmarks.md)",
    "dast": "CoDFe's Table 3 reports 0.75M-21.5M queries to its maximum",
    "codfe": "CoDFe's Table 3 reports 344k-475k queries to its maximum",
}


def extraction_notes(result: ExtractionResult, victim: Victim) -> list[str]:
    """One line for each thing the user must not miss: a budget that could not be spent, a chance-level copy."""
    notes = []
    ledger = victim.oracle.ledger if victim.oracle is not None else None
    budget = getattr(ledger, "budget", None)
    spent = sum(v for v in result.queries.values() if isinstance(v, int))
    if budget is not None and spent < budget:
        notes.append(f"{budget - spent:,} of the {budget:,}-query budget were not spent ({spent:,} used): the "
                     "query source or the method's schedule ran out first (a pool of distinct images is queried "
                     "once each)")
    if result.accuracy is not None and victim.num_classes > 1 and result.accuracy <= 1.5 / victim.num_classes:
        more = _DATA_FREE_SCALE.get(str(result.method).lower())
        notes.append(f"the copy is at chance level (accuracy {result.accuracy:.3f}, {victim.num_classes} classes)"
                     + (f"; {result.method}: {more}" if more else ""))
    return notes


def _norm(model: nn.Module, attr: str, channels: int) -> list[float]:
    for m in model.modules():
        if hasattr(m, attr) and isinstance(getattr(m, attr), torch.Tensor):
            return [float(v) for v in getattr(m, attr).flatten()]
    return [0.5] * channels


def student_factory(arch: str, victim: Victim, seed: int, **kwargs: Any) -> Callable[[], nn.Module]:
    """A function building a fresh, seeded student of ``arch`` shaped like the victim."""
    from stealkit.models import build_model

    def make() -> nn.Module:
        torch.manual_seed(seed)
        return build_model(arch, input_shape=victim.input_shape, num_classes=victim.num_classes, **kwargs)

    make()  # fail early on a bad architecture name or argument
    return make


def pool_holdout(pool: Any, *, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attacker pool (a split with ``x`` and ``y``) shuffled with ``seed`` and cut into the four fifths the attack
    may query and the last fifth held out with its true labels, to choose settings on without touching the test
    split: ``(x, y, x_val, y_val)`` (the benchmarks' ``--validate``, docs/notebook/surrogate-active.md)."""
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    cut = len(pool) * 4 // 5
    return pool.x[order[:cut]], pool.y[order[:cut]], pool.x[order[cut:]], pool.y[order[cut:]]


def victim_splits(victim: Victim, data_dir: str | Path | None = None) -> Any:
    """The victim task's splits (for the attacker pool and the test split)."""
    from stealkit.data import load_splits

    if not victim.dataset:
        raise InputError("the victim's data set is unknown: pass --dataset (e.g. digits, fashion-mnist)")
    splits = load_splits(victim.dataset, data_dir=data_dir, seed=victim.split_seed)
    if tuple(splits.test.input_shape) != tuple(victim.input_shape):
        raise InputError(
            f"--dataset {victim.dataset} has images of shape {splits.test.input_shape} but the victim takes "
            f"{victim.input_shape}; pass the data set the victim was trained for"
        )
    return splits
