"""The Boundary attack (Brendel, Rauber and Bethge 2018, "Decision-based adversarial attacks"), label-only.

Sec. 3 of the paper: start from an adversarial point (uniform noise, or a given image of the target class),
then walk along the decision boundary towards the original. Each step draws a random perturbation orthogonal
to the direction of the original and projects it back onto the sphere around the original (the *spherical*
step of relative size ``spherical_step``), then moves a fraction ``source_step`` of the distance towards the
original. A candidate is kept only if the oracle still says it is adversarial, so the distance never grows.
Both step sizes adapt to the local geometry (Sec. 3.4): the spherical candidate is queried too and the steps
grow by ``step_adaptation`` when more than half of the recent spherical candidates are adversarial and shrink
below 20%; the source step also grows when more than 25% of full candidates succeed and shrinks below 10%
(the thresholds of the foolbox reference implementation). An example stops when its source step falls below
``convergence``.

With a stolen ``substitute`` (Brunner et al., "Guessing Smart: Biased Sampling for Efficient Black-Box
Adversarial Attacks", ICCV 2019, Sec. 3.3; Suya et al., "Hybrid Batch Attacks", USENIX Security 2020,
Sec. 4) the attack starts from the substitute's transfer example
(:func:`~stealkit.evade.decision_based.priors.transfer_starts`) and biases each spherical perturbation towards the
substitute's adversarial gradient: the random direction (orthogonal to the direction of the original) is
mixed with that gradient's orthogonal part, ``sqrt(1 - w^2) eta + w g``. ``w`` starts at ``prior_weight``
and is halved for an example each time its step statistics say "shrink the source step" (fewer than 10% of
full candidates adversarial): the prior is trusted as long as it keeps the walk moving, so a misleading one
decays to the plain attack instead of stalling it.

Every image is sent through the oracle (2 queries per example and step) via
:class:`~stealkit.evade.decision_based.decision.LabelAccess`, never past ``max_queries`` per example or the ledger's budget.
Used by Li et al. (2019), App. D.2, as the gradient-free check of a randomised model. All examples of a
batch move together (one oracle call per step for the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import TINY, AttackResult, check_batch, check_target, clip_box
from stealkit.evade.decision_based.decision import (
    LabelAccess,
    OutOfQueries,
    binary_search,
    decision_result,
)
from stealkit.evade.decision_based.priors import SubstitutePrior, first_points, unit
from stealkit.oracle import Oracle


@dataclass(frozen=True)
class BoundaryConfig:
    steps: int = 5000
    spherical_step: float = 0.01
    source_step: float = 0.01
    step_adaptation: float = 1.5
    window: int = 10
    convergence: float = 1e-7
    init_trials: int = 100
    prior_weight: float = 0.3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.window < 1 or self.init_trials < 1:
            raise InputError("steps must be >= 0, window and init_trials positive")
        if not 0 <= self.prior_weight < 1:
            raise InputError(f"prior_weight must be in [0, 1), got {self.prior_weight!r}")
        if not (self.spherical_step > 0 and self.source_step > 0 and self.step_adaptation > 1):
            raise InputError("spherical_step and source_step must be positive and step_adaptation > 1")


def _view(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.dim() - 1)))


def _proposals(x: torch.Tensor, best: torch.Tensor, sph: torch.Tensor, src: torch.Tensor, gen: torch.Generator,
               bias: torch.Tensor | None = None, weight: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical candidates and full candidates (spherical step, then a step towards the original); ``bias``:
    prior directions mixed into the spherical perturbation with per-example weights ``weight``."""
    diff = x - best
    dist = diff.flatten(1).norm(dim=1).clamp_min(TINY)
    direction = diff / _view(dist, x)
    eta = torch.randn(x.shape, generator=gen).to(x.device)
    eta = eta - _view((eta * direction).flatten(1).sum(1), x) * direction
    if bias is not None and weight is not None:
        g = bias - _view((bias * direction).flatten(1).sum(1), x) * direction
        eta = _view((1 - weight**2).sqrt(), x) * unit(eta) + _view(weight, x) * unit(g)
    eta = eta * _view(sph * dist / eta.flatten(1).norm(dim=1).clamp_min(TINY), x)
    moved = best + eta
    new_diff = x - moved
    moved = x - new_diff * _view(dist / new_diff.flatten(1).norm(dim=1).clamp_min(TINY), x)
    spherical = clip_box(moved)
    to_x = x - spherical
    to_x_norm = to_x.flatten(1).norm(dim=1).clamp_min(TINY)
    length = (src * dist + to_x_norm - dist).clamp_min(0) / to_x_norm
    return spherical, clip_box(spherical + _view(length, x) * to_x)


def boundary_attack(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
                    target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
                    max_queries: int | None = None, config: BoundaryConfig | None = None,
                    batch_size: int = 256, substitute: nn.Module | None = None) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` using only the oracle's labels (see the module docstring).

    ``starting_points``: adversarial images to start from (needed in practice for targeted attacks; without
    them random noise is tried). ``max_queries``: the most oracle queries spent on any one example,
    initialisation included. Examples without an adversarial start keep ``x`` and ``success=False``.
    ``queries`` is the ledger's count of what the attack spent; ``extra["queries_per_example"]`` the split.
    ``substitute``: a stolen model for the start and the biased proposals (its gradients cost no query).
    """
    cfg = config or BoundaryConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    prior = SubstitutePrior(substitute, batch_size=batch_size) if substitute is not None else None
    best, found = first_points(access, x, y, tgt, starting_points=starting_points, prior=prior,
                               trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    if idx.numel():
        best[idx] = binary_search(access, x[idx], best[idx], idx, 1e-3)
    n = x.shape[0]
    sph = torch.full((n,), cfg.spherical_step, device=x.device)
    src = torch.full((n,), cfg.source_step, device=x.device)
    weight = torch.full((n,), cfg.prior_weight, device=x.device)
    sph_stats = torch.zeros(n, cfg.window)
    step_stats = torch.zeros(n, cfg.window)
    filled = torch.zeros(n, dtype=torch.long)
    active = found.clone()
    for _ in range(cfg.steps):
        active &= src.cpu() >= cfg.convergence
        idx = active.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        room = access.room(idx, 2)
        active[idx[~room]] = False
        idx = idx[room]
        if idx.numel() == 0:
            break
        d = idx.to(x.device)
        bias = prior.direction(best[d], y[d], None if tgt is None else tgt[d]) if prior is not None else None
        spherical, cand = _proposals(x[d], best[d], sph[d], src[d], gen, bias, weight[d])
        try:
            adv = access.is_adv(torch.cat([spherical, cand]), torch.cat([idx, idx])).cpu()
        except OutOfQueries:
            break
        sph_adv, cand_adv = adv[: idx.numel()], adv[idx.numel():]
        best[d[cand_adv.to(x.device)]] = cand[cand_adv.to(x.device)]
        col = filled[idx] % cfg.window
        sph_stats[idx, col] = sph_adv.float()
        step_stats[idx, col] = cand_adv.float()
        filled[idx] += 1
        full = filled[idx] >= cfg.window
        if bool(full.any()):
            p_sph, p_step = sph_stats[idx].mean(1), step_stats[idx].mean(1)
            a = cfg.step_adaptation
            up = (full & (p_sph > 0.5)).to(x.device)
            down = (full & (p_sph < 0.2)).to(x.device)
            sph[d] = torch.where(up, sph[d] * a, torch.where(down, sph[d] / a, sph[d]))
            src[d] = torch.where(up, src[d] * a, torch.where(down, src[d] / a, src[d]))
            s_up = (full & (p_step > 0.25)).to(x.device)
            s_down = (full & (p_step < 0.1)).to(x.device)
            src[d] = torch.where(s_up, src[d] * a, torch.where(s_down, src[d] / a, src[d]))
            weight[d] = torch.where(s_down, weight[d] / 2, weight[d])
            reset = idx[full & ((p_sph > 0.5) | (p_sph < 0.2) | (p_step > 0.25) | (p_step < 0.1))]
            filled[reset] = 0
    return decision_result(access, x, y, tgt, best, found)


__all__ = ["BoundaryConfig", "boundary_attack"]
