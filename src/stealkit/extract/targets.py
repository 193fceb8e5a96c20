"""Answer -> training target: what a student trains on, for every kind of victim answer.

An oracle answers in one of four modes (:class:`~stealkit.oracle.OutputMode`): labels, top-k probabilities,
full probabilities or logits. Every extraction method turns those answers into one of three targets:

- :func:`answer_probs`: class probabilities ``[B, K]`` (one-hot or smoothed labels, renormalised top-k rows,
  softmaxed logits);
- :func:`answer_logits`: victim logits up to their mean (DFME appendix B);
- :func:`victim_log_probs`: the temperature-scaled ``log V_tau`` of the surrogate attack's KL loss (DFME A.1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from stealkit.errors import InputError
from stealkit.oracle import OutputMode


def answer_probs(answer: torch.Tensor, mode: OutputMode, num_classes: int, *, smoothing: float = 0.0) -> torch.Tensor:
    """Class probabilities ``[B, K]`` carried by any answer.

    Labels become one-hot rows, smoothed to ``(1 - s) onehot + s / K`` when ``smoothing = s > 0`` (the label-only
    adaptation of DFME and MAZE); top-k rows are renormalised; logits are softmaxed.
    """
    if mode is OutputMode.LABEL:
        p = F.one_hot(answer.long(), num_classes).float()
        return p * (1 - smoothing) + smoothing / num_classes if smoothing > 0 else p
    if mode is OutputMode.LOGITS:
        return torch.softmax(answer.float(), dim=1)
    p = answer.float()
    return p / p.sum(dim=1, keepdim=True).clamp_min(1e-12)


def answer_logits(answer: torch.Tensor, mode: OutputMode, num_classes: int, *, smoothing: float = 0.0) -> torch.Tensor:
    """Victim logits up to their mean: raw logits when the oracle gives them, else ``log p - mean(log p)``
    (DFME appendix B, Eq. 8-9, via :func:`stealkit.extract.logit_recovery.recover_logits`, which floors
    underflowed probabilities at the smallest normal float)."""
    from stealkit.extract.logit_recovery import recover_logits as from_probs

    if mode is OutputMode.LOGITS:
        return answer.float()
    return from_probs(answer_probs(answer, mode, num_classes, smoothing=smoothing))


def victim_log_probs(answer: torch.Tensor, mode: OutputMode | str, tau: float = 1.0) -> torch.Tensor:
    """``log V_tau`` ``[B, K]`` from an answer in ``mode`` (probs, topk or logits); ``-inf`` where V_tau = 0.

    For probabilities ``softmax(log p / tau) = softmax(v / tau)`` exactly; zero probabilities (hidden top-k
    classes, float underflow) get probability 0 at every temperature.
    """
    mode = OutputMode.parse(mode)
    if mode is OutputMode.LABEL:
        raise InputError("the temperature-scaled KL loss needs probabilities or logits, not labels; use loss 'ce'")
    if mode is OutputMode.LOGITS:
        return F.log_softmax(answer.float() / tau, dim=1)
    p = answer.float()
    log_p = torch.where(p > 0, p.clamp_min(torch.finfo(p.dtype).tiny).log(), torch.full_like(p, -math.inf))
    return F.log_softmax(log_p / tau, dim=1)
