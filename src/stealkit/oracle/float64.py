"""The float64 explanation oracle (and the two-layer ReLU networks it answers for) of exact recovery (:mod:`stealkit.extract.explanations.exact`).

Milli et al. (FAT* 2019, Sec. 2) study ``f(x) = sum_i w_i ReLU(<A_i, x>)`` over all of ``R^d``. Two things the
stock :class:`~stealkit.oracle.LocalExplanationOracle` does stand between that setting and exactness to 1e-6:
it casts every input to float32 (gradient differences then carry ~1e-7 relative noise) and it refuses inputs
outside ``[0, 1]`` (the paper's search lines ``u + t v``, ``u, v ~ N(0, I)``, leave the pixel box at once).
:class:`Float64ExplanationOracle` answers in float64, optionally over all of ``R^d`` (``domain="real"``), and
charges a :class:`~stealkit.oracle.QueryLedger` exactly like the stock oracles (``predict`` for answers,
``explain`` for gradients, one query per input row).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.oracle.base import (
    RANGE_TOLERANCE,
    ExplainMethod,
    ExplainOutput,
    OutputMode,
    check_explain_args,
    keep_top_k,
)
from stealkit.oracle.ledger import QueryKind, QueryLedger

Domain = Literal["real", "box"]


class TwoLayerReLU(nn.Module):
    """``logits = W2 ReLU(W1 x + b1) + b2`` on flattened inputs, in float64 (any input dtype is cast).

    Shapes: ``w1 [H, d]``, ``b1 [H]``, ``w2 [K, H]``, ``b2 [K]``; ``input_shape`` is ``(C, H, W)`` with
    ``C*H*W = d``. This is both the victim family of the exact-recovery benchmark and what recovery returns.
    """

    def __init__(self, w1: np.ndarray | torch.Tensor, b1: np.ndarray | torch.Tensor,
                 w2: np.ndarray | torch.Tensor, b2: np.ndarray | torch.Tensor,
                 input_shape: Sequence[int]) -> None:
        super().__init__()
        w1_t, b1_t, w2_t, b2_t = (torch.as_tensor(np.asarray(a, dtype=np.float64)) for a in (w1, b1, w2, b2))
        if w1_t.dim() != 2 or w2_t.dim() != 2 or w2_t.shape[1] != w1_t.shape[0]:
            raise InputError(f"inconsistent layer shapes: w1 {list(w1_t.shape)}, w2 {list(w2_t.shape)}")
        self.input_shape = tuple(int(s) for s in input_shape)
        if math.prod(self.input_shape) != w1_t.shape[1]:
            raise InputError(f"input_shape {self.input_shape} does not flatten to d = {w1_t.shape[1]}")
        self.fc1 = nn.Linear(w1_t.shape[1], w1_t.shape[0], dtype=torch.float64)
        self.fc2 = nn.Linear(w2_t.shape[1], w2_t.shape[0], dtype=torch.float64)
        with torch.no_grad():
            self.fc1.weight.copy_(w1_t)
            self.fc1.bias.copy_(b1_t.reshape(-1))
            self.fc2.weight.copy_(w2_t)
            self.fc2.bias.copy_(b2_t.reshape(-1))

    @property
    def hidden(self) -> int:
        return int(self.fc1.weight.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.fc2.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.reshape(x.shape[0], -1).to(torch.float64))))

    def numpy_forward(self, x: np.ndarray) -> np.ndarray:
        """The same function on a ``[B, d]`` float64 array (no autograd)."""
        w1, b1, w2, b2 = (p.detach().numpy() for p in (self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                                        self.fc2.bias))
        return np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2

    @classmethod
    def random(cls, d: int, hidden: int, num_classes: int = 1, *, bias: bool = True, seed: int = 0,
               input_shape: Sequence[int] | None = None) -> TwoLayerReLU:
        """A random network meeting the paper's assumptions: unit rows ``A_i`` (Sec. 2, assumption 1),
        Gaussian output weights and, with ``bias``, N(0, 0.25) hidden and N(0, 1) output biases."""
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((hidden, d))
        a /= np.linalg.norm(a, axis=1, keepdims=True)
        b1 = 0.5 * rng.standard_normal(hidden) if bias else np.zeros(hidden)
        w2 = rng.standard_normal((num_classes, hidden))
        b2 = rng.standard_normal(num_classes) if bias else np.zeros(num_classes)
        return cls(a, b1, w2, b2, input_shape or (1, 1, d))

    @classmethod
    def from_classifier(cls, model: nn.Module) -> TwoLayerReLU:
        """Fold a zoo ``mlp2`` (``Normalize`` then Linear-ReLU-Linear) into one float64 network in pixel space."""
        norm = getattr(model, "normalize", None)
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if norm is None or len(linears) != 2:
            raise InputError("from_classifier needs a zoo mlp2 model (Normalize, Linear, ReLU, Linear)")
        shape = tuple(model.input_shape)  # type: ignore[attr-defined]
        c = shape[0]
        per_pixel = math.prod(shape[1:])
        mean = np.repeat(norm.mean.detach().double().numpy().reshape(c), per_pixel)
        std = np.repeat(norm.std.detach().double().numpy().reshape(c), per_pixel)
        w1 = linears[0].weight.detach().double().numpy()
        b1 = linears[0].bias.detach().double().numpy()
        return cls(w1 / std, b1 - (w1 / std) @ mean, linears[1].weight.detach().double().numpy(),
                   linears[1].bias.detach().double().numpy(), shape)

    def to_mlp2(self) -> nn.Module:
        """The same function as a float32 zoo ``mlp2`` (``Normalize(0.5, 0.5)`` folded back), to save."""
        from stealkit.models import build_model

        model = build_model("mlp2", input_shape=self.input_shape, num_classes=self.num_classes,  # type: ignore[arg-type]
                            hidden=self.hidden)
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        w1 = self.fc1.weight.detach()
        with torch.no_grad():
            # mlp2 computes W (x - 0.5) / 0.5 + b = 2 W x + (b - W 1); match W1 x + b1
            linears[0].weight.copy_((w1 / 2).float())
            linears[0].bias.copy_((self.fc1.bias.detach() + (w1 / 2).sum(1)).float())
            linears[1].weight.copy_(self.fc2.weight.detach().float())
            linears[1].bias.copy_(self.fc2.bias.detach().float())
        return model.eval()


class Float64ExplanationOracle:
    """A metered float64 oracle with explanations, over ``R^d`` (``domain="real"``) or pixels in ``[0, 1]``.

    Implements the :class:`~stealkit.oracle.ExplanationOracle` protocol: ``query`` charges one ``predict``
    query per row and ``explain`` one ``explain`` query per row (whatever SmoothGrad's sample count). Inputs
    are ``[B, *input_shape]`` arrays or tensors of any float dtype; answers are float64.
    """

    dtype = torch.float64

    def __init__(self, model: nn.Module, input_shape: Sequence[int], *, num_classes: int | None = None,
                 mode: str | OutputMode = OutputMode.LOGITS, domain: Domain = "real", budget: int | None = None,
                 ledger: QueryLedger | None = None, top_k: int = 1, seed: int = 0) -> None:
        if domain not in ("real", "box"):
            raise InputError(f"domain must be 'real' or 'box', got {domain!r}")
        self.model = copy.deepcopy(model).double().eval()  # the caller's model keeps its dtype
        from stealkit.device import module_device

        self.device = module_device(self.model)  # queries run where the model is; answers come back on the CPU
        self.input_shape: tuple[int, int, int] = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
        self.mode = OutputMode.parse(mode)
        self.domain: Domain = domain
        self.top_k = int(top_k)
        self._ledger = ledger if ledger is not None else QueryLedger(budget=budget)
        self._gen = torch.Generator().manual_seed(seed)
        if num_classes is None:
            with torch.no_grad():
                num_classes = int(self.model(torch.zeros(1, *self.input_shape, dtype=torch.float64,
                                                         device=self.device)).shape[1])
        self.num_classes = int(num_classes)

    @property
    def ledger(self) -> QueryLedger:
        return self._ledger

    def _check(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(x)
        if not t.dtype.is_floating_point:
            raise InputError(f"inputs must be floating point, got {t.dtype}")
        if t.dim() != len(self.input_shape) + 1 or tuple(t.shape[1:]) != self.input_shape:
            raise InputError(f"inputs must have shape [B, {', '.join(map(str, self.input_shape))}], "
                             f"got {list(t.shape)}")
        if t.shape[0] == 0:
            raise InputError("inputs are an empty batch; send at least one row")
        t = t.detach().to(torch.float64)
        if not bool(torch.isfinite(t).all()):
            raise InputError("inputs contain NaN or Inf; remove or repair them")
        if self.domain == "box":
            lo, hi = float(t.min()), float(t.max())
            if lo < -RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
                raise InputError(f"inputs must be pixels in [0, 1], got values in [{lo:.4g}, {hi:.4g}]")
            t = t.clamp(0.0, 1.0)
        return t

    def query(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Answer ``[B, ...]`` inputs in :attr:`mode` (float64); charges B ``predict`` queries."""
        t = self._check(x)
        with self._ledger.reserve(QueryKind.PREDICT, t.shape[0]), torch.no_grad():
            logits = self.model(t.to(self.device)).cpu()
            if self.mode is OutputMode.LOGITS:
                return logits
            if self.mode is OutputMode.LABEL:
                return logits.argmax(1)
            probs = torch.softmax(logits, 1)
            if self.mode is OutputMode.PROBS:
                return probs
            return keep_top_k(probs, self.top_k)

    def explain(self, x: torch.Tensor | np.ndarray, method: ExplainMethod = "gradient", *,
                target: int | torch.Tensor | None = None, output: ExplainOutput = "logit", n_samples: int = 10,
                sigma: float = 0.1) -> torch.Tensor:
        """Input gradient (or SmoothGrad map) of the ``target`` logit/probability; charges B ``explain``."""
        args = check_explain_args(method, output, n_samples, sigma)
        method, output, n_samples, sigma = args.method, args.output, args.n_samples, args.sigma
        t = self._check(x)
        b = t.shape[0]
        with torch.no_grad():
            pred = self.model(t.to(self.device)).argmax(1).cpu()
        tgt = pred if target is None else torch.as_tensor(target).long().reshape(-1).expand(b)
        if int(tgt.min()) < 0 or int(tgt.max()) >= self.num_classes:
            raise InputError(f"target classes must lie in [0, {self.num_classes - 1}]")
        with self._ledger.reserve(QueryKind.EXPLAIN, b):
            if method == "gradient":
                return self._grad(t, tgt, output)
            total = torch.zeros_like(t)
            for _ in range(n_samples):
                noise = torch.randn(t.shape, generator=self._gen, dtype=torch.float64) * sigma
                total += self._grad(t + noise, tgt, output)
            return total / n_samples

    def _grad(self, t: torch.Tensor, tgt: torch.Tensor, output: ExplainOutput) -> torch.Tensor:
        xb = t.to(self.device, copy=True).requires_grad_(True)
        with torch.enable_grad():
            out = self.model(xb)
            if output == "prob":
                out = torch.softmax(out, 1)
            (g,) = torch.autograd.grad(out.gather(1, tgt.to(self.device)[:, None]).sum(), xb)
        return g.detach().cpu()
