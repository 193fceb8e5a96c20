"""DFME appendix B and D on our victims: how good are recovered logits, and does Hypothesis 1 hold?

* **Logit recovery (B, and the claim of the main paper's Section 6.3).** ``log p - mean(log p)`` equals the
  true logits minus their per-image mean; the paper argues that mean is negligible against the logits
  themselves. :func:`logit_recovery_study` measures, per victim and per input distribution (test images and
  Gaussian noise), the mean |logit|, the spread over classes, |mean logit| (the recovery error in exact
  arithmetic), the error of logits recovered from the float32 probabilities an API returns, and how often a
  probability underflowed.
* **Hypothesis 1 (D).** :func:`hypothesis1_study` trains a student by surrogate-data extraction and, before
  training and after every epoch, measures ``||grad_x L_KL||`` and ``||grad_x L_l1||`` on a fixed sample of the
  queried images (white-box, through both networks, as in D.2; no query is spent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stealkit.errors import InputError
from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
from stealkit.extract.kl_gradients import GradientPoint, measure, verdict
from stealkit.extract.logit_recovery import recovery_error
from stealkit.extract.surrogate import SurrogateConfig, extract_surrogate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogitStudyConfig:
    victims: tuple[str, ...] = ("fmnist-conv2", "digits-conv2", "digits-mlp2", "digits-logistic")
    n_noise: int = 2000
    temperature: float = 1.0
    seed: int = 0
    data_dir: str | None = None
    device: str = "cpu"


def logit_recovery_study(config: LogitStudyConfig) -> list[dict[str, Any]]:
    """One row per (victim, input set) with the statistics of :func:`recovery_error`."""
    from stealkit.data import load_query_source
    from stealkit.metrics import predict_logits
    from stealkit.victims import standard_victim

    rows = []
    for name in config.victims:
        trained = standard_victim(name, data_dir=config.data_dir, device=config.device)
        v = open_victim(trained.path, mode="probs", temperature=config.temperature, device=config.device)
        splits = victim_splits(v, config.data_dir)
        inputs = {"test": splits.test.x,
                  "gaussian": load_query_source("gaussian", input_shape=v.input_shape, n=config.n_noise,
                                                seed=config.seed)}
        for what, x in inputs.items():
            assert v.model is not None
            logits = predict_logits(v.model, x, device=config.device) / config.temperature
            probs = v.oracle.query(x)  # float32, exactly what the API returns
            stats = recovery_error(logits, probs)
            stats["mean_over_spread"] = stats["abs_mean"] / max(stats["spread"], 1e-12)
            stats["error_over_abs_logit"] = stats["l1_error"] / max(stats["abs_logit"], 1e-12)
            rows.append({"victim": name, "inputs": what, "n": int(x.shape[0]), **stats})
            log.info("%s", rows[-1])
    return rows


@dataclass(frozen=True)
class Hypothesis1Config:
    victims: tuple[str, ...] = ("fmnist-conv2", "digits-conv2")
    losses: tuple[str, ...] = ("kl", "l1")
    max_distinct: dict[str, int] | None = None  # per victim; default 2000 (fashion-mnist), 400 (digits)
    epochs: int = 10
    n_measure: int = 256
    tau: float = 1.0
    seed: int = 0
    data_dir: str | None = None
    device: str = "cpu"

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
            traces[key] = _trace(str(trained.path), name, loss, key, config, on_point)
            points = [GradientPoint(**{k: p[k] for k in GradientPoint.__dataclass_fields__}) for p in traces[key]]
            verdicts[key] = verdict(points)
            log.info("%s: %s", key, verdicts[key])
    return {"traces": traces, "verdicts": verdicts}


def _trace(victim_dir: str, name: str, loss: str, key: str, config: Hypothesis1Config,
           on_point: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    from stealkit.data import load_query_source

    cap = config.cap(name)
    v = open_victim(victim_dir, mode="probs", budget=cap, device=config.device)
    assert v.model is not None
    victim_model = v.model
    splits = victim_splits(v, config.data_dir)
    evaluator = make_evaluator(v, splits.test.x, splits.test.y, config.device)
    pool = load_query_source("pool", input_shape=v.input_shape, n=cap, seed=config.seed, victim_dataset=v.dataset,
                             data_dir=config.data_dir, split_seed=v.split_seed)
    x_measure = pool[: config.n_measure]  # all of these are queried (the cap covers the pool)
    points: list[dict[str, Any]] = []

    def record(epoch: int, student: torch.nn.Module, _rec: dict[str, float] | None = None) -> None:
        p = measure(victim_model, student, x_measure, epoch=epoch, tau=config.tau).as_dict()
        p |= {"key": key} | evaluator(student)
        points.append(p)
        if on_point is not None:
            on_point(p)

    make = student_factory("conv2", v, config.seed)
    record(0, make().to(config.device))  # the same initial weights the trained student starts from
    sc = SurrogateConfig(max_distinct=cap, loss=loss, tau=config.tau, epochs=config.epochs,  # type: ignore[arg-type]
                         batch_size=64 if cap < 1000 else 128, seed=config.seed)
    extract_surrogate(v.oracle, pool, make_student=make, config=sc, evaluator=None, on_epoch=record,
                      device=config.device)
    return points
