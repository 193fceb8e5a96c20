"""HopSkipJump (Chen, Jordan and Wainwright 2020, "HopSkipJumpAttack: a query-efficient decision-based
attack"), L2 version, label-only.

Algorithm 2 of the paper, with the reference code's constants: from an adversarial start (uniform noise, or
``starting_points``), repeat for ``iterations`` rounds:

1. binary search along the line to the original until within ``theta = gamma / d^{3/2}`` (blend factor) of
   the boundary (Alg. 1);
2. estimate the boundary's normal by Monte Carlo (Sec. 4.1, Eq. 9 with the baseline of Eq. 16):
   ``n_t = min(init_evals * sqrt(t), max_evals)`` unit random directions ``u_b`` probed at
   ``x_t + delta u_b`` with ``delta = sqrt(d) theta dist_{t-1}`` (``0.1`` in the first round), each
   answering ``phi_b = +1`` if adversarial else ``-1``; ``v = mean((phi_b - mean phi) u_b)``, normalised;
3. geometric step-size search (Sec. 4.2): ``xi = ||x_t - x|| / sqrt(t)``, halved until ``x_t + xi v`` is
   adversarial; then clip to [0, 1].

Every image goes through the oracle via :class:`~stealkit.evade.decision.LabelAccess`, never past
``max_queries`` per example or the ledger's budget; when the caps bind, the last verified point is kept.
Examples run one after another (their inner searches have different lengths); each round's probes are one
oracle call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stealkit.errors import InputError
from stealkit.evade.base import TINY, AttackResult, check_batch, check_target, clip_box
from stealkit.evade.decision import (
    LabelAccess,
    OutOfQueries,
    binary_search,
    check_starts,
    decision_result,
    find_starts,
)
from stealkit.oracle import Oracle


@dataclass(frozen=True)
class HopSkipJumpConfig:
    iterations: int = 40
    init_evals: int = 100
    max_evals: int = 10_000
    gamma: float = 1.0
    init_trials: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.init_evals < 1 or self.max_evals < 1 or self.init_trials < 1:
            raise InputError("iterations must be >= 0; init_evals, max_evals and init_trials positive")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise InputError(f"gamma must be a positive number, got {self.gamma!r}")


def hopskipjump(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
                target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
                max_queries: int | None = None, config: HopSkipJumpConfig | None = None,
                batch_size: int = 1024) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` with HopSkipJump using only labels (see the module docstring).

    Arguments as :func:`~stealkit.evade.boundary.boundary_attack`. ``queries`` is the ledger's count.
    """
    cfg = config or HopSkipJumpConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    if starting_points is not None:
        best, found = check_starts(access, x, starting_points)
    else:
        best, found = find_starts(access, x, trials=cfg.init_trials, gen=gen)
    d = x[0].numel()
    theta = cfg.gamma / (d * math.sqrt(d))
    for i in found.nonzero().squeeze(1).tolist():
        best[i] = _attack_one(access, x[i : i + 1], best[i : i + 1], i, cfg, theta, gen)[0]
    return decision_result(access, x, y, tgt, best, found)


def _attack_one(access: LabelAccess, x: torch.Tensor, adv: torch.Tensor, i: int, cfg: HopSkipJumpConfig,
                theta: float, gen: torch.Generator) -> torch.Tensor:
    """One example ``x`` [1, C, H, W] from a verified adversarial ``adv``; returns the last verified point."""
    owner = torch.tensor([i])
    adv = binary_search(access, x, adv, owner, theta)
    dist = float((adv - x).norm())
    d = x[0].numel()
    for t in range(1, cfg.iterations + 1):
        delta = 0.1 if t == 1 else math.sqrt(d) * theta * dist
        n_evals = min(int(cfg.init_evals * math.sqrt(t)), cfg.max_evals)
        n_evals = min(n_evals, _affordable(access, i, n_evals))
        if n_evals < 2:
            break
        u = torch.randn((n_evals, *x.shape[1:]), generator=gen).to(x.device)
        u = u / u.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (x.dim() - 1)))
        probes = clip_box(adv + delta * u)
        u = (probes - adv) / delta
        try:
            phi = access.is_adv(probes, owner.expand(n_evals)).float() * 2 - 1
        except OutOfQueries:
            break
        mean = float(phi.mean())
        if abs(mean) == 1.0:
            grad = mean * u.mean(0, keepdim=True)
        else:
            grad = ((phi - mean).view(-1, *([1] * (x.dim() - 1))) * u).mean(0, keepdim=True)
        grad = grad / grad.norm().clamp_min(TINY)
        xi = dist / math.sqrt(t)
        stepped = None
        while xi > 1e-12:
            cand = clip_box(adv + xi * grad)
            try:
                if bool(access.is_adv(cand, owner)[0]):
                    stepped = cand
                    break
            except OutOfQueries:
                return adv
            xi /= 2
        if stepped is None:
            break
        adv = binary_search(access, x, stepped, owner, theta)
        dist = float((adv - x).norm())
    return adv


def _affordable(access: LabelAccess, i: int, want: int) -> int:
    """How many of ``want`` queries example ``i`` may still spend (its cap and the ledger)."""
    caps = [want]
    if access.max_queries is not None:
        caps.append(access.max_queries - int(access.used[i]))
    left = access.oracle.ledger.remaining()
    if left is not None:
        caps.append(left)
    return max(0, min(caps))
