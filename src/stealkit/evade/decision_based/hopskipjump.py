"""HopSkipJump (Chen, Jordan and Wainwright 2020, "HopSkipJumpAttack: a query-efficient decision-based
attack"), L2 version, label-only, with optional priors from a stolen substitute and subspace sampling.

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

Optional additions, all off by default (then the attack is the paper's, ``--preset paper``):

* ``substitute=`` a stolen model: the transfer adversarial example is the starting point and its input
  gradient the prior of step 2 (:mod:`stealkit.evade.decision_based.priors`: Suya et al. 2020; Cheng et al. 2019, P-RGF).
* ``config.subspace = s``: the random directions of step 2 are drawn on an ``s x s`` grid and upsampled
  (:mod:`stealkit.evade.decision_based.subspace`: Li et al. 2020, QEBA-S, Sec. 3.3).
* ``config.orthogonal``: the probe directions of step 2 are orthonormal in blocks of ``d`` instead of i.i.d.
  (:mod:`stealkit.evade.decision_based.orthogonal`: Choromanski et al. ICML 2018, Sec. 3), one random frame per
  round shared by the batch's examples (each takes its first ``n_t`` rows); full pixel space only.
* ``config.start_tries = k``: after the first binary search, ``k`` more uniform-noise directions, one query
  each, replace the start when nearer (:mod:`stealkit.evade.decision_based.starts`: Cheng et al. 2019, OPT-attack).
* ``start_pool=`` natural images the attacker owns (never the attacked ones) with ``config.pool_tries = k``:
  after the noise tries, the ``k`` pool images nearest to each attacked image (pixel L2, no query; with
  ``pool_spread = c`` the nearest image of each of ``c`` k-means clusters) are tried as start directions, one
  query each at the best distance so far (:mod:`stealkit.evade.decision_based.image_starts`: Brendel et al. 2018,
  Sec. 3; Chen et al. 2020, Sec. 4; Cheng et al. 2019, Sec. 3.1). Without a pool the attack is as before.
* ``config.semicircle``: steps 3 and 1 are replaced by CGBA's search along the semicircle with diameter
  ``[x, x_t]`` in the plane of ``x_t - x`` and the estimate, bisected to ``arc_tol`` radians
  (:mod:`stealkit.evade.decision_based.semicircle`: Reza et al. 2023, CGBA, Sec. 3.2-3.3).
* ``config.schedule = "geoda"``: the evaluations per round follow GeoDA's allocation of the per-image budget
  (geometric growth ``eta^(-2t/3)``, the first round at least ``init_evals``;
  :mod:`stealkit.evade.decision_based.allocation`, Rahmati et al. CVPR 2020, Sec. 3.3) instead of
  ``init_evals * sqrt(t)``; needs ``max_queries``.
* ``config.opening = s``: the Triangle Attack (:mod:`stealkit.evade.decision_based.triangle`, Wang et al. ECCV 2022;
  its low-frequency DCT directions: ``opening_freq``, ``opening_coords``) spends a share ``s`` of the per-image
  budget first, and its points are the starts (one query re-checks each); needs ``max_queries``, and neither
  ``starting_points`` nor a substitute.

:data:`TUNED` holds the additions chosen on validation images (the CLI's default ``--preset tuned``).

Two hooks let research variants plug in from the caller's code without config fields (as Foolbox's
``init_attack``): ``starts=`` a sequence of :class:`~stealkit.evade.decision_based.starts.StartFinder` that
replaces the start phase after the first binary search (default: ``NoiseStarts(start_tries)`` then
``PoolStarts(start_pool, pool_tries, pool_spread)``, each only when set), and ``probes=`` a
:data:`~stealkit.evade.decision_based.probes.ProbeSampler` that draws the directions of step 2 (default:
``RandomProbes(subspace, orthogonal)``).

Every image goes through the oracle via :class:`~stealkit.evade.decision_based.decision.LabelAccess`, never past
``max_queries`` per example or the ledger's budget; when the caps bind, the last verified point is kept.
Near its cap an example shrinks its estimate so that the step search and binary search after it can still be
paid. All examples move in lock-step: the probes of every example in a round are one batch of oracle calls,
as are the step-size and binary searches (no per-query Python round trip).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import TINY, AttackResult, check_batch, check_target, clip_box
from stealkit.evade.decision_based.allocation import geoda_plan
from stealkit.evade.decision_based.decision import (
    LabelAccess,
    OutOfQueries,
    binary_search,
    decision_result,
)
from stealkit.evade.decision_based.image_starts import PoolStarts, check_pool
from stealkit.evade.decision_based.priors import (
    SubstitutePrior,
    first_points,
    prior_estimate,
    prior_probes,
    tilt,
    unit,
)
from stealkit.evade.decision_based.probes import ProbeRound, ProbeSampler, RandomProbes
from stealkit.evade.decision_based.semicircle import search_cost, semicircle_search
from stealkit.evade.decision_based.starts import NoiseStarts, StartFinder
from stealkit.evade.decision_based.subspace import check_side, subspace_dim
from stealkit.evade.decision_based.triangle import TriangleConfig, triangle
from stealkit.oracle import Oracle

#: the fewest probes worth spending on one estimate
MIN_EVALS = 10


@dataclass(frozen=True)
class HopSkipJumpConfig:
    """The paper's settings (``iterations``, ``init_evals``, ``max_evals``, ``gamma``, ``init_trials``; Chen et al.
    2020, Sec. 4 and their reference code) and the validated additions of the module docstring. ``subspace``:
    grid side of low-frequency probe directions (0: full space). ``prior_spread``: how far from 50/50 the
    prior-tilted probes aim (see :func:`~stealkit.evade.decision_based.priors.tilt`); ``prior_agreement``: the
    agreement assumed before any was measured."""

    iterations: int = 40
    init_evals: int = 100
    max_evals: int = 10_000
    gamma: float = 1.0
    init_trials: int = 100
    subspace: int = 0
    prior_spread: float = 0.5
    prior_agreement: float = 0.3
    start_tries: int = 0
    semicircle: bool = False
    arc_tol: float = 1e-4
    schedule: str = "power"
    eta: float = 0.6
    orthogonal: bool = False
    opening: float = 0.0
    opening_freq: float = 0.3
    opening_coords: int = 3
    pool_tries: int = 0
    pool_spread: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.init_evals < 1 or self.max_evals < 1 or self.init_trials < 1:
            raise InputError("iterations must be >= 0; init_evals, max_evals and init_trials positive")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise InputError(f"gamma must be a positive number, got {self.gamma!r}")
        if self.start_tries < 0:
            raise InputError(f"start_tries must be >= 0, got {self.start_tries}")
        if self.schedule not in ("power", "geoda"):
            raise InputError(f"schedule must be 'power' or 'geoda', got {self.schedule!r}")
        if not (0 < self.eta < 1):
            raise InputError(f"eta must be in (0, 1), got {self.eta!r}")
        if not (0 < self.arc_tol < 1):
            raise InputError(f"arc_tol must be in (0, 1) (radians), got {self.arc_tol!r}")
        if self.subspace < 0:
            raise InputError(f"subspace must be 0 (full space) or a positive grid side, got {self.subspace}")
        if self.pool_spread < 0:
            raise InputError(f"pool_spread must be >= 0 (k-means clusters; 0: the nearest images), got {self.pool_spread!r}")
        if self.pool_tries < 0:
            raise InputError(f"pool_tries must be >= 0, got {self.pool_tries!r}")
        if not (0 <= self.opening < 1):
            raise InputError(f"opening must be a share of the per-image budget in [0, 1), got {self.opening!r}")
        if not (0 < self.prior_spread < 10 and 0 < self.prior_agreement < 1):
            raise InputError("prior_spread must be in (0, 10) and prior_agreement in (0, 1)")


#: settings chosen on validation images (``benchmarks/decision_attacks.py --tune``; docs/guide/attacks.md, "The default
#: and why"; what they measured: docs/results.md#decision-nosub),
#: the CLI's ``--preset tuned``: without and with a substitute
TUNED: dict[bool, dict[str, object]] = {False: {"start_tries": 100, "semicircle": True, "orthogonal": True},
                                       True: {"init_evals": 50, "subspace": 14}}
#: added to the tuned settings without a substitute when the per-image budget is known (``max_queries``):
#: GeoDA's allocation of it over the rounds (it plans a budget, so it needs one) and, since the fourth round,
#: the Triangle Attack for the first 10% of it (``opening``), then 30 noise tries instead of 100
TUNED_BUDGETED: dict[str, object] = {"schedule": "geoda", "init_evals": 50, "max_evals": 10_000, "opening": 0.1,
                                     "start_tries": 30}
#: added to the tuned settings without a substitute when the attacker gives its own natural images
#: (``start_pool``; the CLI's ``--start-pool``), since the seventh round: after the noise tries, the nearest
#: image of each of 100 k-means clusters of the pool, one query each (docs/guide/attacks.md, "The default and why")
TUNED_POOL: dict[str, object] = {"pool_tries": 100, "pool_spread": 100}
#: the opening only for images at least this many pixels high and wide: it won on Fashion-MNIST (28 x 28)
#: and lost on digits (8 x 8) on the validation images (docs/guide/attacks.md, "The default and why")
OPENING_MIN_SIDE = 16


def tuned_settings(*, substitute: bool, shape: tuple[int, ...] | None = None, budgeted: bool = False,
                   pool: bool = False) -> dict[str, object]:
    """The validated settings (:data:`TUNED`) for a run without or with a substitute, with
    :data:`TUNED_BUDGETED` when there is no substitute and a per-image budget (``budgeted``); for inputs of
    ``shape`` that are not [C, H, W] images the subspace (an image grid) is left out, and the opening (a DCT
    search) for those and for images smaller than :data:`OPENING_MIN_SIDE` (then the third round's noise tries
    stay); with ``pool`` (the attacker gives a start pool) and no substitute, :data:`TUNED_POOL`."""
    out = dict(TUNED[substitute])
    if budgeted and not substitute:
        out |= TUNED_BUDGETED
    if pool and not substitute:
        out |= TUNED_POOL
    if shape is not None and len(shape) != 3:
        out.pop("subspace", None)
    if shape is not None and (len(shape) != 3 or min(shape[1:]) < OPENING_MIN_SIDE) and "opening" in out:
        del out["opening"]
        out["start_tries"] = TUNED[False]["start_tries"]
    return out



def default_starts(cfg: HopSkipJumpConfig, pool: torch.Tensor | None = None) -> list[StartFinder]:
    """The start phase the config asks for: ``start_tries`` noise directions, then (with the attacker's images
    ``pool``) its ``pool_tries`` images; what ``hopskipjump(starts=None)`` runs."""
    out: list[StartFinder] = []
    if cfg.start_tries:
        out.append(NoiseStarts(cfg.start_tries))
    if pool is not None and cfg.pool_tries:
        out.append(PoolStarts(pool, cfg.pool_tries, cfg.pool_spread))
    return out


def hopskipjump(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
                target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
                max_queries: int | None = None, config: HopSkipJumpConfig | None = None,
                batch_size: int = 256, substitute: nn.Module | None = None,
                used: torch.Tensor | None = None, start_pool: torch.Tensor | None = None,
                starts: Sequence[StartFinder] | None = None, probes: ProbeSampler | None = None) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` with HopSkipJump using only labels (see the module docstring).

    Arguments as :func:`~stealkit.evade.decision_based.boundary.boundary_attack`; ``substitute``: a stolen model for the
    prior and the starting points (its gradients are free; only victim queries are counted); ``used``:
    queries each example already spent under the same ``max_queries`` (a later phase); ``start_pool``: the
    attacker's own natural images [N, *shape] in [0, 1] for ``config.pool_tries``. ``starts``: the start
    phase after the first binary search, run in order (None: :func:`default_starts`); ``probes``: the sampler
    of step 2's directions (None: ``RandomProbes(config.subspace, config.orthogonal)``). ``queries`` is the
    ledger's count; ``extra["start_norms"]``: each example's L2 distance when the rounds begin (after every
    start phase; ``inf`` where none was found).
    """
    cfg = config or HopSkipJumpConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    if start_pool is not None:
        if not cfg.pool_tries:
            raise InputError("a start pool is used only with pool_tries > 0 (--set pool_tries=K)")
        start_pool = check_pool(start_pool, tuple(x.shape[1:]))
    check_side(cfg.subspace, tuple(x.shape[1:]))
    if cfg.schedule == "geoda" and max_queries is None:
        raise InputError("schedule='geoda' plans a per-image budget: give max_queries (--max-queries)")
    if cfg.opening:
        return _opened(oracle, x, y, targeted=targeted, target=target, max_queries=max_queries, cfg=cfg,
                       batch_size=batch_size, substitute=substitute, starting_points=starting_points, used=used,
                       start_pool=start_pool, starts=starts, probes=probes)
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    if used is not None:
        access.used += used.long().cpu()
    gen = torch.Generator().manual_seed(cfg.seed)
    prior = SubstitutePrior(substitute, batch_size=batch_size) if substitute is not None else None
    best, found = first_points(access, x, y, tgt, starting_points=starting_points, prior=prior,
                               trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    run = _Run(access, x, y, tgt, cfg, gen, prior,
               default_starts(cfg, start_pool) if starts is None else list(starts),
               probes if probes is not None else RandomProbes(cfg.subspace, cfg.orthogonal))
    if idx.numel():
        run.attack(best, idx)
    res = decision_result(access, x, y, tgt, best, found)
    res.extra["rounds"] = run.rounds
    res.extra["start_norms"] = run.start_norms
    return res


def _opened(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool,
            target: torch.Tensor | int | None, max_queries: int | None, cfg: HopSkipJumpConfig, batch_size: int,
            substitute: nn.Module | None, starting_points: torch.Tensor | None, used: torch.Tensor | None,
            start_pool: torch.Tensor | None, starts: Sequence[StartFinder] | None,
            probes: ProbeSampler | None) -> AttackResult:
    """``config.opening``: the Triangle Attack for that share of the per-image budget, then HopSkipJump from
    its points (the per-image total never passes ``max_queries``; ``queries`` counts both phases)."""
    if max_queries is None or max_queries < 2:
        raise InputError("opening= spends a share of the per-image budget: give max_queries >= 2 (--max-queries)")
    if substitute is not None or starting_points is not None or used is not None:
        raise InputError("opening= makes the starting points: drop the substitute / starting_points")
    start = oracle.ledger.as_dict()
    share = max(1, int(cfg.opening * max_queries))
    first = triangle(oracle, x, y, targeted=targeted, target=target, max_queries=share,
                     config=TriangleConfig(freq=cfg.opening_freq, coords=cfg.opening_coords, seed=cfg.seed,
                                           init_trials=cfg.init_trials),
                     batch_size=batch_size)
    rest = hopskipjump(oracle, x, y, targeted=targeted, target=target, starting_points=first.x_adv,
                       max_queries=max_queries, config=replace(cfg, opening=0.0), batch_size=batch_size,
                       used=first.extra["queries_per_example"], start_pool=start_pool, starts=starts, probes=probes)
    # an image the opening found no start for has x itself as its start: HopSkipJump's check fails, as it should
    now = oracle.ledger.as_dict()
    rest.queries = {k: now.get(k, 0) - start.get(k, 0) for k in now}
    return rest


class _Run:
    """The lock-step rounds of one call (state per example: distance, measured prior agreement)."""

    def __init__(self, access: LabelAccess, x: torch.Tensor, y: torch.Tensor, tgt: torch.Tensor | None,
                 cfg: HopSkipJumpConfig, gen: torch.Generator, prior: SubstitutePrior | None,
                 starts: list[StartFinder], probes: ProbeSampler) -> None:
        self.access, self.x, self.y, self.tgt, self.cfg, self.gen, self.prior = access, x, y, tgt, cfg, gen, prior
        self.starts, self.probes = starts, probes
        #: each example's distance when the rounds begin (inf: no start)
        self.start_norms = torch.full((x.shape[0],), math.inf)
        self.shape = tuple(x.shape[1:])
        d = x[0].numel()
        self.theta = cfg.gamma / (d * math.sqrt(d))
        self.dim = subspace_dim(self.shape, cfg.subspace)
        #: queries a binary search to tolerance theta needs, plus a few step-size halvings
        self.reserve = search_cost(cfg.arc_tol) if cfg.semicircle else math.ceil(math.log2(1 / self.theta)) + 3
        self.agree = torch.full((x.shape[0],), cfg.prior_agreement)
        #: each example's last unit estimate (zero: none yet), for the probe sampler
        self.last = torch.zeros_like(x)
        #: rounds each example has estimated a normal in
        self.rounds = torch.zeros(x.shape[0], dtype=torch.long)
        #: with ``schedule="geoda"``: each example's evaluations per round (planned after its starts)
        self.plan: dict[int, list[int]] = {}

    def attack(self, best: torch.Tensor, idx: torch.Tensor) -> None:
        """Improve ``best[idx]`` (verified adversarial) in place."""
        x = self.x
        best[idx] = binary_search(self.access, x[idx], best[idx], idx, self.theta)
        d = idx.to(x.device)
        for find in self.starts:
            best[d] = find(self.access, x[d], best[d], idx, tol=self.theta, gen=self.gen)
        self.start_norms[idx] = (best[d] - x[d]).flatten(1).norm(dim=1).cpu()
        if self.cfg.schedule == "geoda":
            for i, left in zip(idx.tolist(), self.access.left(idx).tolist(), strict=True):
                self.plan[i] = geoda_plan(int(left), self.reserve, eta=self.cfg.eta, first=self.cfg.init_evals)
        active = torch.zeros(x.shape[0], dtype=torch.bool)
        active[idx] = True
        for t in range(1, 1 + self.cfg.iterations):
            idx = active.nonzero().squeeze(1)
            if idx.numel() == 0:
                break
            evals = self._evals(idx, t)
            active[idx[evals < 2]] = False
            idx, evals = idx[evals >= 2], evals[evals >= 2]
            if idx.numel() == 0:
                break
            grads = self._estimate(best, idx, evals, t)
            if grads is None:
                break
            self.rounds[idx] += 1
            if self.cfg.semicircle:
                d = idx.to(x.device)
                best[d] = semicircle_search(self.access, x[d], best[d], grads, idx, tol=self.cfg.arc_tol)
                continue
            stepped, moved = self._step(best, idx, grads, t)
            active[idx[~moved]] = False
            idx = idx[moved]
            if idx.numel():
                d = idx.to(x.device)
                best[d] = binary_search(self.access, x[d], stepped[moved.to(x.device)], idx, self.theta)

    def _evals(self, idx: torch.Tensor, t: int) -> torch.Tensor:
        """Probes per example this round: the schedule, cut to what each can pay and leave the searches."""
        want = torch.full((idx.numel(),), int(self.cfg.init_evals * t**0.5), dtype=torch.long)
        if self.cfg.schedule == "geoda":  # the planned size; the last planned round takes all that is left
            plans = [self.plan[i] for i in idx.tolist()]
            k = self.rounds[idx].tolist()
            want = torch.tensor([p[j] if j < len(p) - 1 else 2**62 for p, j in zip(plans, k, strict=True)],
                                dtype=torch.long)
        want = want.clamp(max=self.cfg.max_evals)
        left = self.access.left(idx) - self.reserve
        n = torch.minimum(want, left)
        n = torch.where(n >= want.clamp(max=MIN_EVALS), n, torch.zeros_like(n))
        budget = self.access.oracle.ledger.remaining()
        if budget is not None:  # the ledger pays examples in order; the last ones may get nothing
            budget = max(0, budget - self.reserve * idx.numel())
            n = torch.where(torch.cumsum(n, 0) <= budget, n, torch.zeros_like(n))
        return n

    def _directions(self, best: torch.Tensor, idx: torch.Tensor, evals: list[int], t: int) -> list[torch.Tensor]:
        """Each example's raw probe directions from the sampler, checked: ``[evals[j], *shape]``."""
        d_all = idx.to(self.x.device)
        raw = self.probes(ProbeRound(t=t, idx=idx, points=best[d_all], counts=evals, previous=self.last[d_all],
                                     gen=self.gen))
        if len(raw) != len(evals) or any(tuple(r.shape) != (n, *self.shape) for r, n in zip(raw, evals, strict=False)):
            raise InputError(f"the probe sampler must return one tensor [n_j, {', '.join(map(str, self.shape))}] per "
                             f"example, n_j = {evals}; got {[list(r.shape) for r in raw]}")
        return [r.to(self.x.device) for r in raw]

    def _estimate(self, best: torch.Tensor, idx: torch.Tensor, evals: torch.Tensor, t: int
                  ) -> torch.Tensor | None:
        """Unit boundary-normal estimates at ``best[idx]`` from one batch of probes (None: out of queries)."""
        x, cfg = self.x, self.cfg
        d_all = idx.to(x.device)
        dist = (best[d_all] - x[d_all]).flatten(1).norm(dim=1)
        delta = torch.full_like(dist, 0.1) if t == 1 else math.sqrt(x[0].numel()) * self.theta * dist
        priors = self.prior.direction(best[d_all], self.y[d_all], None if self.tgt is None else self.tgt[d_all]) \
            if self.prior is not None else None
        counts = evals.tolist()
        probes: list[torch.Tensor] = []
        for j, (n, r) in enumerate(zip(counts, self._directions(best, idx, counts, t), strict=True)):
            if priors is not None:
                c = tilt(float(self.agree[idx[j]]), self.dim, cfg.prior_spread)
                u = prior_probes(priors[j : j + 1], torch.cat([r, r[:1]]) if n % 2 else r, c)[:n]
            else:
                u = unit(r)
            probes.append(clip_box(best[d_all[j]] + delta[j] * u))
        try:
            phi = self.access.is_adv(torch.cat(probes), idx.repeat_interleave(evals)).float() * 2 - 1
        except OutOfQueries:
            return None
        out = []
        for j, part in enumerate(phi.split(counts)):
            u = (probes[j] - best[d_all[j]]) / delta[j]
            if priors is not None:
                est = prior_estimate(part, u, priors[j : j + 1], self.dim)
                self.agree[idx[j]] = 0.5 * float(self.agree[idx[j]]) + 0.5 * est.alpha
                out.append(est.normal)
                continue
            mean = float(part.mean())
            w = (part - mean) if abs(mean) < 1.0 else torch.full_like(part, mean)
            g = (w.view(-1, *([1] * (x.dim() - 1))) * u).mean(0, keepdim=True)
            out.append(g / g.norm().clamp_min(TINY))
        grads = torch.cat(out)
        self.last[d_all] = grads
        return grads

    def _step(self, best: torch.Tensor, idx: torch.Tensor, grads: torch.Tensor, t: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Geometric step-size search for every example at once: ``(stepped points, which found one)``."""
        x = self.x
        d_all = idx.to(x.device)
        xi = (best[d_all] - x[d_all]).flatten(1).norm(dim=1) / math.sqrt(t)
        stepped = best[d_all].clone()
        moved = torch.zeros(idx.numel(), dtype=torch.bool)
        pending = torch.ones(idx.numel(), dtype=torch.bool)
        while bool(pending.any()):
            sel = pending.nonzero().squeeze(1)
            room = self.access.room(idx[sel], 1)
            pending[sel[~room]] = False
            sel = sel[room & (xi[sel.to(x.device)] > 1e-12).cpu()]
            if sel.numel() == 0:
                break
            s = sel.to(x.device)
            cand = clip_box(best[d_all[s]] + xi[s].view(-1, *([1] * (x.dim() - 1))) * grads[s])
            ok = self.access.is_adv(cand, idx[sel]).cpu()
            stepped[s[ok.to(x.device)]] = cand[ok.to(x.device)]
            moved[sel[ok]] = True
            pending[sel[ok]] = False
            xi[s[~ok.to(x.device)]] /= 2
            pending &= (xi > 1e-12).cpu() | moved
        return stepped, moved


__all__ = ["TUNED", "TUNED_BUDGETED", "TUNED_POOL", "HopSkipJumpConfig", "default_starts", "hopskipjump",
           "tuned_settings"]
