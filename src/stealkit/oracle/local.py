"""An in-process oracle over a local ``nn.Module``: the reference implementation of the protocols."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from stealkit.chunking import forward_chunk
from stealkit.errors import InputError
from stealkit.oracle.base import (
    ExplainMethod,
    ExplainOutput,
    OutputMode,
    answer_from_logits,
    check_explain_args,
    keep_top_k,
    validate_images,
)
from stealkit.oracle.ledger import QueryKind, QueryLedger, digest_tensor
from stealkit.oracle.observe import notify

#: an output defence: maps (probabilities [B,K], logits [B,K]) to perturbed probabilities [B,K]
Defence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@runtime_checkable
class InputAwareDefence(Protocol):
    """A defence that also sees the queried images (e.g. Adaptive Misinformation, which answers some queries from
    a second network): ``needs_input`` is true and it is called ``defence(probs, logits, x=images)``, the images
    as the oracle validated them ([B, C, H, W], on the CPU). Every other defence keeps the two-argument
    :data:`Defence` call."""

    needs_input: bool

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor, *, x: torch.Tensor) -> torch.Tensor: ...


def needs_input(defence: Any) -> bool:
    """Whether ``defence`` must be called with the queried images (:class:`InputAwareDefence`)."""
    return bool(getattr(defence, "needs_input", False))


def apply_defence(defence: Any, probs: torch.Tensor, logits: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
    """``defence``'s answer: with the images ``x`` for an :class:`InputAwareDefence`, which refuses to answer
    without them, else from the probabilities and logits alone."""
    if not needs_input(defence):
        return defence(probs, logits)
    if x is None:
        raise InputError(f"the defence {defence!r} needs the queried images: pass x= to answer_from_logits")
    return defence(probs, logits, x=x)


class LocalOracle:
    """Answers queries from a local model in one of the :class:`OutputMode` s, charging its ledger.

    Args:
        model: a classifier taking pixels in [0, 1] (normalisation inside) and returning logits.
        input_shape: ``(C, H, W)`` of one image.
        num_classes: inferred from one forward pass when not given.
        mode: ``label``, ``topk``, ``probs`` or ``logits``.
        temperature: softmax temperature for ``probs``/``topk``.
        top_k: how many classes ``topk`` reveals.
        budget: total images this oracle will answer (``None``: unlimited); or pass a ``ledger``.
        defences: output perturbations applied to the probabilities before the mode is applied
            (e.g. rounding, reverse sigmoid); ignored in ``logits`` mode unless they accept logits.
        batch_size: the largest chunk sent through the model at once; ``None`` (default) chooses it for the
            device (:func:`stealkit.chunking.forward_chunk`: on the CPU the largest chunk whose
            activations stay in cache, 16-512 images; 1,024 elsewhere). It never changes what is charged.
    """

    def __init__(
        self,
        model: nn.Module,
        input_shape: Sequence[int],
        *,
        num_classes: int | None = None,
        mode: str | OutputMode = OutputMode.PROBS,
        temperature: float = 1.0,
        top_k: int = 1,
        budget: int | None = None,
        ledger: QueryLedger | None = None,
        defences: Sequence[Defence] = (),
        batch_size: int | None = None,
        device: str | torch.device = "cpu",
        log_queries: bool = False,
    ) -> None:
        if temperature <= 0 or not math.isfinite(temperature):
            raise InputError(f"temperature must be a positive number, got {temperature}")
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.input_shape: tuple[int, int, int] = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
        self.mode = OutputMode.parse(mode)
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.defences = tuple(defences)
        if batch_size is not None and int(batch_size) < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = int(batch_size) if batch_size is not None else forward_chunk(self.model, self.input_shape,
                                                                                       self.device)
        self._log_queries = log_queries
        self._ledger = ledger if ledger is not None else QueryLedger(budget=budget, log=log_queries)
        if num_classes is None:
            with torch.inference_mode():
                num_classes = int(self.model(torch.zeros(1, *self.input_shape, device=self.device)).shape[1])
        self.num_classes = int(num_classes)

    @classmethod
    def from_dir(cls, path: str | Path, **kwargs: object) -> LocalOracle:
        """Load a saved model (safetensors + JSON spec) and wrap it."""
        from stealkit.models import load_model

        model, spec = load_model(path, device=str(kwargs.get("device", "cpu")))
        return cls(model, spec.input_shape, num_classes=spec.num_classes, **kwargs)  # type: ignore[arg-type]

    @property
    def ledger(self) -> QueryLedger:
        return self._ledger

    # -- predictions -------------------------------------------------------------------------------
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Unmetered forward pass in chunks (for the owner's own evaluation, never for attacks)."""
        outs = []
        with torch.inference_mode():
            for i in range(0, x.shape[0], self.batch_size):
                outs.append(self.model(x[i : i + self.batch_size].to(self.device)).float())
        return torch.cat(outs).cpu() if len(outs) > 1 else outs[0].cpu()

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Answer a batch ``[B, C, H, W]`` of pixels in [0, 1]; charges B ``predict`` queries."""
        x = validate_images(x, self.input_shape)
        digest = digest_tensor(x) if self._log_queries else ""
        with self._ledger.reserve(QueryKind.PREDICT, x.shape[0], digest=digest):
            answer = self.answer_from_logits(self.logits(x), x=x)
        notify(self, x, answer)
        return answer

    def answer_from_logits(self, logits: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """This oracle's answer (mode, temperature, top-k, defences) to raw ``logits``; charges nothing.

        ``x``: the queried images the logits answer, which an :class:`InputAwareDefence` is given (one without
        them is refused). The server uses it to answer exactly as :meth:`query` does after charging its own store."""
        if self.defences and self.mode is not OutputMode.LOGITS:
            probs = torch.softmax(logits / self.temperature, dim=1)
            for defence in self.defences:
                probs = apply_defence(defence, probs, logits, x)
            if self.mode is OutputMode.LABEL:
                return probs.argmax(dim=1)
            if self.mode is OutputMode.PROBS:
                return probs
            return keep_top_k(probs, self.top_k)
        return answer_from_logits(logits, self.mode, temperature=self.temperature, top_k=self.top_k)


class LocalExplanationOracle(LocalOracle):
    """A :class:`LocalOracle` that also returns explanations (Milli et al. 2019, Sec. 2 and App. D).

    ``explain`` charges one ``explain`` query per image, whatever the method's internal sample count.
    """

    def __init__(self, *args: object, seed: int = 0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._gen = torch.Generator(device="cpu").manual_seed(seed)

    def explain(
        self,
        x: torch.Tensor,
        method: ExplainMethod = "gradient",
        *,
        target: int | torch.Tensor | None = None,
        output: ExplainOutput = "logit",
        n_samples: int = 10,
        sigma: float = 0.1,
    ) -> torch.Tensor:
        """Input gradient of the ``target`` class's logit (or probability) at each image.

        ``target=None`` explains each image's predicted class. ``smoothgrad`` averages the gradient over
        ``n_samples`` points x + N(0, sigma^2 I) (Smilkov et al. 2017; Milli et al. App. D), the class fixed
        at the clean prediction. Returns float32 ``[B, C, H, W]``.
        """
        args = check_explain_args(method, output, n_samples, sigma)
        x = validate_images(x, self.input_shape)
        targets = self._targets(x, target)
        with self._ledger.reserve(QueryKind.EXPLAIN, x.shape[0]):
            if args.method == "gradient":
                return self._gradient(x, targets, args.output)
            total = torch.zeros_like(x)
            for _ in range(args.n_samples):
                noise = torch.randn(x.shape, generator=self._gen) * args.sigma
                total += self._gradient(x + noise, targets, args.output)
            return total / args.n_samples

    def _targets(self, x: torch.Tensor, target: int | torch.Tensor | None) -> torch.Tensor:
        b = x.shape[0]
        if target is None:
            return self.logits(x).argmax(1)
        t = torch.as_tensor(target).long().reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        if t.numel() != b:
            raise InputError(f"target must be one class or one per image ({b}), got {t.numel()}")
        if int(t.min()) < 0 or int(t.max()) >= self.num_classes:
            raise InputError(f"target classes must lie in [0, {self.num_classes - 1}]")
        return t

    def _gradient(self, x: torch.Tensor, targets: torch.Tensor, output: ExplainOutput) -> torch.Tensor:
        grads = []
        for i in range(0, x.shape[0], self.batch_size):
            xb = x[i : i + self.batch_size].to(self.device).requires_grad_(True)
            with torch.enable_grad():
                out = self.model(xb)
                if output == "prob":
                    out = torch.softmax(out, dim=1)
                sel = out.gather(1, targets[i : i + self.batch_size].to(self.device)[:, None]).sum()
                (g,) = torch.autograd.grad(sel, xb)
            grads.append(g.detach().float().cpu())
        return torch.cat(grads)
