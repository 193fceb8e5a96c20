"""The plain extraction baseline: label a pool through the oracle, train a student on the answers.

This is the simplest member of the surrogate-data family (Papernot et al. 2017; Orekondy et al. 2019's random
policy): no adaptive sampling, no temperature. It answers "how good a copy does budget N buy?" and is what
the demo runs. The loss follows the oracle's output: cross-entropy on labels, soft cross-entropy (KL) on
probabilities, top-k or softmaxed logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.common import ExtractionResult, affordable, curve_point, query_all
from stealkit.extract.losses import loss_for_mode
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle
from stealkit.train import TrainConfig, fit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaselineConfig:
    """``checkpoints``: budgets at which a student is trained and scored (the curve); the last is final."""

    checkpoints: tuple[int, ...]
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, batch_size=64))
    query_batch: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.checkpoints or any(c < 1 for c in self.checkpoints):
            raise InputError(f"checkpoints must be positive query counts, got {self.checkpoints}")


def extract_baseline(
    oracle: Oracle,
    pool: torch.Tensor,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator,
    config: BaselineConfig,
    on_point: Callable[[dict[str, object]], None] | None = None,
    device: str = "cpu",
) -> ExtractionResult:
    """Query a seeded shuffle of ``pool`` incrementally up to each checkpoint and train a fresh student (on
    ``device``; the pool and the answers stay where they are, each batch follows the student).

    Queries already answered are reused by later checkpoints, so the final ledger count is the largest
    checkpoint (or the pool size, or what the budget allowed, whichever is smallest).
    """
    gen = torch.Generator().manual_seed(config.seed)
    pool = pool[torch.randperm(pool.shape[0], generator=gen)]
    wanted = sorted(set(config.checkpoints))
    if wanted[-1] > pool.shape[0]:
        log.warning("pool has %d images; checkpoints above that are capped", pool.shape[0])
    loss_fn = loss_for_mode(oracle.mode.value)
    answers: list[torch.Tensor] = []
    n_done = 0
    curve: list[dict[str, object]] = []
    student: nn.Module | None = None
    for target in wanted:
        target = min(target, pool.shape[0])
        n_new = affordable(oracle, target - n_done)
        if n_new > 0:
            answers.append(query_all(oracle, pool[n_done : n_done + n_new], batch_size=config.query_batch))
            n_done += n_new
        if n_done == 0:
            raise InputError("the oracle's budget allows no query at all; raise --budget")
        if curve and curve[-1]["n_train"] == n_done:
            continue  # budget or pool ran out: nothing new to learn from
        y = torch.cat(answers)
        student = make_student()
        fit(student, pool[:n_done], y, config.train, loss_fn=loss_fn, desc=f"student@{n_done}", device=device)
        point = curve_point(oracle, evaluator, student, n_train=n_done)
        curve.append(point)
        fid = "-" if point["fidelity"] is None else f"{point['fidelity']:.3f}"
        log.debug("%s queries: accuracy %.3f, fidelity %s", f"{point['queries']:,}", point["accuracy"], fid)
        if on_point is not None:
            on_point(point)
    assert student is not None
    final = curve[-1]
    return ExtractionResult(
        method="baseline",
        student=student,
        queries=oracle.ledger.as_dict(),
        accuracy=final["accuracy"],  # type: ignore[arg-type]
        fidelity=final["fidelity"],  # type: ignore[arg-type]
        victim_accuracy=evaluator.victim_accuracy,
        curve=curve,
        extra={"mode": oracle.mode.value},
    )
