"""What exact recovery (Milli et al., FAT* 2019) may ask of the victim, and what it can fail with.

:class:`GradientAccess` meters the two query kinds of the paper's Sec. 2 (gradient queries, ``explain``, and
membership queries, ``predict``); :class:`SearchLine` caches both along one search line ``u + t v`` so no
point is paid for twice; :class:`RecoveryFailure` is the paper's "notifies of the failure" (Theorem 1).
Shared by the paper's algorithm (:mod:`stealkit.extract.explanations.exact`), its secant/biased extension
(:mod:`stealkit.extract.explanations.exact_secant`) and the membership-query variant (:mod:`stealkit.extract.explanations.exact_mq`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from stealkit.errors import InputError, StealkitError
from stealkit.oracle import Oracle, OutputMode
from stealkit.oracle.float64 import Domain, TwoLayerReLU


class RecoveryFailure(StealkitError):
    """Exact recovery could not certify its answer (the paper's "notifies of the failure")."""


class GradientAccess:
    """Metered access to the victim: gradients of logit ``output`` (``explain``) and all logits (``predict``).

    Subclassed by :class:`stealkit.extract.explanations.exact_mq.MembershipAccess`, which estimates gradients from
    membership queries instead (Algorithm 1-MQ).
    """

    def __init__(self, oracle: Oracle, *, output: int = 0, batch_size: int = 512, need_explain: bool = True):
        if oracle.mode is not OutputMode.LOGITS:
            raise InputError(f"exact recovery needs raw scores but the oracle answers {oracle.mode.value!r}; "
                             "open the victim with --mode logits")
        if need_explain and not callable(getattr(oracle, "explain", None)):
            raise InputError("this oracle gives no explanations; open it with explanations, or use the "
                             "membership-query variant (stealkit extract exact --variant mq)")
        if not 0 <= output < oracle.num_classes:
            raise InputError(f"output must be a class index in [0, {oracle.num_classes - 1}], got {output}")
        self.oracle = oracle
        self.output = int(output)
        self.batch_size = int(batch_size)
        self.shape = tuple(oracle.input_shape)
        self.d = math.prod(self.shape)
        self.num_classes = int(oracle.num_classes)
        self.dtype = getattr(oracle, "dtype", torch.float32)
        self.domain: Domain = getattr(oracle, "domain", "box")
        self.exact = self.dtype == torch.float64

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).reshape(-1, *self.shape).to(self.dtype)

    def _chunks(self, x: np.ndarray) -> list[np.ndarray]:
        return [x[i : i + self.batch_size] for i in range(0, x.shape[0], self.batch_size)]

    def values(self, x: np.ndarray) -> np.ndarray:
        """All logits at rows ``x [n, d]``: n ``predict`` queries."""
        outs = [self.oracle.query(self._tensor(c)).detach().double().numpy() for c in self._chunks(x)]
        return np.concatenate(outs).reshape(x.shape[0], -1)

    def grads(self, x: np.ndarray, output: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Gradients of one logit (default ``output``) at ``x [n, d]`` (n ``explain`` queries), and all
        logits if they came with them (finite differences), else None."""
        return self._explain(x, self.output if output is None else output), None

    def grads_all(self, x: np.ndarray) -> np.ndarray:
        """Gradients of every logit at ``x``: ``[n, K, d]`` (K ``explain`` queries per row)."""
        return np.stack([self._explain(x, k) for k in range(self.num_classes)], axis=1)

    def _explain(self, x: np.ndarray, target: int) -> np.ndarray:
        outs = [self.oracle.explain(self._tensor(c), "gradient", target=target, output="logit")  # type: ignore[attr-defined]
                .detach().double().numpy().reshape(c.shape[0], -1) for c in self._chunks(x)]
        return np.concatenate(outs)

    def default_tol(self) -> float:
        return 1e-9 if self.exact else 1e-4

    def default_epsilon(self) -> float:
        return 1e-8 if self.exact else 1e-5

    def default_fit_tol(self) -> float:
        return 1e-7 if self.exact else 1e-3

    def prune_tol(self) -> float:
        """Hidden units weaker than this (relative) are rounding noise of the fit and are dropped."""
        return 1e-11 if self.exact else 1e-6


class SearchLine:
    """The line ``u + t v`` as seen through ``access``: gradients of logit ``output`` (``grads``) and its
    values (``vals``) at every ``t`` queried so far, each point queried at most once."""

    def __init__(self, access: GradientAccess, u: np.ndarray, v: np.ndarray, output: int | None = None) -> None:
        self.access, self.u, self.v = access, u, v
        self.output = access.output if output is None else output
        self.grads: dict[float, np.ndarray] = {}
        self.vals: dict[float, float] = {}

    def at(self, ts: list[float]) -> np.ndarray:
        return self.u[None, :] + np.asarray(ts)[:, None] * self.v[None, :]

    def need_g(self, ts: list[float]) -> None:
        """Gradients at the ``ts`` not yet queried (one ``explain`` batch)."""
        new = sorted({t for t in ts if t not in self.grads})
        if new:
            g, f = self.access.grads(self.at(new), self.output)
            self.grads.update(zip(new, g, strict=True))
            if f is not None:
                self.vals.update(zip(new, f[:, self.output].tolist(), strict=True))

    def need_f(self, ts: list[float]) -> None:
        """Values at the ``ts`` not yet known (one ``predict`` batch)."""
        new = sorted({t for t in ts if t not in self.vals})
        if new:
            self.vals.update(zip(new, self.access.values(self.at(new))[:, self.output].tolist(), strict=True))

    def differs(self, a: float, b: float, tol: float) -> bool:
        """Whether the gradients at ``a`` and ``b`` (both queried) differ by more than ``tol`` (relative)."""
        return not same(self.grads[a], self.grads[b], tol)


def same(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), 1e-300)
    return float(np.linalg.norm(a - b)) <= tol * scale


def prune(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, shape: tuple[int, ...], *,
           rel: float = 1e-11) -> TwoLayerReLU:
    """Drop hidden units whose outgoing weights are zero up to rounding (``rel`` of the largest unit)."""
    out_norm = np.abs(w2).max(axis=0) * np.maximum(np.linalg.norm(w1, axis=1), np.abs(b1))
    keep = out_norm > rel * max(float(out_norm.max(initial=0.0)), 1e-300)
    if not keep.any():
        keep[:1] = True
    return TwoLayerReLU(w1[keep], b1[keep], w2[:, keep], np.asarray(b2).reshape(-1), shape)

