"""The defence table: what each output defence costs the victim's honest users and the extraction attacker.

For each defence (none, rounding, top-1, label only, reverse sigmoid, Gaussian noise): the victim's test
accuracy as served (the top-1 of the defended answer), and the accuracy and fidelity of the plain baseline
extraction (:mod:`stealkit.extract.surrogate_data.baseline`) at a fixed budget through a ``probs`` oracle wearing the defence,
over several attack seeds. The query stream is also run through PRADA to show whether the detector would have
flagged it. Run with ``stealkit defences``.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stealkit import fmt
from stealkit.extract.common import student_factory
from stealkit.extract.surrogate_data.baseline import BaselineConfig, extract_baseline
from stealkit.oracle import LocalOracle
from stealkit.oracle.victim import Victim, make_evaluator
from stealkit.report.html import Section
from stealkit.rundir import RunDir
from stealkit.serve.defences import parse_defence, served_accuracy, served_calibration  # noqa: F401 (re-exported)
from stealkit.serve.detection import Prada, PradaConfig
from stealkit.train import TrainConfig

log = logging.getLogger(__name__)

NAME = "defences"
KIND = "defences"
#: no paper table: the defences are stealkit's own comparison
PAPER: dict[str, object] = {}
SOURCE = "stealkit's own study of output defences (no paper table; PRADA: Juuti et al. 2019)"

DEFAULT_DEFENCES = ("none", "round:decimals=2", "round:decimals=1", "topk:k=1", "label",
                    "reverse_sigmoid:beta=1.0,gamma=0.1", "reverse_sigmoid:beta=0.5,gamma=0.5",
                    "noise:sigma=0.05", "noise:sigma=0.2")


@dataclass(frozen=True)
class DefenceStudyConfig:
    victim: str = "digits-conv2"
    budget: int = 300
    defences: tuple[str, ...] = DEFAULT_DEFENCES
    seeds: tuple[int, ...] = (0, 1, 2)
    student: str = "conv2"
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, batch_size=64))
    device: str = "cpu"


def run_defence_study(config: DefenceStudyConfig, on_row: Any = None) -> dict[str, Any]:
    """Returns ``{"rows": [...], "prada": {...}, "victim_accuracy": ...}``; one row per defence."""
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    trained = standard_victim(config.victim, device=config.device)
    model, spec = trained.model.eval(), trained.spec
    extra = spec.extra or {}
    splits = load_splits(extra["dataset"], seed=int(extra.get("split_seed", 0)))
    test, pool = splits.test, splits.attacker_pool.x
    rows = []
    for name in config.defences:
        defence = None if name == "none" else parse_defence(name)
        accs, fids, queries = [], [], []
        for seed in config.seeds:
            oracle = LocalOracle(model, spec.input_shape, mode="probs", budget=config.budget,
                                 defences=[defence] if defence else [], device=config.device)
            victim = Victim(oracle=oracle, input_shape=tuple(spec.input_shape), num_classes=spec.num_classes,
                            dataset=extra["dataset"], model=model, spec=spec)
            train = TrainConfig(**{**config.train.to_dict(), "seed": seed})
            result = extract_baseline(oracle, pool, make_student=student_factory(config.student, victim, seed),
                                      evaluator=make_evaluator(victim, test.x, test.y, config.device),
                                      config=BaselineConfig(checkpoints=(config.budget,), train=train, seed=seed),
                                      device=config.device)
            accs.append(result.accuracy)
            fids.append(result.fidelity)
            queries.append(result.queries["predict"])
        row = {
            "defence": name,
            "served_accuracy": round(served_accuracy(model, defence, test.x, test.y), 4),
            "queries": queries[0],
            "extraction_accuracy_mean": round(statistics.mean(accs), 4),
            "extraction_accuracy_std": round(statistics.pstdev(accs), 4),
            "fidelity_mean": round(statistics.mean(fids), 4),
            "seeds": list(config.seeds),
            "per_seed_accuracy": [round(a, 4) for a in accs],
        }
        rows.append(row)
        log.info("%s", fmt.record(row))
        if on_row is not None:
            on_row(row)
    prada = _prada_on_pool(model, pool, config)
    return {"victim": config.victim, "victim_accuracy": trained.metrics.get("test_accuracy"), "rows": rows,
            "prada": prada, "budget": config.budget}


def _prada_on_pool(model: torch.nn.Module, pool: torch.Tensor, config: DefenceStudyConfig) -> dict[str, Any]:
    """PRADA on the baseline's query stream (seed 0's shuffle of the pool, first ``budget`` images)."""
    gen = torch.Generator().manual_seed(config.seeds[0])
    x = pool[torch.randperm(pool.shape[0], generator=gen)][: config.budget]
    det = Prada(PradaConfig())
    from stealkit.device import module_device

    with torch.inference_mode():
        labels = model(x.to(module_device(model))).argmax(1).cpu()
    for i in range(0, x.shape[0], 256):
        det.update(x[i : i + 256], labels[i : i + 256])
    return {"delta": det.config.delta, "statistic": det.statistic, "flagged": det.flagged,
            "distances": det.state.n_distances}


Config = DefenceStudyConfig


def run(config: DefenceStudyConfig, *, on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One row per defence (served accuracy, extraction accuracy over seeds) and PRADA on the pool."""
    return run_defence_study(config, on_row=on_record)


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    rows = [{k: r[k] for k in ("defence", "served_accuracy", "queries", "extraction_accuracy_mean",
                               "extraction_accuracy_std", "fidelity_mean")} for r in summary.get("rows", [])]
    prada = summary.get("prada") or {}
    return [
        Section("Defences against extraction",
                paragraphs=[f"Victim {summary.get('victim')} (test accuracy {summary.get('victim_accuracy')}); "
                            f"baseline extraction at {summary.get('budget')} queries through each defence."],
                tables=[("served accuracy = top-1 of the defended answer on the test split", rows)]),
        Section("PRADA on the baseline's queries", tables=[("", [prada])] if prada else []),
    ]
