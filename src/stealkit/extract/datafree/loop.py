"""The loop that runs every data-free attack (DFME, MAZE, DaST, CoDFe) against an oracle.

:func:`run_datafree` drives a :class:`~stealkit.extract.datafree.attack.DataFreeAttack` until the budget cannot
pay for another iteration, scores the student on the test split at fixed query marks (the accuracy-against-
queries curve) and records the losses per round (CoDFe Figure 3). With a checkpoint directory it saves the
attack's full state (:mod:`stealkit.extract.datafree.checkpoint`) and journals every answer in between
(:mod:`stealkit.extract.journal`), so a resumed run ends as an uninterrupted one would, without spending any
query twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.common import ExtractionResult, curve_point
from stealkit.extract.datafree.attack import DataFreeAttack
from stealkit.extract.datafree.checkpoint import load_checkpoint, save_checkpoint
from stealkit.extract.journal import JournalOracle
from stealkit.fsutil import to_jsonable
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle
from stealkit.progress import note, progress

log = logging.getLogger(__name__)


@dataclass
class DataFreeResult(ExtractionResult):
    """An :class:`ExtractionResult` that also carries generator samples for the report (not in the summary)."""

    samples: torch.Tensor | None = None


@dataclass(frozen=True)
class LoopConfig:
    """How the shared loop runs a data-free attack.

    ``eval_every``: score the student every this many victim queries (plus at each of ``eval_at``);
    ``checkpoint_every``: iterations between checkpoints (0: never; needs a checkpoint directory);
    ``log_every``: iterations averaged into one loss record (``None``: about 200 records per run);
    ``max_iterations``: stop earlier than the budget; ``grid_samples``: generator samples in the report.
    """

    eval_every: int = 50_000
    eval_at: tuple[int, ...] = ()
    checkpoint_every: int = 100
    log_every: int | None = None
    max_iterations: int | None = None
    grid_samples: int = 32

    def __post_init__(self) -> None:
        if self.eval_every < 1:
            raise InputError(f"eval_every must be a positive number of queries, got {self.eval_every}")
        if self.checkpoint_every < 0:
            raise InputError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.max_iterations is not None and self.max_iterations < 1:
            raise InputError(f"max_iterations must be positive, got {self.max_iterations}")


def planned_iterations(attack: DataFreeAttack, oracle: Oracle, loop: LoopConfig) -> int:
    left = oracle.ledger.remaining()
    cost = attack.iteration_cost()
    if left is None and loop.max_iterations is None:
        raise InputError("an unlimited oracle needs max_iterations (or give the oracle a --budget)")
    n = loop.max_iterations if left is None else left // cost
    if loop.max_iterations is not None:
        n = min(n, loop.max_iterations)
    if n < 1:
        raise InputError(f"one {attack.name} iteration costs {cost} queries but the budget allows only {left}; "
                         "raise --budget or lower the batch size")
    return int(n)


def _eval_marks(loop: LoopConfig, total_queries: int) -> list[int]:
    marks = set(range(loop.eval_every, total_queries + 1, loop.eval_every)) | {m for m in loop.eval_at if m > 0}
    return sorted(marks)


def scored_point(attack: DataFreeAttack, oracle: Oracle, evaluator: Evaluator, earlier: list[dict[str, Any]],
                 **extra: Any) -> dict[str, Any]:
    """A curve point for the reported student, plus (for the report only, never for selection) the test
    accuracy of every candidate student and the gap, in points, between the best student seen at this or any
    earlier mark (best in hindsight) and the reported one."""
    point = curve_point(oracle, evaluator, attack.reported(), **extra)
    cands = attack.candidates()
    if len(cands) > 1 or next(iter(cands.values())) is not attack.reported():
        scores = {name: evaluator(m)["accuracy"] for name, m in cands.items()}
        best = max([point["accuracy"], *scores.values(),
                    *(p.get("best_in_hindsight", p["accuracy"]) for p in earlier)])
        point.update(candidates=scores, best_in_hindsight=best,
                     selection_gap_points=round(100 * (best - point["accuracy"]), 2))
    return point


def run_datafree(
    attack: DataFreeAttack,
    oracle: Oracle,
    *,
    evaluator: Evaluator | None,
    loop: LoopConfig,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
    config: dict[str, Any] | None = None,
) -> DataFreeResult:
    """Run ``attack`` against ``oracle`` until the budget (or ``max_iterations``) is spent.

    With ``checkpoint_dir`` the state is saved every ``loop.checkpoint_every`` iterations and at the end, and
    every answer is journalled; ``resume=True`` continues from the saved state (see the module docstring).
    """
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume and ckpt is None:
        raise InputError("resuming needs the checkpoint directory of the stopped run")
    state: dict[str, Any] = {"iteration": 0, "curve": [], "losses": [], "planned": None, "elapsed": 0.0,
                             "config": to_jsonable(config or {})}
    journal: Path | None = None
    if resume and ckpt is not None and (ckpt / "checkpoint.json").exists():
        meta = load_checkpoint(ckpt, attack, oracle.ledger)
        if config is not None and meta.get("config") not in (None, to_jsonable(config)):
            raise InputError(f"the checkpoint in {ckpt} was made with a different configuration; resume with the "
                             "same options, or start a new run in another --out")
        state.update({k: meta[k] for k in ("iteration", "curve", "losses", "planned", "elapsed") if k in meta})
        journal = ckpt / meta["journal"]
        log.info("resumed %s at iteration %d (%s queries)", attack.name, state["iteration"],
                 fmt.queries(oracle.ledger.as_dict()))
    elif resume:
        log.warning("no checkpoint in %s yet: starting afresh", ckpt)
    if state["planned"] is None:
        state["planned"] = planned_iterations(attack, oracle, loop)
    planned = int(state["planned"])
    cost = attack.iteration_cost()
    journaled = JournalOracle(oracle)
    if ckpt is not None:
        if journal is None:
            _, journal = save_checkpoint(ckpt, attack, state, oracle.ledger)
        journaled.open(journal, replay=True)
    log_every = loop.log_every or max(1, planned // 200)
    counted = sum(oracle.ledger.as_dict().values())
    marks = [m for m in _eval_marks(loop, counted + cost * (planned - state["iteration"]))
             if not state["curve"] or m > state["curve"][-1]["queries"]]
    acc: dict[str, list[float]] = {}
    started = time.perf_counter() - float(state["elapsed"])
    bar = progress(total=planned, initial=state["iteration"], desc=attack.name, unit="it")
    try:
        while state["iteration"] < planned:
            left = oracle.ledger.remaining()
            if left is not None and left < cost:
                break
            losses = attack.step(journaled.query, state["iteration"] / planned)
            state["iteration"] += 1
            bar.update(1)
            for k, v in losses.items():
                acc.setdefault(k, []).append(v)
            if state["iteration"] % log_every == 0 or state["iteration"] == planned:
                rec = {"iteration": state["iteration"], "queries": sum(oracle.ledger.as_dict().values()),
                       **{k: float(np.mean(v)) for k, v in acc.items()}}
                state["losses"].append(rec)
                acc = {}
                if on_losses is not None:
                    on_losses(rec)
                note(bar, **dict(list({k: f"{v:.3g}" for k, v in rec.items()  # the first two losses: a bar fits a line
                                       if k not in ("iteration", "queries")}.items())[:2]))
            total = sum(oracle.ledger.as_dict().values())
            if marks and total >= marks[0] and evaluator is not None:
                while marks and total >= marks[0]:
                    marks.pop(0)
                point = scored_point(attack, oracle, evaluator, state["curve"], iteration=state["iteration"],
                                     seconds=round(time.perf_counter() - started, 2))
                state["curve"].append(point)
                log.info("%s: %s queries, accuracy %s", attack.name, fmt.queries(total), fmt.figure(point["accuracy"]))
                if on_point is not None:
                    on_point(point)
            if ckpt is not None and loop.checkpoint_every and state["iteration"] % loop.checkpoint_every == 0:
                state["elapsed"] = time.perf_counter() - started
                _, journal = save_checkpoint(ckpt, attack, state, oracle.ledger)
                journaled.open(journal, replay=False)
    finally:
        bar.close()
        journaled.close()
    total = sum(oracle.ledger.as_dict().values())
    if evaluator is not None and (not state["curve"] or state["curve"][-1]["queries"] != total):
        point = scored_point(attack, oracle, evaluator, state["curve"], iteration=state["iteration"],
                             seconds=round(time.perf_counter() - started, 2))
        state["curve"].append(point)
        if on_point is not None:
            on_point(point)
    state["elapsed"] = time.perf_counter() - started
    if ckpt is not None:
        save_checkpoint(ckpt, attack, state, oracle.ledger)
    final = state["curve"][-1] if state["curve"] else {"accuracy": None, "fidelity": None}
    samples = attack.sample_images(loop.grid_samples) if loop.grid_samples > 0 else None
    return DataFreeResult(
        method=attack.name,
        student=attack.reported(),
        queries=oracle.ledger.as_dict(),
        accuracy=final["accuracy"],
        fidelity=final["fidelity"],
        victim_accuracy=evaluator.victim_accuracy if evaluator is not None else None,
        curve=state["curve"],
        extra={"mode": attack.mode.value, "iterations": state["iteration"], "planned_iterations": planned,
               "cost_per_iteration": cost, "losses": state["losses"], "seconds": round(state["elapsed"], 2),
               "replayed_queries": journaled.replayed},
        samples=samples,
    )
