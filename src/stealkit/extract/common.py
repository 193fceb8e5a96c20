"""What every extraction method shares: metered batch querying, results (:class:`ExtractionResult`, a runner's
:class:`ExtractionRun`) and records. The victim handle lives in :mod:`stealkit.oracle.victim` (re-exported here)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit import __version__
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle
from stealkit.oracle.victim import Victim, is_url, make_evaluator, open_victim, victim_splits
from stealkit.rundir import RunDir

__all__ = ["ExtractionResult", "ExtractionRun", "Victim", "affordable", "curve_point", "extraction_notes",
           "is_url", "make_evaluator", "open_victim", "pool_holdout", "query_all", "save_extraction",
           "student_factory", "victim_splits"]

log = logging.getLogger(__name__)


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


@dataclass
class ExtractionRun:
    """What a runner returns: the run directory, the result it saved there, and the opened victim (its oracle's
    ledger; the model of a local victim)."""

    path: Path
    result: ExtractionResult
    victim: Victim = field(repr=False)
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # what config.json's "config" holds
    preset_resolved: str | None = None

    @property
    def queries(self) -> dict[str, int]:
        """The ledger's counts by kind."""
        return dict(self.victim.oracle.ledger.as_dict())

    @property
    def accuracy(self) -> float | None:
        return self.result.accuracy

    @property
    def fidelity(self) -> float | None:
        return self.result.fidelity

    @property
    def victim_accuracy(self) -> float | None:
        return self.result.victim_accuracy

    @property
    def student(self) -> nn.Module:
        return self.result.student


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
    report: bool = True,
) -> Path:
    """Write the student (safetensors + JSON), ``summary.json`` and (``report``) ``report.html``; returns the
    student dir."""
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
        extra={"dataset": victim.dataset, "stolen_from": victim.location, "method": result.method, "seed": seed,
               # a feature-vector copy takes points of [0, 1]^d: the ranges that map them onto features
               **({"feature_ranges": {"lo": list(victim.features.lo), "hi": list(victim.features.hi),
                                      "source": victim.features.source}} if victim.features is not None else {})},
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
    if report:
        run.write_report(build_report(run))
    return student_dir


#: what a data-free method was measured to need, for the chance-level note (sources named in each line)
_DATA_FREE_SCALE = {
    "dfme": "on the Fashion-MNIST CNN it reached 0.79x the victim only at 2M queries (docs/results.md#datafree-fmnist-test)",
    "maze": "on the Fashion-MNIST CNN it reached 0.805x the victim at 500k queries (docs/results.md#datafree-fmnist-test)",
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
    split: ``(x, y, x_val, y_val)`` (the benchmarks' ``--validate``, docs/guide/surrogate.md)."""
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    cut = len(pool) * 4 // 5
    return pool.x[order[:cut]], pool.y[order[:cut]], pool.x[order[cut:]], pool.y[order[cut:]]
