"""DFME appendix B (and the main paper's Section 6.3): how good are logits recovered from probabilities?

``log p - mean(log p)`` equals the true logits minus their per-image mean; the paper argues that mean is negligible
against the logits themselves. :func:`logit_recovery_study` measures, per victim and per input distribution (test
images and Gaussian noise), the mean |logit|, the spread over classes, |mean logit| (the recovery error in exact
arithmetic), the error of logits recovered from the float32 probabilities an API returns, and how often a
probability underflowed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stealkit import fmt
from stealkit.extract.logit_recovery import recovery_error
from stealkit.oracle.victim import open_victim, victim_splits
from stealkit.report.html import Section
from stealkit.rundir import RunDir

log = logging.getLogger(__name__)

NAME = "dfme-logits"
KIND = "study dfme-logits"
SOURCE = "Truong et al. (CVPR 2021), Section 6.3 and appendix B"

#: the claim holds on a row if the l1 error of the recovered logits is below this share of the mean |logit|: the
#: per-image constant is then negligible against the logits. The centred error (float rounding) can't fail this.
ERROR_BOUND = 0.1

#: the paper's claim (Sec. 6.3, App. B), qualitative: no number is given
PAPER = {"claim": "log p - mean(log p) recovers the logits up to a per-image constant that is negligible"}


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
            stats["claim_holds"] = stats["error_over_abs_logit"] < ERROR_BOUND
            rows.append({"victim": name, "inputs": what, "n": int(x.shape[0]), **stats})
            log.info("%s", fmt.record(rows[-1]))
    return rows


Config = LogitStudyConfig


def run(config: LogitStudyConfig, *, on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One row per (victim, input set); the summary holds them all."""
    rows = logit_recovery_study(config)
    for row in rows:
        if on_record is not None:
            on_record(row)
    return {"rows": rows}


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    rows = summary.get("rows", [])
    return [Section("Recovered logits against the true ones", paragraphs=[
        "abs_logit: mean |v_i|; spread: std of v over classes; abs_mean: |mean_j v_j|, the per-image constant "
        "that log p - mean(log p) cannot recover; l1_error: mean |v*_i - v_i| for v* recovered from the float32 "
        "probabilities the API returns; centred_error: the numerical part of that error; underflow_rows: share "
        "of images with a probability below float32's smallest normal number. The paper's claim (Section 6.3) "
        f"holds on a row (claim_holds) where l1_error is below {ERROR_BOUND:g} x abs_logit; centred_error is float "
        "rounding by construction and is shown only to separate it from the constant."], tables=[("", rows)])]
