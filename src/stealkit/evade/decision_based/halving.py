"""Successive halving over several HopSkipJump starts under a per-image query budget known in advance.

Jamieson and Talwalkar, "Non-stochastic Best Arm Identification and Hyperparameter Optimization" (AISTATS
2016), Sec. 3, Alg. 1 (successive halving): run ``k`` arms for a small budget each, keep the better half,
give the survivors more, until one is left. Here an arm is one HopSkipJump run from its own uniform-noise
start (Chen et al. 2020, Sec. 4; with ``start_tries`` each arm first keeps the nearest of several noise
directions, :mod:`stealkit.evade.decision_based.starts`), and "better" is the smaller L2 distance reached so far: which basin
a decision-based attack ends in is set early, and it decides much of its final distance.

Budget plan for a per-image budget ``B``: a ``share`` of ``B`` is spread evenly over the ``log2(k)`` halving
rungs (rung ``j`` runs ``k / 2^j`` arms, each capped at ``share B / (log2(k) k / 2^j)``); the last arm gets
what is left of ``B`` after the rungs' caps, so the per-image total never passes ``B``. A survivor continues
from its point (:func:`~stealkit.evade.decision_based.hopskipjump.hopskipjump` with ``starting_points``, one query to verify
it) and its round count (``start_round``), so its schedules go on where they stopped. Every query goes through
the oracle's ledger; the per-image counts reported are the sums over that image's arms.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from stealkit.errors import InputError
from stealkit.evade.base import AttackResult, Norm, flat_norms
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.oracle import Oracle


def rung_caps(budget: int, arms: int, share: float) -> list[int]:
    """Per-arm caps of the halving rungs (``arms``, ``arms/2``, ..., 2 arms) and, last, of the final arm."""
    rungs = int(math.log2(arms))
    caps = [int(share * budget / rungs / (arms >> j)) for j in range(rungs)]
    spent = sum(c * (arms >> j) for j, c in enumerate(caps))
    return [*caps, budget - spent]


def successive_halving(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, max_queries: int,
                       config: HopSkipJumpConfig | None = None, arms: int = 4, share: float = 0.3,
                       batch_size: int = 256) -> AttackResult:
    """Untargeted L2 HopSkipJump on ``x`` with ``arms`` starts per image halved down to one (module docstring).
    ``config`` holds the HopSkipJump settings of every arm (``start_tries`` only for the first rung)."""
    cfg = config or HopSkipJumpConfig()
    if arms < 2 or arms & (arms - 1):
        raise InputError(f"arms must be a power of two >= 2, got {arms}")
    if not 0 < share < 1:
        raise InputError(f"share must be in (0, 1), got {share!r}")
    if max_queries is None or max_queries < 1:
        raise InputError("successive halving needs a positive per-image budget (max_queries)")
    caps = rung_caps(max_queries, arms, share)
    if min(caps) < 2:
        raise InputError(f"a budget of {max_queries} is too small for {arms} arms")
    b = x.shape[0]
    start = oracle.ledger.as_dict()
    owner = torch.arange(b).repeat(arms)  # arm a of image i is row a * b + i
    used = torch.zeros(b, dtype=torch.long)
    points: torch.Tensor | None = None
    rounds = torch.zeros(owner.numel(), dtype=torch.long)
    norms = torch.full((owner.numel(),), math.inf)
    for j, cap in enumerate(caps):
        step = dataclasses.replace(cfg, seed=cfg.seed * 1000 + j, start_tries=cfg.start_tries if j == 0 else 0,
                                   start_round=cfg.start_round + (int(rounds.median()) if j else 0))
        r = hopskipjump(oracle, x[owner], y[owner], max_queries=cap, config=step, batch_size=batch_size,
                        starting_points=points)
        used += torch.bincount(owner, weights=r.extra["queries_per_example"].double(), minlength=b).long()
        rounds = rounds + r.extra["rounds"]
        norms = torch.where(r.success.cpu(), r.norms.cpu(), torch.full_like(norms, math.inf))
        keep = _better_half(norms, owner, b) if j < len(caps) - 1 else torch.arange(owner.numel())
        owner, rounds, norms = owner[keep], rounds[keep], norms[keep]
        points = r.x_adv[keep.to(x.device)]
    assert points is not None
    ok = torch.isfinite(norms).to(x.device)
    x_adv = torch.where(ok.view(-1, *([1] * (x.dim() - 1))), points, x)
    now = oracle.ledger.as_dict()
    return AttackResult(x_adv=x_adv, success=ok, norms=flat_norms(x_adv - x, Norm.L2), norm=Norm.L2,
                        labels=torch.where(ok, torch.full_like(y, -1), y),
                        queries={k: now.get(k, 0) - start.get(k, 0) for k in now},
                        extra={"queries_per_example": used, "caps": caps})


def _better_half(norms: torch.Tensor, owner: torch.Tensor, b: int) -> torch.Tensor:
    """Rows to keep: for every image, the nearer half of its arms (rows stay grouped arm-major)."""
    per = owner.numel() // b
    order = norms.view(per, b).argsort(dim=0, stable=True)[: per // 2]  # [per/2, b] arm indices
    return (order * b + torch.arange(b)).reshape(-1)


__all__ = ["rung_caps", "successive_halving"]
