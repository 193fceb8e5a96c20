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

Optional additions, all off by default (then the attack is the paper's):

* ``substitute=`` a stolen model: the transfer adversarial example is the starting point and its input
  gradient the prior of step 2 (:mod:`stealkit.evade.decision_based.priors`: Suya et al. 2020; Cheng et al. 2019, P-RGF).
* ``config.subspace = s``: the random directions of step 2 are drawn on an ``s x s`` grid and upsampled
  (:mod:`stealkit.evade.decision_based.subspace`: Li et al. 2020, QEBA-S, Sec. 3.3).
* ``config.start_tries = k``: after the first binary search, ``k`` more uniform-noise directions, one query
  each, replace the start when nearer (:mod:`stealkit.evade.decision_based.starts`: Cheng et al. 2019, OPT-attack).
* ``config.tangent``: step 3 goes to the tangent point of a hemisphere of radius ``xi`` instead of along the
  normal (:mod:`stealkit.evade.decision_based.tangent`: Ma et al. 2021, Tangent Attack, Sec. 3.2-3.3).
* ``config.semicircle``: steps 3 and 1 are replaced by CGBA's search along the semicircle with diameter
  ``[x, x_t]`` in the plane of ``x_t - x`` and the estimate, bisected to ``arc_tol`` radians
  (:mod:`stealkit.evade.decision_based.semicircle`: Reza et al. 2023, CGBA, Sec. 3.2-3.3).
* ``config.history``: without a substitute, the previous round's estimate is the prior of step 2 (the
  P-RGF estimator of :mod:`stealkit.evade.decision_based.priors` with a time-dependent prior, Ilyas et al., "Prior
  Convictions", ICLR 2019, Sec. 3.1).
* ``config.schedule = "geoda"``: the evaluations per round follow GeoDA's allocation of the per-image budget
  (geometric growth ``eta^(-2t/3)``, the first round at least ``init_evals``; :mod:`stealkit.evade.decision_based.allocation`,
  Rahmati et al. CVPR 2020, Sec. 3.3) instead of ``init_evals * t^evals_power``; needs ``max_queries``.
* ``config.accumulate = r``: the normal used is the running sum of the (unnormalised) estimates, older ones
  weighted ``r`` per round (1: GeoDA's plain sum over iterations, Rahmati et al. 2020, Sec. 3 and their
  reference code), instead of this round's estimate alone.
* ``config.orthogonal``: the probe directions of step 2 are orthonormal in blocks of ``d`` instead of i.i.d.
  (:mod:`stealkit.evade.decision_based.orthogonal`: Choromanski et al. ICML 2018, Sec. 3), one random frame per round shared
  by the batch's examples (each takes its first ``n_t`` rows); full pixel space only.
* ``config.probe_freq = f``: the probe directions of step 2 are Gaussian on the lowest ``f`` share of the
  orthonormal 2-D DCT's frequencies per side (:func:`~stealkit.evade.decision_based.subspace.dct_directions`; the setting of
  CGBA's reference code, Reza et al. ICCV 2023, ``dim_reduc_factor = 1/f``), in every round or, with
  ``probe_rounds = k``, in rounds ``1..k`` only (full space after); [C, H, W] images only.
* ``config.shared_k = k``: a share ``shared_w`` of each image's probes in rounds ``2..shared_rounds`` (0: all)
  is drawn in the top-``k`` subspace of the estimates the run has made for its images over the last
  ``shared_window`` rounds (one per label with ``shared_class``); no model, only the attack's own label
  queries (:mod:`stealkit.evade.decision_based.shared_subspace`: Moosavi-Dezfooli et al. CVPR 2017, Sec. 4; Yan et al.
  NeurIPS 2019; Maheswaranathan et al. ICML 2019); a no-op with a single image. ``shared_prior``: instead,
  the previous estimate projected on that subspace is the P-RGF prior of :mod:`stealkit.evade.decision_based.priors`.
* ``config.opening = s``: the Triangle Attack (:mod:`stealkit.evade.decision_based.triangle`, Wang et al. ECCV 2022; its
  low-frequency DCT directions: ``opening_freq``, ``opening_coords``) spends a share ``s`` of the per-image
  budget first, and its points are the starts (one query re-checks each); needs ``max_queries``, and neither
  ``starting_points`` nor a substitute. ``opening_shrink``: its ``shrink`` (smaller turns after clean
  iterations, an extension of the paper; 1: off). ``opening_pool = p`` (with ``start_pool``): a share ``p`` of
  the opening's directions is ``x' - x`` for the attacker's images (:mod:`stealkit.evade.decision_based.pool_directions`,
  the nearest of each of ``opening_pool_dirs`` k-means clusters; 0: off, bitwise as before).
* ``start_pool=`` natural images the attacker owns (never the attacked ones) with ``config.pool_tries = k``:
  the ``k`` pool images nearest to each attacked image (pixel L2, no query) are tried as start directions, one
  query each at the best distance so far (:mod:`stealkit.evade.decision_based.image_starts`: Brendel et al. 2018, Sec. 3;
  Chen et al. 2020, Sec. 4; Cheng et al. 2019, Sec. 3.1); ``pool_at``: ``"after"`` (default) or ``"before"``
  the noise tries, or ``"opening"``: before the Triangle opening, which then starts from them;
  ``pool_spread = c``: the candidates are the nearest image of each of ``c`` k-means clusters. Without a pool
  the attack is as before, bit for bit.
* ``config.pca_k = k`` (with ``start_pool``): a share ``pca_w`` of each image's probes in rounds
  ``1..pca_rounds`` (0: all) is drawn in the span of the pool's top-``k`` principal components, computed once
  before the first query (:mod:`stealkit.evade.decision_based.pca_subspace`: Li et al. CVPR 2020, QEBA-I, Sec. 3.3).

:data:`TUNED` holds the additions chosen on validation images (the CLI's default ``--preset tuned``).

Every image goes through the oracle via :class:`~stealkit.evade.decision_based.decision.LabelAccess`, never past
``max_queries`` per example or the ledger's budget; when the caps bind, the last verified point is kept.
Near its cap an example shrinks its estimate so that the step search and binary search after it can still be
paid. All examples move in lock-step: the probes of every example in a round are one batch of oracle calls,
as are the step-size and binary searches (no per-query Python round trip).
"""

from __future__ import annotations

import math
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
from stealkit.evade.decision_based.image_starts import best_of_pool, check_pool
from stealkit.evade.decision_based.orthogonal import orthogonal_directions
from stealkit.evade.decision_based.pca_subspace import pca_basis
from stealkit.evade.decision_based.priors import (
    SubstitutePrior,
    first_points,
    prior_estimate,
    prior_probes,
    tilt,
    unit,
)
from stealkit.evade.decision_based.semicircle import search_cost, semicircle_search
from stealkit.evade.decision_based.shared_subspace import SharedSubspace, subspace_probes
from stealkit.evade.decision_based.starts import best_of_noise
from stealkit.evade.decision_based.subspace import check_side, dct_directions, random_directions, subspace_dim
from stealkit.evade.decision_based.tangent import tangent_points
from stealkit.evade.decision_based.triangle import TriangleConfig, triangle
from stealkit.oracle import Oracle

#: the fewest probes worth spending on one estimate
MIN_EVALS = 10


@dataclass(frozen=True)
class HopSkipJumpConfig:
    """``subspace``: grid side of low-frequency probe directions (0: full space). ``prior_spread``: how far
    from 50/50 the prior-tilted probes aim (see :func:`~stealkit.evade.decision_based.priors.tilt`); ``prior_agreement``:
    the agreement assumed before any was measured."""

    iterations: int = 40
    init_evals: int = 100
    max_evals: int = 10_000
    evals_power: float = 0.5
    gamma: float = 1.0
    init_trials: int = 100
    subspace: int = 0
    prior_spread: float = 0.5
    prior_agreement: float = 0.3
    start_tries: int = 0
    history: bool = False
    tangent: bool = False
    semicircle: bool = False
    arc_tol: float = 1e-4
    schedule: str = "power"
    eta: float = 0.6
    accumulate: float = 0.0
    orthogonal: bool = False
    opening: float = 0.0
    opening_freq: float = 0.3
    opening_coords: int = 3
    opening_shrink: float = 1.0
    opening_pool: float = 0.0
    opening_pool_dirs: int = 100
    probe_freq: float = 0.0
    probe_rounds: int = 0
    shared_k: int = 0
    shared_w: float = 0.5
    shared_window: int = 3
    shared_class: bool = False
    shared_rounds: int = 0
    shared_prior: bool = False
    pool_tries: int = 0
    pool_at: str = "after"
    pool_spread: int = 0
    pca_k: int = 0
    pca_w: float = 0.5
    pca_rounds: int = 0
    start_round: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.init_evals < 1 or self.max_evals < 1 or self.init_trials < 1:
            raise InputError("iterations must be >= 0; init_evals, max_evals and init_trials positive")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise InputError(f"gamma must be a positive number, got {self.gamma!r}")
        if not (0 <= self.evals_power <= 2):
            raise InputError(f"evals_power must be in [0, 2], got {self.evals_power!r}")
        if self.start_round < 1:
            raise InputError(f"start_round must be >= 1, got {self.start_round}")
        if self.start_tries < 0:
            raise InputError(f"start_tries must be >= 0, got {self.start_tries}")
        if self.schedule not in ("power", "geoda"):
            raise InputError(f"schedule must be 'power' or 'geoda', got {self.schedule!r}")
        if not (0 < self.eta < 1 and 0 <= self.accumulate <= 1):
            raise InputError(f"eta must be in (0, 1) and accumulate in [0, 1], got {self.eta!r}, {self.accumulate!r}")
        if not (0 < self.arc_tol < 1):
            raise InputError(f"arc_tol must be in (0, 1) (radians), got {self.arc_tol!r}")
        if self.subspace < 0:
            raise InputError(f"subspace must be 0 (full space) or a positive grid side, got {self.subspace}")
        if not (0 <= self.probe_freq <= 1 and self.probe_rounds >= 0):
            raise InputError(f"probe_freq must be in [0, 1] and probe_rounds >= 0, got {self.probe_freq!r}, "
                             f"{self.probe_rounds!r}")
        if self.probe_freq and self.subspace:
            raise InputError("probe_freq and subspace both choose the probe directions: set one")
        if self.shared_k < 0 or self.shared_window < 1 or self.shared_rounds < 0 or not 0 < self.shared_w < 1:
            raise InputError(f"shared_k must be >= 0, shared_w in (0, 1), shared_window >= 1 and shared_rounds >= 0; "
                             f"got {self.shared_k!r}, {self.shared_w!r}, {self.shared_window!r}, {self.shared_rounds!r}")
        if self.shared_prior and (not self.shared_k or self.history):
            raise InputError("shared_prior projects the previous estimate on the shared subspace: set shared_k, "
                             "not history")
        if self.shared_k and (self.subspace or self.probe_freq):
            raise InputError("shared_k draws probes in the pixel space: drop subspace / probe_freq")
        if self.pca_k < 0 or self.pca_rounds < 0 or not 0 < self.pca_w <= 1:
            raise InputError(f"pca_k and pca_rounds must be >= 0 and pca_w in (0, 1], got {self.pca_k!r}, "
                             f"{self.pca_rounds!r}, {self.pca_w!r}")
        if self.pca_k and (self.subspace or self.probe_freq or self.shared_k):
            raise InputError("pca_k draws probes in the pool's principal subspace: drop subspace / probe_freq / shared_k")
        if self.pool_spread < 0:
            raise InputError(f"pool_spread must be >= 0 (k-means clusters; 0: the nearest images), got {self.pool_spread!r}")
        if self.pool_tries < 0 or self.pool_at not in ("after", "before", "opening"):
            raise InputError(f"pool_tries must be >= 0 and pool_at 'after', 'before' or 'opening', got "
                             f"{self.pool_tries!r}, {self.pool_at!r}")
        if self.pool_at == "opening" and self.pool_tries and not self.opening:
            raise InputError("pool_at='opening' makes the Triangle opening's starts: set opening too")
        if not (0 <= self.opening_pool <= 1 and self.opening_pool_dirs >= 1):
            raise InputError(f"opening_pool must be in [0, 1] and opening_pool_dirs >= 1, got {self.opening_pool!r}, "
                             f"{self.opening_pool_dirs!r}")
        if self.opening_pool and not self.opening:
            raise InputError("opening_pool draws the Triangle opening's directions from the pool: set opening too")
        if not (0 < self.opening_shrink <= 1):
            raise InputError(f"opening_shrink must be in (0, 1], got {self.opening_shrink!r}")
        if not (0 <= self.opening < 1):
            raise InputError(f"opening must be a share of the per-image budget in [0, 1), got {self.opening!r}")
        if not (0 < self.prior_spread < 10 and 0 < self.prior_agreement < 1):
            raise InputError("prior_spread must be in (0, 10) and prior_agreement in (0, 1)")


#: settings chosen on validation images (``benchmarks/decision_attacks.py --tune``, docs/decision-attacks.md),
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
#: image of each of 100 k-means clusters of the pool, one query each (docs/decision-attacks.md)
TUNED_POOL: dict[str, object] = {"pool_tries": 100, "pool_spread": 100}
#: the opening only for images at least this many pixels high and wide: it won on Fashion-MNIST (28 x 28)
#: and lost on digits (8 x 8) on the validation images (docs/decision-attacks.md, fourth round)
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


def hopskipjump(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
                target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
                max_queries: int | None = None, config: HopSkipJumpConfig | None = None,
                batch_size: int = 256, substitute: nn.Module | None = None,
                used: torch.Tensor | None = None, start_pool: torch.Tensor | None = None) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` with HopSkipJump using only labels (see the module docstring).

    Arguments as :func:`~stealkit.evade.decision_based.boundary.boundary_attack`; ``substitute``: a stolen model for the
    prior and the starting points (its gradients are free; only victim queries are counted); ``used``:
    queries each example already spent under the same ``max_queries`` (a later phase); ``start_pool``: the
    attacker's own natural images [N, *shape] in [0, 1] for ``config.pool_tries`` (ignored without it: then
    the attack is as without a pool). ``queries`` is the ledger's count; ``extra["start_norms"]``: each
    example's L2 distance when the rounds begin (after every start phase; ``inf`` where none was found).
    """
    cfg = config or HopSkipJumpConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    if start_pool is not None:
        if not cfg.pool_tries and not cfg.opening_pool and not cfg.pca_k:
            raise InputError("a start pool is used only with pool_tries > 0, opening_pool > 0 or pca_k > 0 "
                             "(--set pool_tries=K)")
        start_pool = check_pool(start_pool, tuple(x.shape[1:]))
    elif cfg.opening_pool:
        raise InputError("opening_pool draws directions from the attacker's images: give start_pool (--start-pool)")
    if cfg.pca_k and (start_pool is None or not cfg.pca_k <= x[0].numel()):
        raise InputError(f"pca_k needs a start pool (the attacker's images: --start-pool pool|FILE) and at most "
                         f"{x[0].numel()} components")
    if cfg.pca_k and start_pool is not None and start_pool.shape[0] < 2:
        raise InputError("pca_k needs a start pool of at least two images for principal components")
    check_side(cfg.subspace, tuple(x.shape[1:]))
    if cfg.probe_freq and x.dim() != 4:
        raise InputError(f"probe_freq draws 2-D DCT directions of [C, H, W] images; got {list(x.shape[1:])}")
    if cfg.schedule == "geoda" and max_queries is None:
        raise InputError("schedule='geoda' plans a per-image budget: give max_queries (--max-queries)")
    if cfg.opening:
        return _opened(oracle, x, y, targeted=targeted, target=target, max_queries=max_queries, cfg=cfg,
                       batch_size=batch_size, substitute=substitute, starting_points=starting_points, used=used,
                       start_pool=start_pool)
    tgt = check_target(target, y, targeted, oracle.num_classes)
    # the pool's principal components before any query (a pool they cannot come from is an error, not a spend)
    pca = pca_basis(start_pool, cfg.pca_k) if cfg.pca_k and start_pool is not None else None
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    if used is not None:
        access.used += used.long().cpu()
    gen = torch.Generator().manual_seed(cfg.seed)
    prior = SubstitutePrior(substitute, batch_size=batch_size) if substitute is not None else None
    best, found = first_points(access, x, y, tgt, starting_points=starting_points, prior=prior,
                               trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    run = _Run(access, x, y, tgt, cfg, gen, prior, start_pool, pca)
    if idx.numel():
        run.attack(best, idx)
    res = decision_result(access, x, y, tgt, best, found)
    res.extra["rounds"] = run.rounds
    res.extra["start_norms"] = run.start_norms
    return res


def _opened(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool,
            target: torch.Tensor | int | None, max_queries: int | None, cfg: HopSkipJumpConfig, batch_size: int,
            substitute: nn.Module | None, starting_points: torch.Tensor | None, used: torch.Tensor | None,
            start_pool: torch.Tensor | None) -> AttackResult:
    """``config.opening``: the Triangle Attack for that share of the per-image budget, then HopSkipJump from
    its points (the per-image total never passes ``max_queries``; ``queries`` counts both phases)."""
    if max_queries is None or max_queries < 2:
        raise InputError("opening= spends a share of the per-image budget: give max_queries >= 2 (--max-queries)")
    if substitute is not None or starting_points is not None or used is not None:
        raise InputError("opening= makes the starting points: drop the substitute / starting_points")
    start = oracle.ledger.as_dict()
    share = max(1, int(cfg.opening * max_queries))
    pooled = start_pool is not None and cfg.pool_at == "opening"
    pre = _pool_opening(oracle, x, y, targeted=targeted, target=target, max_queries=share, cfg=cfg,
                        batch_size=batch_size, pool=start_pool) if pooled and start_pool is not None else None
    first = triangle(oracle, x, y, targeted=targeted, target=target, max_queries=share,
                     config=TriangleConfig(freq=cfg.opening_freq, coords=cfg.opening_coords, seed=cfg.seed,
                                           init_trials=cfg.init_trials, shrink=cfg.opening_shrink,
                                           pool_share=cfg.opening_pool, pool_dirs=cfg.opening_pool_dirs),
                     batch_size=batch_size, starting_points=None if pre is None else pre[0],
                     used=None if pre is None else pre[1], pool=start_pool if cfg.opening_pool else None)
    tries = 0 if pooled else cfg.pool_tries
    rest = hopskipjump(oracle, x, y, targeted=targeted, target=target, starting_points=first.x_adv,
                       max_queries=max_queries, config=replace(cfg, opening=0.0, opening_pool=0.0, pool_tries=tries),
                       batch_size=batch_size, used=first.extra["queries_per_example"],
                       start_pool=start_pool if tries or cfg.pca_k else None)
    # an image the opening found no start for has x itself as its start: HopSkipJump's check fails, as it should
    now = oracle.ledger.as_dict()
    rest.queries = {k: now.get(k, 0) - start.get(k, 0) for k in now}
    return rest


def _pool_opening(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool,
                  target: torch.Tensor | int | None, max_queries: int, cfg: HopSkipJumpConfig, batch_size: int,
                  pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``pool_at="opening"``: noise starts, their binary search and the pool tries, inside the opening's share
    of the budget; ``(points, queries per example)`` for the Triangle opening to start from (an image with no
    start keeps ``x``, which the opening's check finds clean)."""
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    best, found = first_points(access, x, y, tgt, starting_points=None, prior=None, trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    if idx.numel():
        d = idx.to(x.device)
        tol = cfg.gamma / (x[0].numel() ** 1.5)
        best[d] = binary_search(access, x[d], best[d], idx, tol)
        best[d] = best_of_pool(access, x[d], best[d], idx, pool, tries=cfg.pool_tries, tol=tol,
                               clusters=cfg.pool_spread)
    return torch.where(found.to(x.device).view(-1, *([1] * (x.dim() - 1))), best, x), access.used.clone()


class _Run:
    """The lock-step rounds of one call (state per example: distance, measured prior agreement)."""

    def __init__(self, access: LabelAccess, x: torch.Tensor, y: torch.Tensor, tgt: torch.Tensor | None,
                 cfg: HopSkipJumpConfig, gen: torch.Generator, prior: SubstitutePrior | None,
                 pool: torch.Tensor | None = None, pca: torch.Tensor | None = None) -> None:
        self.access, self.x, self.y, self.tgt, self.cfg, self.gen, self.prior = access, x, y, tgt, cfg, gen, prior
        #: the attacker's natural images for ``pool_tries`` (None: no pool starts)
        self.pool = pool if pool is not None and cfg.pool_tries else None
        #: with ``pca_k``: the pool's principal subspace [d, k] for a share of the probes
        self.pca = pca
        #: each example's distance when the rounds begin (inf: no start)
        self.start_norms = torch.full((x.shape[0],), math.inf)
        self.shape = tuple(x.shape[1:])
        d = x[0].numel()
        self.theta = cfg.gamma / (d * math.sqrt(d))
        self.dim = subspace_dim(self.shape, cfg.subspace)
        #: queries a binary search to tolerance theta needs, plus a few step-size halvings
        self.reserve = search_cost(cfg.arc_tol) if cfg.semicircle else math.ceil(math.log2(1 / self.theta)) + 3
        self.agree = torch.full((x.shape[0],), cfg.prior_agreement)
        #: each example's last estimate, the prior of the next one with ``history`` (zero: none yet)
        self.last = torch.zeros_like(x)
        #: rounds each example has estimated a normal in (a continued run starts at ``start_round``)
        self.rounds = torch.zeros(x.shape[0], dtype=torch.long)
        #: the running (decayed) sum of unnormalised estimates, with ``accumulate``
        self.acc = torch.zeros_like(x)
        #: with ``schedule="geoda"``: each example's evaluations per round (planned after its starts)
        self.plan: dict[int, list[int]] = {}
        #: with ``shared_k``: the run's recent estimates and their shared subspace (none with a substitute)
        self.shared = SharedSubspace(y, k=cfg.shared_k, window=cfg.shared_window, per_class=cfg.shared_class) \
            if cfg.shared_k and prior is None else None

    def attack(self, best: torch.Tensor, idx: torch.Tensor) -> None:
        """Improve ``best[idx]`` (verified adversarial) in place."""
        x = self.x
        best[idx] = binary_search(self.access, x[idx], best[idx], idx, self.theta)
        d = idx.to(x.device)
        if self.pool is not None and self.cfg.pool_at == "before":
            best[d] = best_of_pool(self.access, x[d], best[d], idx, self.pool, tries=self.cfg.pool_tries,
                                   tol=self.theta, clusters=self.cfg.pool_spread)
        if self.cfg.start_tries:
            best[d] = best_of_noise(self.access, x[d], best[d], idx, tries=self.cfg.start_tries, tol=self.theta,
                                    gen=self.gen)
        if self.pool is not None and self.cfg.pool_at == "after":
            best[d] = best_of_pool(self.access, x[d], best[d], idx, self.pool, tries=self.cfg.pool_tries,
                                   tol=self.theta, clusters=self.cfg.pool_spread)
        self.start_norms[idx] = (best[d] - x[d]).flatten(1).norm(dim=1).cpu()
        if self.cfg.schedule == "geoda":
            for i, left in zip(idx.tolist(), self.access.left(idx).tolist(), strict=True):
                self.plan[i] = geoda_plan(int(left), self.reserve, eta=self.cfg.eta, first=self.cfg.init_evals)
        active = torch.zeros(x.shape[0], dtype=torch.bool)
        active[idx] = True
        for t in range(self.cfg.start_round, self.cfg.start_round + self.cfg.iterations):
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
        want = torch.full((idx.numel(),), int(self.cfg.init_evals * t**self.cfg.evals_power), dtype=torch.long)
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

    def _estimate(self, best: torch.Tensor, idx: torch.Tensor, evals: torch.Tensor, t: int
                  ) -> torch.Tensor | None:
        """Unit boundary-normal estimates at ``best[idx]`` from one batch of probes (None: out of queries)."""
        x, cfg = self.x, self.cfg
        d_all = idx.to(x.device)
        dist = (best[d_all] - x[d_all]).flatten(1).norm(dim=1)
        delta = torch.full_like(dist, 0.1) if t == 1 else math.sqrt(x[0].numel()) * self.theta * dist
        priors = self.prior.direction(best[d_all], self.y[d_all], None if self.tgt is None else self.tgt[d_all]) \
            if self.prior is not None else None
        if priors is None and cfg.history and t > 1:
            priors = self.last[d_all]
        if priors is None and self.shared is not None and cfg.shared_prior and t > 1:
            priors = self.shared.project(idx, self.last[d_all])
        probes: list[torch.Tensor] = []
        # orthogonal probes: one Haar-random frame per round; every example takes its first n rows (so each
        # estimate is distributed as with a frame of its own, at the cost of one QR per round)
        low = bool(cfg.probe_freq) and (cfg.probe_rounds == 0 or t <= cfg.probe_rounds)
        frame = orthogonal_directions(int(evals.max()), self.shape, self.gen, x.device) \
            if cfg.orthogonal and not cfg.subspace and not low else None
        bases = self.shared.bases(idx) if self.shared is not None and t > 1 and priors is None and \
            (cfg.shared_rounds == 0 or t <= cfg.shared_rounds) else [None] * idx.numel()
        share = cfg.shared_w
        if self.pca is not None and priors is None and (cfg.pca_rounds == 0 or t <= cfg.pca_rounds):
            bases, share = [self.pca] * idx.numel(), cfg.pca_w
        for j, n in enumerate(evals.tolist()):
            basis = bases[j]
            ms = round(share * n) if basis is not None else 0
            if low:
                r = dct_directions(n, self.shape, cfg.probe_freq, self.gen, x.device)
            elif frame is not None:
                r = frame[: n - ms]
            else:
                r = random_directions(n - ms, self.shape, cfg.subspace, self.gen, x.device)
            if ms and basis is not None:
                r = torch.cat([subspace_probes(basis, ms, self.shape, self.gen).to(x.device), unit(r)])
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
        for j, part in enumerate(phi.split(evals.tolist())):
            u = (probes[j] - best[d_all[j]]) / delta[j]
            if priors is not None:
                est = prior_estimate(part, u, priors[j : j + 1], self.dim)
                self.agree[idx[j]] = 0.5 * float(self.agree[idx[j]]) + 0.5 * est.alpha
                out.append(est.normal)
                continue
            mean = float(part.mean())
            w = (part - mean) if abs(mean) < 1.0 else torch.full_like(part, mean)
            g = (w.view(-1, *([1] * (x.dim() - 1))) * u).mean(0, keepdim=True)
            if cfg.accumulate:
                i = int(d_all[j])
                self.acc[i] = cfg.accumulate * self.acc[i] + g[0]
                g = self.acc[i : i + 1]
            out.append(g / g.norm().clamp_min(TINY))
        grads = torch.cat(out)
        self.last[d_all] = grads
        if self.shared is not None:
            self.shared.add(idx, grads)
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
            if self.cfg.tangent:
                cand = clip_box(tangent_points(best[d_all[s]], x[d_all[s]], grads[s], xi[s]))
            else:
                cand = clip_box(best[d_all[s]] + xi[s].view(-1, *([1] * (x.dim() - 1))) * grads[s])
            ok = self.access.is_adv(cand, idx[sel]).cpu()
            stepped[s[ok.to(x.device)]] = cand[ok.to(x.device)]
            moved[sel[ok]] = True
            pending[sel[ok]] = False
            xi[s[~ok.to(x.device)]] /= 2
            pending &= (xi > 1e-12).cpu() | moved
        return stepped, moved


__all__ = ["TUNED", "TUNED_BUDGETED", "TUNED_POOL", "HopSkipJumpConfig", "hopskipjump", "tuned_settings"]
