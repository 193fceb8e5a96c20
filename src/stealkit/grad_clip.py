"""Gradient-norm clipping of a training step (Pascanu, Mikolov & Bengio, *On the difficulty of training recurrent
neural networks*, ICML 2013, Sec. 3.2, Algorithm 1).

Before each optimiser step, if the norm ``||g||`` of the gradient of all trainable parameters together exceeds
a threshold ``c``, the gradient is rescaled to ``c * g / ||g||``; steps below it are untouched. The paper's
argument: a rare, very large gradient (a "cliff" of the loss surface) throws the parameters far from the region
training had reached, and rescaling keeps the step's direction while bounding its length. In stealkit it is a
setting of every training on the answers (``grad_clip``; 0 is off and leaves the loop bitwise as it was): issue
21's tenth pass found the tau-2 KL students of probability answers collapsing after such spikes (gradient norms
of 10-40, 6-30 times a run's median step, near the one-cycle peak; docs/guide/surrogate.md, "The default and why"),
and the default
with probability answers from 10 per class clips at 5.

``torch.nn.utils.clip_grad_norm_`` divides by ``norm + 1e-6``; :func:`clip_gradients` rescales by exactly
``c / ||g||``, the paper's rule, which is what the validated and reported runs used (so they reproduce bitwise).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from stealkit.errors import InputError


def check_grad_clip(value: object) -> None:
    """One :class:`InputError` unless ``value`` is a finite number >= 0 (0: off)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise InputError(f"grad_clip must be a gradient norm >= 0 (0: off), got {value!r}")


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Rescale the gradients of ``params`` in place so that their joint L2 norm is at most ``max_norm``
    (Algorithm 1); returns the norm before clipping. Parameters without a gradient are skipped."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / norm)
    return norm
