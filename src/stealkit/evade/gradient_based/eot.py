"""Expectation over transformation for randomised models (Athalye et al. 2018; Li et al. 2019, Sec. 6.2).

Li et al. attack their noisy classifier with gradients averaged over the randomisation,
``E_r[grad L(x + r)] ~ 1/n sum_i grad L(x + r_i)``, ``r_i ~ N(0, sigma^2 I)``, and use the attacker's
knowledge of sigma. Two ways to get that here:

* ``pgd(..., eot_samples=n, eot_sigma=sigma)`` (and the other gradient attacks) average the *loss
  gradients* over n fresh draws per step: exactly the estimate of Li et al. Sec. 6.2.
* :class:`EOTModel` wraps a model so that *any* attack (C&W, PGD, ...) sees the smoothed soft classifier
  ``log mean_i softmax(f(x + r_i))``: its gradient is that of the expected probabilities (the Monte-Carlo
  smoothed classifier of Cohen et al. / Li et al. Alg. 1), drawn afresh at every forward pass.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from stealkit.errors import InputError


class EOTModel(nn.Module):
    """``forward(x) = log(1/n sum_i softmax(model(x + r_i)))``, ``r_i ~ N(0, sigma^2 I)``; differentiable.

    The outputs are log-probabilities, usable as logits by every attack (argmax = the Monte-Carlo smoothed
    prediction). Noise is drawn draw by draw (memory stays that of one forward pass) from the module's own
    ``torch.Generator`` (``seed``), so the same calls give the same numbers. ``sigma = 0`` or ``n = 1`` with
    ``sigma = 0`` reduces to ``log_softmax(model(x))``.
    """

    def __init__(self, model: nn.Module, sigma: float, n: int, *, seed: int = 0) -> None:
        super().__init__()
        if not (math.isfinite(sigma) and sigma >= 0):
            raise InputError(f"sigma must be a finite number >= 0, got {sigma!r}")
        if not isinstance(n, int) or n < 1:
            raise InputError(f"n must be a positive integer, got {n!r}")
        self.model = model
        self.sigma = float(sigma)
        self.n = int(n)
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        draws = self.n if self.sigma > 0 else 1
        log_probs = []
        for _ in range(draws):
            noisy = x + torch.randn(x.shape, generator=self.generator).to(x.device) * self.sigma if self.sigma else x
            log_probs.append(torch.log_softmax(self.model(noisy).float(), dim=1))
        return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(draws)
