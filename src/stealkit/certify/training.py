"""Training base classifiers for the smoothed classifier, and the empirical baselines it is compared with.

Li, Chen, Wang & Carin, "Certified Adversarial Robustness with Additive Gaussian Noise" (NeurIPS 2019):

- ``gaussian``: Gaussian data augmentation, training on ``x + N(0, sigma^2 I)`` (the paper's "lower bound
  without stability training" ablation of Sec. 6.1; Cohen et al.'s noise training).
- ``stability``: stability training with noise (STN), Sec. 5.1:
  ``L = CE(f(x), y) + gamma * CE(softmax f(x), f(x + N(0, sigma^2 I)))``, with gamma = 1 and Adam 1e-3 in the
  reference code (``official-code-notes.md``). The gradient flows through both the clean and the noisy branch.
- ``trades``: TRADES (Zhang et al. 2019; Sec. 3.4): ``CE(f(x), y) + beta * KL(f(x) || f(x_adv))``, with
  ``x_adv`` maximising the KL term by Linf PGD started at ``x + 0.001 N(0, I)``.
- ``pgd``: PGD adversarial training (Madry et al. 2018): ``CE(f(x_adv), y)``, ``x_adv`` by Linf PGD on the CE
  from a uniform random start.
- ``none``: plain cross entropy.

Noise is not clipped to [0, 1] (the smoothed classifier adds unclipped noise, Algorithm 1); adversarial
examples are clipped to [0, 1] and to the Linf ball.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.train import TrainConfig, fit

log = logging.getLogger(__name__)

RobustMethod = Literal["none", "gaussian", "stability", "trades", "pgd"]
METHODS: tuple[str, ...] = ("none", "gaussian", "stability", "trades", "pgd")


@dataclass(frozen=True)
class RobustTrainConfig:
    """How to train a robust base classifier.

    ``sigma`` is the training noise of ``gaussian``/``stability``; ``gamma`` the weight of the stability
    term; ``beta`` the TRADES weight; ``eps``/``step``/``steps`` the Linf PGD of ``trades``/``pgd``.
    ``train`` holds the optimiser, schedule, epochs, batch size and seed (its ``noise_sigma`` is unused).
    """

    method: RobustMethod = "stability"
    sigma: float = 0.5
    gamma: float = 1.0
    beta: float = 6.0
    eps: float = 0.3
    step: float = 0.01
    steps: int = 10
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"unknown training method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.method in ("gaussian", "stability") and not self.sigma > 0:
            raise InputError(f"--sigma must be > 0 for {self.method} training, got {self.sigma}")
        if self.sigma < 0 or self.gamma < 0 or self.beta < 0:
            raise InputError("sigma, gamma and beta must be >= 0")
        if self.method in ("trades", "pgd") and (self.eps <= 0 or self.step <= 0 or self.steps < 1):
            raise InputError(f"{self.method} needs eps > 0, step > 0 and steps >= 1")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def linf_pgd(
    objective: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    start: torch.Tensor,
    *,
    eps: float,
    step: float,
    steps: int,
) -> torch.Tensor:
    """Maximise ``objective(x_adv)`` (summed over the batch) by signed-gradient ascent in the Linf ball of
    radius ``eps`` around ``x`` intersected with [0, 1]; ``start`` is the first iterate (projected)."""
    x_adv = torch.min(torch.max(start, x - eps), x + eps).clamp(0.0, 1.0).detach()
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(x_adv), x_adv)
        x_adv = x_adv.detach() + step * grad.sign()
        x_adv = torch.min(torch.max(x_adv, x - eps), x + eps).clamp(0.0, 1.0).detach()
    return x_adv


def stability_loss(logits_clean: torch.Tensor, logits_noisy: torch.Tensor) -> torch.Tensor:
    """Cross entropy between the clean softmax and the noisy prediction, ``-sum_j P(j|x) log P(j|x')``."""
    return -(F.softmax(logits_clean, dim=1) * F.log_softmax(logits_noisy, dim=1)).sum(dim=1).mean()


def robust_loss(
    model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, config: RobustTrainConfig, gen: torch.Generator
) -> torch.Tensor:
    """The training loss of one batch under ``config.method`` (model in train mode on return)."""
    method = config.method

    def noise() -> torch.Tensor:
        return torch.randn(xb.shape, generator=gen).to(xb.device) * config.sigma

    if method == "none":
        return F.cross_entropy(model(xb), yb)
    if method == "gaussian":
        return F.cross_entropy(model(xb + noise()), yb)
    if method == "stability":
        both = model(torch.cat([xb, xb + noise()]))
        clean, noisy = both[: len(xb)], both[len(xb):]
        return F.cross_entropy(clean, yb) + config.gamma * stability_loss(clean, noisy)
    model.eval()
    if method == "trades":
        with torch.no_grad():
            p_clean = F.softmax(model(xb), dim=1)
        start = xb + 0.001 * torch.randn(xb.shape, generator=gen).to(xb.device)
        x_adv = linf_pgd(lambda z: F.kl_div(F.log_softmax(model(z), dim=1), p_clean, reduction="sum"),
                         xb, start, eps=config.eps, step=config.step, steps=config.steps)
        model.train()
        logits = model(torch.cat([xb, x_adv]))
        clean, adv = logits[: len(xb)], logits[len(xb):]
        kl = F.kl_div(F.log_softmax(adv, dim=1), F.softmax(clean, dim=1), reduction="batchmean")
        return F.cross_entropy(clean, yb) + config.beta * kl
    start = xb + (torch.rand(xb.shape, generator=gen).to(xb.device) * 2 - 1) * config.eps
    x_adv = linf_pgd(lambda z: F.cross_entropy(model(z), yb, reduction="sum"), xb, start,
                     eps=config.eps, step=config.step, steps=config.steps)
    model.train()
    return F.cross_entropy(model(x_adv), yb)


def train_robust(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: RobustTrainConfig,
    *,
    desc: str | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    device: str | torch.device = "cpu",
) -> list[dict[str, float]]:
    """Train ``model`` in place on ``(x, y)`` with ``config.method``; one ``{"epoch", "loss", "lr"}`` per epoch.

    Randomness (batch order, noise, PGD starts) comes from ``torch.Generator`` seeded with ``config.train.seed``.
    """
    if x.shape[0] != y.shape[0]:
        raise InputError(f"{x.shape[0]} inputs but {y.shape[0]} labels")
    return fit(model, x, y, config.train, desc=desc or f"{config.method} training", on_epoch=on_epoch,
               device=device, batch_loss=lambda m, xb, yb, gen: robust_loss(m, xb, yb, config, gen))
