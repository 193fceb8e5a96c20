"""One-query identification of a logistic model from its explanation (Milli et al., FAT* 2019, footnote 2).

Footnote 2: for ``f(x) = sigmoid(w^T x)``, ``w = grad f(x) / (f(x) (1 - f(x)))``, so one gradient query and
one membership query identify the model. We take the softmax form used by the zoo's ``logistic``
(``p = softmax(W x + b)``; two classes are exactly the sigmoid of ``(W_1 - W_0) x + (b_1 - b_0)``) and its
multinomial generalisation: at one point ``x``, the probability gradients are
``grad p_k = p_k (W_k - sum_j p_j W_j)``, so ``W_k - W_0 = grad p_k / p_k - grad p_0 / p_0`` and, because
``sum_k grad p_k = 0``, the ``K - 1`` gradients of classes ``1..K-1`` determine the one of class 0. Biases
follow from the same point's probabilities: ``b_k - b_0 = log(p_k / p_0) - (W_k - W_0) x``. Softmax is
unchanged by adding one vector to every ``W_k`` (one number to every ``b_k``), so ``W_0 = 0, b_0 = 0`` is the
representative returned. Cost: ``K - 1`` ``explain`` queries and one ``predict`` query (1 + 1 for K = 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.oracle import ExplanationOracle, OutputMode


@dataclass
class LogisticIdentification:
    """``weight [K, d]``, ``bias [K]`` (float64, class 0 pinned to zero), the zoo model, and ledger counts."""

    weight: np.ndarray
    bias: np.ndarray
    model: nn.Module
    queries: dict[str, int]


def identify_logistic(oracle: ExplanationOracle, *, x: torch.Tensor | None = None) -> LogisticIdentification:
    """Identify a softmax-linear victim from ``K - 1`` probability gradients and one probability vector at
    ``x`` (default: the mid-grey image, where no class is saturated). The oracle must answer probabilities
    (``probs``) and explain; the returned zoo ``logistic`` model reproduces the victim's probabilities."""
    if oracle.mode is not OutputMode.PROBS:
        raise InputError(f"logistic identification needs probabilities, got mode {oracle.mode.value!r}; open "
                         "the victim with --mode probs")
    if not callable(getattr(oracle, "explain", None)):
        raise InputError("logistic identification needs an explanation oracle (gradients)")
    shape = tuple(oracle.input_shape)
    k = int(oracle.num_classes)
    dtype = getattr(oracle, "dtype", torch.float32)
    x0 = torch.full((1, *shape), 0.5, dtype=dtype) if x is None else x.reshape(1, *shape).to(dtype)
    p = oracle.query(x0).double().numpy().reshape(-1)
    if float(p.min()) <= 0:
        raise InputError("a class has probability 0 at this point; pass another point x")
    xb = x0.expand(k - 1, *shape)
    grads = oracle.explain(xb, "gradient", target=torch.arange(1, k), output="prob").double().numpy()
    grads = grads.reshape(k - 1, -1)
    g0 = -grads.sum(0)  # sum_k grad p_k = 0
    rel = grads / p[1:, None] - (g0 / p[0])[None, :]  # W_k - W_0, k = 1..K-1
    weight = np.vstack([np.zeros_like(g0), rel])
    xf = x0.double().numpy().reshape(-1)
    bias = np.log(p / p[0]) - weight @ xf
    return LogisticIdentification(weight=weight, bias=bias, model=_zoo_logistic(weight, bias, shape, k),
                                  queries=oracle.ledger.as_dict())


def _zoo_logistic(weight: np.ndarray, bias: np.ndarray, shape: tuple[int, ...], k: int) -> nn.Module:
    """The zoo ``logistic`` (Normalize(0.5, 0.5), then Linear) computing ``weight x + bias`` on pixels."""
    from stealkit.models import build_model

    model = build_model("logistic", input_shape=shape, num_classes=k)  # type: ignore[arg-type]
    (linear,) = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        # Linear((x - 0.5) / 0.5) = 2 W' x + b' - W' 1, so W' = W / 2 and b' = b + (W / 2) 1
        linear.weight.copy_(torch.from_numpy(weight / 2).float())
        linear.bias.copy_(torch.from_numpy(bias + (weight / 2).sum(1)).float())
    return model.eval()
