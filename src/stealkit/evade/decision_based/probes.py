"""Probe directions for HopSkipJump's boundary-normal estimate: the ``probes=`` hook and its built-in sampler.

Step 2 of HopSkipJump (Chen et al. 2020, Sec. 4.1, Eq. 9) probes ``n_t`` random directions around the current
boundary point. Which directions is a research question of its own (QEBA's subspaces, Li et al. CVPR 2020;
orthogonal frames, Choromanski et al. ICML 2018; a run-shared or data-derived subspace), so the attack takes
them from a :data:`ProbeSampler`: a callable that gets one :class:`ProbeRound` and returns each example's raw
directions. The attack normalises them (or tilts them towards a substitute's prior) and pays one query each.
:class:`RandomProbes` is the built-in sampler: i.i.d. Gaussian in pixel space or on a low-frequency grid
(:func:`~stealkit.evade.decision_based.subspace.random_directions`, QEBA-S) or one orthogonal frame per round
(:func:`~stealkit.evade.decision_based.orthogonal.orthogonal_directions`); ``hopskipjump`` composes it from its
config's ``subspace`` and ``orthogonal`` when no sampler is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stealkit.evade.decision_based.orthogonal import orthogonal_directions
from stealkit.evade.decision_based.subspace import random_directions


@dataclass(frozen=True, eq=False)
class ProbeRound:
    """What a sampler knows in round ``t`` (1-based): the examples ``idx`` (indices into the attacked batch),
    their current boundary points ``points`` [B, *shape] (on the attack's device), the probes each gets
    (``counts``), each example's previous unit estimate ``previous`` [B, *shape] (zeros before its first) and the
    attack's seeded generator ``gen`` (draw from it, so that a seed fixes the run)."""

    t: int
    idx: torch.Tensor
    points: torch.Tensor
    counts: list[int]
    previous: torch.Tensor
    gen: torch.Generator


#: ``sampler(round) -> [directions of example j: [counts[j], *shape]]``, any scale (they are normalised)
ProbeSampler = Callable[[ProbeRound], list[torch.Tensor]]


@dataclass(frozen=True)
class RandomProbes:
    """The built-in sampler: Gaussian directions, on an ``subspace x subspace`` grid upsampled (0: pixel space),
    or with ``orthogonal`` (pixel space only) the first ``counts[j]`` rows of one Haar-random frame per round,
    shared by the round's examples (each estimate is distributed as with a frame of its own)."""

    subspace: int = 0
    orthogonal: bool = False

    def __call__(self, rnd: ProbeRound) -> list[torch.Tensor]:
        shape, device = tuple(rnd.points.shape[1:]), rnd.points.device
        if self.orthogonal and not self.subspace:
            frame = orthogonal_directions(max(rnd.counts), shape, rnd.gen, device)
            return [frame[:n] for n in rnd.counts]
        return [random_directions(n, shape, self.subspace, rnd.gen, device) for n in rnd.counts]


__all__ = ["ProbeRound", "ProbeSampler", "RandomProbes"]
