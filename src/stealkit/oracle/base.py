"""What every attack talks to: the :class:`Oracle` protocols, output modes and input validation.

A local model and a remote HTTP endpoint implement the same protocols, so every attack runs against both
unchanged. Output contract of :meth:`Oracle.query` for a batch of B images:

===========  ================================================================================
mode         answer
===========  ================================================================================
``label``    int64 ``[B]``: the top-1 class
``topk``     float32 ``[B, K]``: the probabilities of the ``top_k`` most likely classes, others 0
``probs``    float32 ``[B, K]``: softmax probabilities (optionally temperature-scaled), rows sum to 1
``logits``   float32 ``[B, K]``: raw scores
===========  ================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from stealkit.errors import InputError
from stealkit.oracle.ledger import QueryLedger

ExplainMethod = Literal["gradient", "smoothgrad"]
ExplainOutput = Literal["logit", "prob"]

#: pixels may sit this far outside [0, 1] (float rounding) before a batch is refused; they are then clipped.
RANGE_TOLERANCE = 1e-5
EXPLAIN_METHODS: tuple[str, ...] = ("gradient", "smoothgrad")
EXPLAIN_OUTPUTS: tuple[str, ...] = ("logit", "prob")
#: SmoothGrad noise draws allowed per image (each is one gradient computation)
MAX_SMOOTHGRAD_SAMPLES = 256
#: the largest SmoothGrad noise level; pixels live in [0, 1], so sigma above this is pure noise
MAX_SMOOTHGRAD_SIGMA = 10.0


class OutputMode(StrEnum):
    """What a prediction API returns."""

    LABEL = "label"
    TOPK = "topk"
    PROBS = "probs"
    LOGITS = "logits"

    @classmethod
    def parse(cls, value: str | OutputMode) -> OutputMode:
        if isinstance(value, OutputMode):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise InputError(
                f"unknown output mode {value!r}; expected one of {[m.value for m in cls]}"
            ) from None


@runtime_checkable
class Oracle(Protocol):
    """A black-box classifier behind a budget: images in, answers in :attr:`mode` out."""

    num_classes: int
    input_shape: tuple[int, int, int]
    mode: OutputMode

    @property
    def ledger(self) -> QueryLedger: ...

    def query(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class ExplanationOracle(Oracle, Protocol):
    """An oracle that also explains (Milli et al. 2019): input gradients or SmoothGrad maps."""

    def explain(
        self,
        x: torch.Tensor,
        method: ExplainMethod = "gradient",
        *,
        target: int | torch.Tensor | None = None,
        output: ExplainOutput = "logit",
        n_samples: int = 10,
        sigma: float = 0.1,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class ExplainArgs:
    """Validated explanation arguments (see :func:`check_explain_args`)."""

    method: ExplainMethod
    output: ExplainOutput
    n_samples: int
    sigma: float


def check_explain_args(method: Any = "gradient", output: Any = "logit", n_samples: Any = 10,
                       sigma: Any = 0.1) -> ExplainArgs:
    """The one check of explanation arguments, used by every oracle and by the server.

    ``method`` is ``gradient`` or ``smoothgrad``; ``output`` is ``logit`` or ``prob``; ``n_samples`` an integer
    in ``[1, MAX_SMOOTHGRAD_SAMPLES]``; ``sigma`` a finite number in ``[0, MAX_SMOOTHGRAD_SIGMA]``. Anything else
    is an :class:`InputError` naming the argument and its legal range.
    """
    if not isinstance(method, str) or method not in EXPLAIN_METHODS:  # a list is unhashable: no TypeError, a 400
        raise InputError(f"unknown explanation method {method!r}; expected one of {list(EXPLAIN_METHODS)}")
    if not isinstance(output, str) or output not in EXPLAIN_OUTPUTS:
        raise InputError(f"unknown explanation output {output!r}; expected one of {list(EXPLAIN_OUTPUTS)}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) \
            or not 1 <= n_samples <= MAX_SMOOTHGRAD_SAMPLES:
        raise InputError(f"n_samples must be an integer in [1, {MAX_SMOOTHGRAD_SAMPLES}], got {n_samples!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, int | float | np.floating) \
            or not math.isfinite(sigma) or not 0 <= sigma <= MAX_SMOOTHGRAD_SIGMA:
        raise InputError(f"sigma must be a finite number in [0, {MAX_SMOOTHGRAD_SIGMA:g}], got {sigma!r}")
    return ExplainArgs(method=method, output=output, n_samples=int(n_samples), sigma=float(sigma))


def explain_price(args: ExplainArgs) -> int:
    """What one image's explanation costs on a served API, in ``explain`` queries: 1 for a gradient, one per
    noise sample for SmoothGrad (each sample is a full gradient computation, so the price follows the work)."""
    return args.n_samples if args.method == "smoothgrad" else 1


def validate_images(x: Any, input_shape: tuple[int, ...], *, what: str = "inputs") -> torch.Tensor:
    """Check a batch of images and return it as contiguous float32 ``[B, C, H, W]`` in [0, 1].

    Refuses (with :class:`InputError`, saying what to do) non-arrays, integer or complex dtypes, a missing
    batch dimension, a shape other than ``input_shape``, empty batches, NaN/Inf, and pixels outside [0, 1].
    """
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "f":
            raise InputError(
                f"{what} must be floating point pixels in [0, 1], got numpy dtype {x.dtype}; "
                "divide integer images by 255 first"
            )
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{what} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise InputError(
            f"{what} must be floating point pixels in [0, 1], got dtype {x.dtype}; "
            "divide integer images by 255 first"
        )
    shape = tuple(input_shape)
    if x.dim() == len(shape) and tuple(x.shape) == shape:
        raise InputError(f"{what} is a single image of shape {tuple(x.shape)}; add a batch dimension (x[None])")
    if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise InputError(f"{what} must have shape [B, {', '.join(map(str, shape))}], got {list(x.shape)}")
    if x.shape[0] == 0:
        raise InputError(f"{what} is an empty batch; send at least one image")
    x = x.detach()
    if x.dtype != torch.float32:
        x = x.float()
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = int((~finite).flatten(1).any(1).sum())
        raise InputError(f"{what} contain NaN or Inf in {bad} image(s); remove or repair them")
    lo, hi = torch.aminmax(x)
    if float(lo) < -RANGE_TOLERANCE or float(hi) > 1 + RANGE_TOLERANCE:
        raise InputError(
            f"{what} must be pixels in [0, 1], got values in [{float(lo):.4g}, {float(hi):.4g}]; "
            "scale your images (normalisation happens inside the model)"
        )
    if float(lo) < 0 or float(hi) > 1:
        x = x.clamp(0.0, 1.0)
    return x.contiguous()


def answer_from_logits(
    logits: torch.Tensor, mode: OutputMode, *, temperature: float = 1.0, top_k: int = 1
) -> torch.Tensor:
    """Turn raw logits into what an API in ``mode`` returns (see the module docstring)."""
    if mode is OutputMode.LOGITS:
        return logits.float()
    if mode is OutputMode.LABEL:
        return logits.argmax(dim=1)
    probs = torch.softmax(logits.float() / temperature, dim=1)
    if mode is OutputMode.PROBS:
        return probs
    return keep_top_k(probs, top_k)


def keep_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Zero every probability but the ``k`` largest of each row."""
    k = max(1, min(int(k), probs.shape[1]))
    idx = probs.topk(k, dim=1).indices
    out = torch.zeros_like(probs)
    return out.scatter_(1, idx, probs.gather(1, idx))


def labels_from_answer(answer: torch.Tensor, mode: OutputMode) -> torch.Tensor:
    """The top-1 label carried by any answer."""
    return answer.long() if mode is OutputMode.LABEL else answer.argmax(dim=1)
