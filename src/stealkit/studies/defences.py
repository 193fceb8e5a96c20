"""The defence table: what each output defence costs the victim's honest users and the extraction attacker.

For each defence (none, rounding, top-1, label only, reverse sigmoid, Gaussian noise): the victim's test
accuracy as served (the top-1 of the defended answer), and the accuracy and fidelity of the plain baseline
extraction (:mod:`stealkit.extract.surrogate_data.baseline`) at a fixed budget through a ``probs`` oracle wearing the defence,
over several attack seeds. The query stream is also run through PRADA to show whether the detector would have
flagged it. Run with ``stealkit defences``.

The victim is any victim the commands take but a remote one: a standard victim's name (``digits-conv2``, or
``standard:NAME``), a model directory, or an ONNX / TorchScript file (``FILE?input_shape=C,H,W`` where its
metadata lacks the shape), with its task's data set (``dataset``, read from the model where it says) and/or the
owner's labelled ``test_data`` and attacker ``pool`` (a query source, file or folder). Each defence is worn by
the victim's own answers, owner-side, as a ``stealkit serve`` key's defences are: an HTTP victim's answers are
its server's, so it is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.common import student_factory
from stealkit.extract.surrogate_data.baseline import BaselineConfig, extract_baseline
from stealkit.oracle import LocalOracle
from stealkit.oracle.victim import Target, Victim, make_evaluator
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
    """``victim``: a standard victim's name or ``standard:NAME``, a model directory or an ONNX/TorchScript file;
    ``dataset``: its task (default: what the model says); ``test_data``: the owner's labelled test split (a .npz
    or a folder, replacing the data set's); ``pool``: the baseline's query source (``pool``: the data set's
    attacker pool)."""

    victim: str = "digits-conv2"
    dataset: str | None = None
    data_dir: str | None = None
    test_data: str | None = None
    pool: str = "pool"
    budget: int = 300
    defences: tuple[str, ...] = DEFAULT_DEFENCES
    seeds: tuple[int, ...] = (0, 1, 2)
    student: str = "conv2"
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, batch_size=64))
    device: str = "cpu"


def _target(config: DefenceStudyConfig) -> Target:
    """The study's victim as a :class:`~stealkit.oracle.victim.Target`; a remote one refused in one line."""
    from stealkit.oracle.victim import is_url
    from stealkit.victims import RECIPES, standard_victim

    name = config.victim
    if is_url(name):
        raise InputError(f"defences: {name} is a remote victim; the study puts each defence on the victim's own "
                         "answers, owner-side, and an HTTP API's answers are its server's: give the model file or "
                         "directory, or measure the served key with stealkit audit")
    if name.startswith("standard:") or name in RECIPES:
        name = str(standard_victim(name.removeprefix("standard:"), device=config.device).path)
    return Target(name, dataset=config.dataset, data_dir=config.data_dir, device=config.device,
                  test_data=config.test_data)


def _data(v: Victim, config: DefenceStudyConfig) -> tuple[Any, torch.Tensor]:
    """The test split (the owner's with ``test_data``) and the attacker's pool: the data set's attacker pool in
    its stored order for ``pool`` (the study's figures before any other victim was taken), else the query
    source's images (a synthetic one: the budget's worth)."""
    from stealkit.data import load_query_source, parse_source
    from stealkit.oracle.victim import victim_splits, victim_test

    test = victim_test(v, config.data_dir)
    if parse_source(config.pool).name == "pool":
        return test, victim_splits(v, config.data_dir).attacker_pool.x
    synthetic = parse_source(config.pool).is_synthetic
    pool = load_query_source(config.pool, input_shape=v.input_shape, n=config.budget if synthetic else None,
                             seed=config.seeds[0], data_dir=config.data_dir, victim_dataset=v.dataset,
                             split_seed=v.split_seed)
    return test, pool


def run_defence_study(config: DefenceStudyConfig, on_row: Any = None) -> dict[str, Any]:
    """Returns ``{"rows": [...], "prada": {...}, "victim_accuracy": ...}``; one row per defence."""
    from stealkit.metrics import accuracy
    from stealkit.oracle.victim import own_data

    for name in config.defences:  # a bad spec is refused before the victim is opened
        if name != "none":
            parse_defence(name)
    target = _target(config)
    opened = target.open(mode="probs", budget=0)
    model = opened.model
    assert model is not None  # a local victim
    model.eval()
    test, pool = _data(opened, config)
    records, _ = own_data(opened, {"--pool": config.pool}, config.data_dir)
    rows = []
    for name in config.defences:
        defence = None if name == "none" else parse_defence(name)
        accs, fids, queries = [], [], []
        for seed in config.seeds:
            oracle = LocalOracle(model, opened.input_shape, num_classes=opened.num_classes, mode="probs",
                                 budget=config.budget, defences=[defence] if defence else [], device=config.device)
            victim = dataclasses.replace(opened, oracle=oracle)
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
    return {"victim": config.victim, "victim_accuracy": accuracy(model, test.x, test.y, device=config.device),
            "rows": rows, "prada": prada, "budget": config.budget, **({"own_data": records} if records else {})}


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
