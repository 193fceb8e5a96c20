"""Gradient-matching reconstruction from an explanation API (Milli et al., FAT* 2019, Sec. 4-5, App. D).

The attacker queries ``n`` inputs; for each it gets the victim's answer (a membership query, probabilities)
and, with ``use_gradients``, its explanation: the input gradient of the predicted class's logit (raw, or
SmoothGrad-processed, App. D: ``mean_i grad f(x + z_i)``, ``z_i ~ N(0, sigma^2 I)``). A fresh reconstruction
``f_hat`` is trained on the joint loss of Sec. 4,

    l_J(x) = l_G(x) + lambda * l_M(x),   l_G(x) = ||grad f_c(x) - grad f_hat_c(x)||_2^2,

with ``l_M`` the cross-entropy between ``f(x)`` and ``f_hat(x)`` (``c`` the victim's predicted class), against
the membership-only baseline ``l_M`` (``use_gradients=False``). ``l_G`` needs the reconstruction's input
gradient inside the loss, so it is trained by double back-propagation (``create_graph=True``). The
reconstruction's own raw gradient is matched to the returned map in both explanation modes (the attacker
sees only the map). Sec. 5.2's unknown model class is the ``make_student`` argument; Sec. 5.3's unknown data
distribution is the query pool (attacker data or Gaussian noise), both chosen by the caller.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.common import ExtractionResult, curve_point
from stealkit.extract.losses import soft_cross_entropy
from stealkit.metrics import Evaluator
from stealkit.oracle import ExplanationOracle, Oracle, OutputMode

log = logging.getLogger(__name__)

Explanation = Literal["gradient", "smoothgrad"]


@dataclass(frozen=True)
class GradMatchConfig:
    """``use_gradients``: joint loss (True) or membership only. ``explanation``: raw gradients or SmoothGrad
    (``smooth_sigma``, ``smooth_samples`` = App. D's sigma and N). ``lam``: lambda. Training: Adam (``lr``)
    for ``steps`` minibatches of ``batch_size`` drawn from the ``n`` answered queries, whatever ``n`` is."""

    use_gradients: bool = True
    explanation: Explanation = "gradient"
    lam: float = 1.0
    smooth_sigma: float = 0.3
    smooth_samples: int = 10
    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    query_batch: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.explanation not in ("gradient", "smoothgrad"):
            raise InputError(f"explanation must be 'gradient' or 'smoothgrad', got {self.explanation!r}")
        if not (self.lam >= 0 and math.isfinite(self.lam)):
            raise InputError(f"lam must be a non-negative number, got {self.lam}")
        if self.steps < 1 or self.batch_size < 1 or self.smooth_samples < 1:
            raise InputError("steps, batch_size and smooth_samples must be positive")


@dataclass
class Answers:
    """What the API returned for the queried inputs: probabilities, classes and (optionally) maps."""

    x: torch.Tensor
    probs: torch.Tensor
    classes: torch.Tensor
    maps: torch.Tensor | None


def query_answers(oracle: Oracle, x: torch.Tensor, config: GradMatchConfig) -> Answers:
    """One membership query per input and, with ``use_gradients``, one explanation (charged ``explain``)."""
    if oracle.mode is not OutputMode.PROBS:
        raise InputError(f"gradient matching trains on probabilities; open the victim with --mode probs "
                         f"(got {oracle.mode.value!r})")
    if config.use_gradients and not callable(getattr(oracle, "explain", None)):
        raise InputError("this oracle gives no explanations: open the victim with explanations, or pass "
                         "--membership-only")
    probs, maps = [], []
    for i in range(0, x.shape[0], config.query_batch):
        xb = x[i : i + config.query_batch]
        p = oracle.query(xb).float()
        probs.append(p)
        if config.use_gradients:
            explain = oracle.explain  # type: ignore[attr-defined]
            maps.append(explain(xb, config.explanation, target=p.argmax(1), output="logit",
                                n_samples=config.smooth_samples, sigma=config.smooth_sigma).float())
    pr = torch.cat(probs)
    return Answers(x=x, probs=pr, classes=pr.argmax(1), maps=torch.cat(maps) if maps else None)


def train_reconstruction(student: nn.Module, answers: Answers, config: GradMatchConfig, *,
                         device: str = "cpu") -> nn.Module:
    """Fit ``student`` to the answers with ``l_G + lambda l_M`` (or ``l_M`` alone when no maps)."""
    gen = torch.Generator().manual_seed(config.seed)
    student = student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=config.lr)
    n = answers.x.shape[0]
    from stealkit.progress import progress

    for _step in progress(range(config.steps), desc="student (gradient matching)", unit="step"):
        idx = torch.randint(0, n, (min(config.batch_size, n),), generator=gen) if n > config.batch_size \
            else torch.arange(n)
        xb = answers.x[idx].to(device)
        pb = answers.probs[idx].to(device)
        if answers.maps is not None:
            xb = xb.clone().requires_grad_(True)
        logits = student(xb)
        loss = config.lam * soft_cross_entropy(logits, pb) if answers.maps is not None else \
            soft_cross_entropy(logits, pb)
        if answers.maps is not None:
            sel = logits.gather(1, answers.classes[idx].to(device)[:, None]).sum()
            (g,) = torch.autograd.grad(sel, xb, create_graph=True)
            loss = loss + (g - answers.maps[idx].to(device)).flatten(1).pow(2).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return student.eval()


def extract_gradient_matching(
    oracle: Oracle | ExplanationOracle,
    pool: torch.Tensor,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator,
    config: GradMatchConfig,
    checkpoints: tuple[int, ...],
    device: str = "cpu",
    on_point: Callable[[dict[str, object]], None] | None = None,
) -> ExtractionResult:
    """Accuracy against queries: at each checkpoint n, answer the first n pool images (earlier answers are
    reused, never re-bought) and train a fresh reconstruction on them. Queries come from the ledger."""
    if not checkpoints or min(checkpoints) < 1:
        raise InputError(f"checkpoints must be positive query counts, got {checkpoints}")
    gen = torch.Generator().manual_seed(config.seed)
    pool = pool[torch.randperm(pool.shape[0], generator=gen)]
    wanted = sorted({min(c, pool.shape[0]) for c in checkpoints})
    answers: Answers | None = None
    curve: list[dict[str, object]] = []
    student: nn.Module | None = None
    for n in wanted:
        have = 0 if answers is None else answers.x.shape[0]
        if n > have:
            new = query_answers(oracle, pool[have:n], config)
            answers = new if answers is None else Answers(
                x=torch.cat([answers.x, new.x]), probs=torch.cat([answers.probs, new.probs]),
                classes=torch.cat([answers.classes, new.classes]),
                maps=None if new.maps is None else torch.cat([answers.maps, new.maps]))  # type: ignore[list-item]
        assert answers is not None
        torch.manual_seed(config.seed)
        student = train_reconstruction(make_student(), answers, config, device=device)
        point = curve_point(oracle, evaluator, student, n=n)
        curve.append(point)
        log.info("n=%d: %s queries, accuracy %.4f", n, fmt.queries(oracle.ledger.as_dict()), point["accuracy"])
        if on_point is not None:
            on_point(point)
    assert student is not None
    final = curve[-1]
    return ExtractionResult(
        method="gradient-matching" if config.use_gradients else "membership-only",
        student=student, queries=oracle.ledger.as_dict(), accuracy=final["accuracy"],  # type: ignore[arg-type]
        fidelity=final["fidelity"], victim_accuracy=evaluator.victim_accuracy, curve=curve,  # type: ignore[arg-type]
        extra={"explanation": config.explanation if config.use_gradients else None, "lam": config.lam})
