"""DFME appendix D, Hypothesis 1: does the KL loss's input gradient vanish relative to l1's?

:func:`hypothesis1_study` trains a student by surrogate-data extraction and, before training and after every
epoch, measures ``||grad_x L_KL||`` and ``||grad_x L_l1||`` on a fixed sample of the queried images (white-box,
through both networks, as in D.2; no query is spent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.common import student_factory
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle.victim import make_evaluator, open_victim, victim_splits
from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir
from stealkit.studies.kl_gradients import measure

log = logging.getLogger(__name__)

NAME = "dfme-hypothesis1"
KIND = "study dfme-hypothesis1"
SOURCE = "Truong et al. (CVPR 2021), appendix D, Hypothesis 1"

#: the verdict's threshold: Hypothesis 1 holds for a student if, from its first to its last measurement, the
#: median ratio ||grad KL|| / ||grad l1|| falls by at least this factor in every seed. A ratio that is merely
#: small from the start (it is 0.01-0.03 at initialisation on our victims) does not count.
FALL_FACTOR = 2.0

#: the paper's Hypothesis 1 (App. D), qualitative: no number is given
PAPER = {"hypothesis": "||grad_x L_KL|| << ||grad_x L_l1|| as the student S converges to the victim V"}


@dataclass(frozen=True)
class Hypothesis1Config:
    victims: tuple[str, ...] = ("fmnist-conv2", "digits-conv2")
    losses: tuple[str, ...] = ("kl", "l1")
    max_distinct: dict[str, int] | None = None  # per victim; default 2000 (fashion-mnist), 400 (digits)
    epochs: int = 10
    n_measure: int = 256
    tau: float = 1.0
    seed: int = 0
    repeats: int = 3  # students per (victim, loss), seeds seed .. seed + repeats - 1
    data_dir: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise InputError(f"repeats must be at least 1, got {self.repeats}")

    def cap(self, victim: str) -> int:
        caps = self.max_distinct or {}
        return caps.get(victim, 400 if victim.startswith("digits") else 2000)


def hypothesis1_study(config: Hypothesis1Config,
                      on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train one student per (victim, student loss) and trace the gradient-norm ratio along training."""
    from stealkit.victims import standard_victim

    for loss in config.losses:
        if loss not in ("kl", "l1"):
            raise InputError(f"hypothesis 1 students train with kl or l1, got {loss!r}")
    traces: dict[str, list[dict[str, Any]]] = {}
    verdicts: dict[str, Any] = {}
    for name in config.victims:
        trained = standard_victim(name, data_dir=config.data_dir, device=config.device)
        for loss in config.losses:
            key = f"{name} / student loss {loss}"
            falls = []
            for seed in range(config.seed, config.seed + config.repeats):
                run_key = key if seed == config.seed else f"{key} / seed {seed}"
                traces[run_key] = _trace(str(trained.path), name, loss, run_key, seed, config, on_point)
                falls.append(fall(traces[run_key]))
            verdicts[key] = verdict_over_seeds(falls)
            log.info("%s: %s", key, fmt.record(verdicts[key]))
    return {"traces": traces, "verdicts": verdicts, "fall_factor": FALL_FACTOR}


def fall(trace: list[dict[str, Any]]) -> dict[str, float]:
    """First and last median ratio of one student's trace and how far it fell (first / last)."""
    first, last = float(trace[0]["ratio"]), float(trace[-1]["ratio"])
    return {"first_ratio": first, "last_ratio": last, "fall": first / max(last, 1e-30)}


def verdict_over_seeds(falls: list[dict[str, float]], *, factor: float = FALL_FACTOR) -> dict[str, Any]:
    """Hypothesis 1 on one (victim, student loss): the ratio fell by ``factor`` or more in every seed.

    Returns the mean and spread (population std) over seeds of the fall and of the first and last ratios.
    """
    values = [f["fall"] for f in falls]

    def mean_std(xs: list[float]) -> tuple[float, float]:
        m = sum(xs) / len(xs)
        return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5

    fall_mean, fall_std = mean_std(values)
    return {"holds": all(v >= factor for v in values), "fall_factor": factor, "falls": values,
            "fall_mean": fall_mean, "fall_std": fall_std, "seeds": len(values),
            "first_ratio": mean_std([f["first_ratio"] for f in falls])[0],
            "last_ratio": mean_std([f["last_ratio"] for f in falls])[0]}


def _trace(victim_dir: str, name: str, loss: str, key: str, seed: int, config: Hypothesis1Config,
           on_point: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    from stealkit.data import load_query_source

    cap = config.cap(name)
    v = open_victim(victim_dir, mode="probs", budget=cap, device=config.device)
    assert v.model is not None
    victim_model = v.model
    splits = victim_splits(v, config.data_dir)
    evaluator = make_evaluator(v, splits.test.x, splits.test.y, config.device)
    pool = load_query_source("pool", input_shape=v.input_shape, n=cap, seed=seed, victim_dataset=v.dataset,
                             data_dir=config.data_dir, split_seed=v.split_seed)
    x_measure = pool[: config.n_measure]  # all of these are queried (the cap covers the pool)
    points: list[dict[str, Any]] = []

    def record(epoch: int, student: torch.nn.Module, _rec: dict[str, float] | None = None) -> None:
        p = measure(victim_model, student, x_measure, epoch=epoch, tau=config.tau).as_dict()
        p |= {"key": key} | evaluator(student)
        points.append(p)
        if on_point is not None:
            on_point(p)

    make = student_factory("conv2", v, seed)
    record(0, make().to(config.device))  # the same initial weights the trained student starts from
    sc = SurrogateConfig(max_distinct=cap, loss=loss, tau=config.tau, epochs=config.epochs,  # type: ignore[arg-type]
                         batch_size=64 if cap < 1000 else 128, seed=seed)
    extract_surrogate(v.oracle, pool, make_student=make, config=sc, evaluator=None, on_epoch=record,
                      device=config.device)
    return points


Config = Hypothesis1Config


def run(config: Hypothesis1Config, *, on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Traces of the gradient-norm ratio per (victim, student loss) and the verdict on each."""
    return hypothesis1_study(config, on_point=on_record)


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    traces = summary.get("traces", {})
    series = {k: ([p["epoch"] for p in pts], [p["ratio"] for p in pts]) for k, pts in traces.items()}
    uri = line_plot(series, xlabel="epoch (0 = before training)", ylabel="median ||grad KL|| / ||grad l1||")
    verdicts = [{"run": k, **v} for k, v in summary.get("verdicts", {}).items()]
    rows = [p for pts in traces.values() for p in pts]
    return [Section("Hypothesis 1: KL vs l1 input gradients", paragraphs=[
        "Median over 256 queried images of the ratio of input-gradient norms, measured through both networks "
        "(D.2's losses, summed over classes), one student per seed. Hypothesis 1 holds for a (victim, student "
        f"loss) if the ratio falls by a factor of at least {summary.get('fall_factor', FALL_FACTOR):g} from "
        "before training to the end of training in every seed (a ratio that is small from the start does not "
        "count). The students trained with l1 are the control: the hypothesis is about the student converging "
        "to the victim, whichever loss trains it."], tables=[("verdicts (fall = first ratio / last ratio)",
                                                              verdicts), ("trace", rows)],
        figures=[Figure(uri, "||grad_x L_KL|| / ||grad_x L_l1|| against training progress")])]
