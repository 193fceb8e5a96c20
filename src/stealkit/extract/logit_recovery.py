"""Recovering logits from probabilities (Truong et al., *Data-Free Model Extraction*, CVPR 2021, appendix B).

A probability API returns ``V(x) = softmax(v(x))``. Its logarithm is ``v(x) + C(x)`` with a per-image
constant ``C(x) = -logsumexp(v(x))`` the attacker cannot see; subtracting the mean over classes (eq. 9)
cancels ``C(x)``::

    v*_i(x) = log V_i(x) - (1/K) sum_j log V_j(x) = v_i(x) - mean_j v_j(x)

so the recovered logits equal the true ones up to the victim's own per-image logit mean, which the paper
argues (Section 6.3) is small against the logits' spread; ``stealkit study logits`` measures it.

Float32 probabilities underflow to exactly 0 once a class's logit sits about 87 (104 with subnormals) below
the top one, and ``log 0 = -inf`` would poison the mean. :func:`recover_logits` floors probabilities at the
smallest normal float of their dtype before the logarithm: every class that did not underflow keeps its exact
logit differences to every other such class, and an underflowed class gets a finite logit that is an upper
bound of its true (unknowable) value. :func:`underflow_mask` says which entries were floored.
"""

from __future__ import annotations

import torch

from stealkit.errors import InputError


def probability_floor(dtype: torch.dtype) -> float:
    """The floor applied before the logarithm: the smallest normal number of ``dtype`` (1.2e-38 for float32)."""
    return float(torch.finfo(dtype).tiny)


def underflow_mask(probs: torch.Tensor, floor: float | None = None) -> torch.Tensor:
    """Boolean ``[B, K]``: entries below the floor (underflowed to 0 or subnormal), whose logit is a bound only."""
    floor = probability_floor(probs.dtype) if floor is None else floor
    return probs < floor


def recover_logits(probs: torch.Tensor, *, floor: float | None = None) -> torch.Tensor:
    """Approximate logits ``log p - mean(log p)`` of probability rows ``[B, K]`` (appendix B, eq. 8-9).

    Exact up to the per-row constant ``mean_j v_j`` when no probability underflowed; finite always.
    ``floor`` (default: the dtype's smallest normal number) bounds the probabilities away from zero. Rows
    need not sum to one exactly (a rounded API): any common scale factor cancels with the mean.
    Not meaningful for top-k answers, whose zeros are hidden classes, not tiny probabilities.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise InputError(f"recover_logits expects probabilities of shape [B, K], got {getattr(probs, 'shape', probs)}")
    if not probs.dtype.is_floating_point:
        raise InputError(f"recover_logits expects floating point probabilities, got {probs.dtype}")
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise InputError("recover_logits expects probabilities: finite and non-negative")
    floor = probability_floor(probs.dtype) if floor is None else float(floor)
    if floor <= 0:
        raise InputError(f"floor must be positive, got {floor}")
    log_p = probs.clamp_min(floor).log()
    return log_p - log_p.mean(dim=1, keepdim=True)


def centre_logits(logits: torch.Tensor) -> torch.Tensor:
    """``v - mean_j v_j``: what :func:`recover_logits` returns for exact probabilities of these logits."""
    return logits - logits.mean(dim=1, keepdim=True)


def recovery_error(true_logits: torch.Tensor, probs: torch.Tensor) -> dict[str, float]:
    """How far recovered logits are from the true ones, and why (the quantities of the paper's Section 6.3).

    Returns means over the batch of: ``abs_logit`` (mean |v_i|), ``spread`` (std over classes of v),
    ``abs_mean`` (|mean_j v_j|, the constant recovery cannot see), ``l1_error`` (mean |v*_i - v_i| over
    classes, which equals ``abs_mean`` up to float error and underflow), ``centred_error`` (mean |v*_i -
    (v_i - mean v)|: the numerical error alone) and ``underflow_rows`` (fraction of rows with a floored entry).
    """
    v = true_logits.double()
    rec = recover_logits(probs).double()
    return {
        "abs_logit": float(v.abs().mean()),
        "spread": float(v.std(dim=1).mean()),
        "abs_mean": float(v.mean(dim=1).abs().mean()),
        "l1_error": float((rec - v).abs().mean()),
        "centred_error": float((rec - centre_logits(v)).abs().mean()),
        "underflow_rows": float(underflow_mask(probs).any(dim=1).float().mean()),
    }
