"""Algorithm 1-MQ: exact two-layer recovery from membership queries alone (Milli et al., FAT* 2019, App. C).

Every gradient of Algorithm 1 is replaced by the forward-difference estimate of App. C.1,
``grad_hat f(x)_j = (f(x + s e_j) - f(x)) / s``: ``d`` membership queries per gradient plus one for ``f(x)``
(which the secant step and Algorithm 1b use anyway). Lemma 7: if ``x`` and every ``x + s e_j`` lie in one cell,
the estimate *is* the gradient, so the recovery stays exact; Lemma 9 bounds the chance that some probe lies
within ``s`` of a hyperplane by ``2 l h s / epsilon``, which Theorem 4 makes ``<= delta`` by a small ``s``.
One finite-difference stencil answers all K logits at once, so the multi-output extension's gradients of
every output (the box-domain linear term) cost no more than one. In the pixel box a coordinate whose forward
step would leave ``[0, 1]`` is differenced backwards. Queries: ``O(d h log(h / delta))`` (Theorem 4), all of
kind ``predict``; the ledger has no ``explain`` entries.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from stealkit.errors import InputError
from stealkit.extract.explanations.exact import ExactConfig, ExactRecovery, recover_with
from stealkit.extract.explanations.exact_access import GradientAccess
from stealkit.oracle import Oracle


class MembershipAccess(GradientAccess):
    """A :class:`~stealkit.extract.explanations.exact_access.GradientAccess` whose gradients are App. C's finite differences."""

    def __init__(self, oracle: Oracle, *, output: int = 0, batch_size: int = 512, step: float = 1e-5) -> None:
        super().__init__(oracle, output=output, batch_size=batch_size, need_explain=False)
        if not (step > 0 and math.isfinite(step)):
            raise InputError(f"the finite-difference step must be a positive number, got {step}")
        self.step = float(step)

    def _fd(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All logits' gradients ``[n, K, d]`` and values ``[n, K]`` at ``x [n, d]``: ``n (d + 1)`` queries."""
        n, d = x.shape
        per = max(1, 16384 // (d + 1))
        grads, vals = [], []
        eye = np.eye(d)
        for i in range(0, n, per):
            xc = x[i : i + per]
            steps = np.full(xc.shape, self.step)
            if self.domain == "box":
                steps = np.where(xc + self.step > 1, -self.step, steps)
            shifted = (xc[:, None, :] + eye[None] * steps[:, :, None]).reshape(-1, d)
            answers = self.values(np.concatenate([xc, shifted]))
            f = answers[: xc.shape[0]]
            fd = answers[xc.shape[0] :].reshape(xc.shape[0], d, -1)
            grads.append(((fd - f[:, None, :]) / steps[:, :, None]).transpose(0, 2, 1))
            vals.append(f)
        return np.concatenate(grads), np.concatenate(vals)

    def grads(self, x: np.ndarray, output: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        g, f = self._fd(x)
        return g[:, self.output if output is None else output], f

    def grads_all(self, x: np.ndarray) -> np.ndarray:
        return self._fd(x)[0]

    def default_tol(self) -> float:
        return 1e-5 if self.exact else 1e-2

    def default_epsilon(self) -> float:
        return 1e-3

    def default_fit_tol(self) -> float:
        # forward differences carry rounding of about 1e-16 |f| / s in each gradient entry
        return 1e-5 if self.exact else 1e-2

    def prune_tol(self) -> float:
        return 1e-9 if self.exact else 1e-4


def recover_two_layer_mq(oracle: Oracle, hidden: int, config: ExactConfig | None = None, *,
                         step: float | None = None,
                         anchors: np.ndarray | torch.Tensor | None = None) -> ExactRecovery:
    """Algorithm 1-MQ: :func:`~stealkit.extract.explanations.exact.recover_two_layer` with finite-difference gradients.

    ``oracle`` needs only to answer logits (no ``explain``). ``step`` is App. C's ``s`` (None: 1e-5 for
    float64 oracles, 1e-3 for float32 ones, whose answers carry ~1e-7 relative rounding). The search range
    defaults to ``l = 10`` (not ``100 h``): the estimate's rounding error grows with ``|f(x)| / s``, so the
    lines stay near the origin; a crossing beyond ``l`` (chance ``2 / (10 pi)`` per unit and line, Lemma 3)
    is found on a further line.
    """
    cfg = config or ExactConfig()
    dtype = getattr(oracle, "dtype", torch.float32)
    s = step if step is not None else (1e-5 if dtype == torch.float64 else 1e-3)
    if cfg.length is None:
        cfg = replace(cfg, length=10.0)
    access = MembershipAccess(oracle, output=cfg.output, batch_size=cfg.batch_size, step=s)
    return recover_with(access, hidden, cfg, anchors=anchors)
