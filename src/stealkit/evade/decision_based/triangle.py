"""Triangle Attack (Wang, Zhang, Tong, Gong, He, Li and Liu, "Triangle Attack: A Query-efficient
Decision-based Adversarial Attack", ECCV 2022), L2, untargeted or targeted, label-only.

No gradient estimate and no binary search to the boundary: each candidate is built by geometry to be nearer
to the original ``x`` than the current adversarial point ``x_t`` and costs **one** query. Sec. 3 of the paper
(Alg. 1) with the constants of the authors' code (github.com/xiaosen-wang/TA); at ``x_t`` (``D = |x_t - x|``,
``u = (x_t - x) / D``), every iteration:

1. **a 2-D subspace**: a random direction in the low-frequency DCT space -- ``coords`` coefficients per
   channel picked at random among the lowest ``freq`` share of the frequencies per side, Gaussian values
   (:func:`~stealkit.evade.decision_based.subspace.dct_directions`; the reference code: 1 coefficient, 10% per side) --
   made orthogonal to ``u``: ``v``. The plane through ``x`` spanned by ``u`` and ``v`` holds ``x_t``.
2. **the triangle**: in that plane, a candidate ``x_new`` forms the triangle ``(x, x_t, x_new)`` with the
   angle ``beta`` at ``x`` (between ``u`` and ``x_new - x``) and the angle ``alpha`` at ``x_new``; by the law
   of sines ``|x_new - x| = D sin(alpha + beta) / sin(alpha)``, so

       ``x_new(beta, s) = x + D sin(alpha + beta) / sin(alpha) (cos(beta) u + s sin(beta) v)``,  ``s = +-1``,

   and ``|x_new - x| < D`` whenever ``beta > pi - 2 alpha`` (the angle at ``x_t`` is then the larger one,
   so the side opposite it, ``|x_new - x|``, is the shorter: the triangle's side-angle relation);
   ``beta = pi - alpha`` would collapse ``x_new`` onto ``x``.
3. **one query per candidate**: ``beta_0 = max(pi - 2 alpha, 0) + min(pi / 16, alpha / 2)`` on side
   ``s = +1``; if clean, on side ``-1`` (``alpha`` lowered first, ``beta`` at least ``pi - 2 alpha +
   pi / 64``); both clean: the iteration ends (2 queries).
4. **the search for a larger ``beta``** (nearer still): up to ``search_steps`` times, the midpoint of
   ``[beta_lo, pi - alpha]`` on the winning side, then on the other; the first adversarial candidate is kept
   and ends the iteration; after two clean ones the upper end moves down to that midpoint.
5. **the adaptive angle**: ``alpha`` (one per image, from ``init_alpha``) grows by ``alpha_up`` after an
   iteration that found a nearer point and shrinks by ``alpha_down`` after each clean candidate, kept in
   ``[pi/2 - half_range, pi/2 + half_range]``: a larger ``alpha`` gives bolder candidates.

Differences from the reference code (all of them; docs/guide/attacks.md names the reference): the start is HopSkipJump's
(uniform noise, binary search to the boundary, optionally the best of ``start_tries`` more noise directions,
:mod:`~stealkit.evade.decision_based.starts`; with a substitute its transfer example) instead of foolbox's blended-noise
line search, so that every attack of the benchmark starts alike; the DCT is orthonormal (so the geometry of
the coefficients is that of the pixels; the reference's ``torch_dct`` default is not); candidates are clipped
to the pixel box (as there; clipping only brings them nearer) and one is kept only if it is nearer than the
image's best so far; ``alpha`` is clamped to its range on every path.

All images move in lock-step: each candidate stage of an iteration is one batch of oracle calls for every
image still searching. Every query goes through :class:`~stealkit.evade.decision_based.decision.LabelAccess` (the ledger,
the per-image cap); with a per-image ``max_queries`` each image spends exactly its budget unless ``steps``
runs out first. HopSkipJump's ``opening`` option (:mod:`~stealkit.evade.decision_based.hopskipjump`) runs the Triangle
Attack for a share of the per-image budget and starts from its points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import TINY, AttackResult, check_batch, check_target, clip_box
from stealkit.evade.decision_based.decision import LabelAccess, binary_search, decision_result, lockstep
from stealkit.evade.decision_based.priors import SubstitutePrior, first_points
from stealkit.evade.decision_based.starts import best_of_noise
from stealkit.evade.decision_based.subspace import dct_directions
from stealkit.oracle import Oracle


@dataclass(frozen=True)
class TriangleConfig:
    """Angles in radians. ``freq``: share of the DCT frequencies per side the directions live on (the
    reference code's ``ratio_mask``); ``coords``: coefficients per channel and direction (``dim_num``; 0: all
    of the block); ``search_steps``: the reference's ``max_iter_num_in_2d``."""

    steps: int = 100_000
    freq: float = 0.1
    coords: int = 1
    search_steps: int = 2
    init_alpha: float = math.pi / 2
    alpha_up: float = 0.1
    alpha_down: float = 0.005
    half_range: float = 0.1
    start_tries: int = 0
    init_trials: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.search_steps < 0 or self.coords < 0 or self.start_tries < 0:
            raise InputError("steps, search_steps, coords and start_tries must be >= 0")
        if self.init_trials < 1:
            raise InputError(f"init_trials must be positive, got {self.init_trials}")
        if not (0 < self.freq <= 1):
            raise InputError(f"freq must be in (0, 1], got {self.freq!r}")
        if not (0 < self.half_range < math.pi / 4 and abs(self.init_alpha - math.pi / 2) <= self.half_range):
            raise InputError("half_range must be in (0, pi/4) radians and init_alpha within half_range of pi/2")
        if not (0 <= self.alpha_up < 1 and 0 <= self.alpha_down < 1):
            raise InputError("alpha_up and alpha_down must be in [0, 1) radians")


#: settings chosen on the validation images (``benchmarks/decision_attacks.py --tune``; docs/guide/attacks.md, "The
#: default and why")
TUNED: dict[str, object] = {"freq": 0.3, "coords": 3}


def triangle(oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
             target: torch.Tensor | int | None = None, starting_points: torch.Tensor | None = None,
             max_queries: int | None = None, config: TriangleConfig | None = None, batch_size: int = 256,
             substitute: nn.Module | None = None, used: torch.Tensor | None = None) -> AttackResult:
    """Minimise ``||x_adv - x||_2`` with the Triangle Attack using only labels (module docstring).

    ``substitute``: a stolen model whose transfer examples are the starting points (only victim queries are
    counted); ``used``: queries each image already spent under the same ``max_queries``. ``queries`` is the
    ledger's count.
    """
    cfg = config or TriangleConfig()
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"x has images of shape {list(x.shape[1:])}; the oracle takes {list(oracle.input_shape)}")
    if x.dim() != 4:
        raise InputError(f"the Triangle Attack searches the 2-D DCT of [C, H, W] images; got images of shape "
                         f"{list(x.shape[1:])}")
    tgt = check_target(target, y, targeted, oracle.num_classes)
    access = LabelAccess(oracle, y, tgt, max_queries=max_queries, batch_size=batch_size)
    if used is not None:
        access.used += used.long().cpu()
    gen = torch.Generator().manual_seed(cfg.seed)
    prior = SubstitutePrior(substitute, batch_size=batch_size) if substitute is not None else None
    best, found = first_points(access, x, y, tgt, starting_points=starting_points, prior=prior,
                               trials=cfg.init_trials, gen=gen)
    idx = found.nonzero().squeeze(1)
    if idx.numel():
        d = idx.to(x.device)
        tol = 1.0 / (x[0].numel() ** 1.5)
        best[d] = binary_search(access, x[d], best[d], idx, tol)
        if cfg.start_tries:
            best[d] = best_of_noise(access, x[d], best[d], idx, tries=cfg.start_tries, tol=tol, gen=gen)
        best[d] = _Triangles(access, x[d], idx, cfg, gen).run(best[d])
    return decision_result(access, x, y, tgt, best, found)


class _Triangles:
    """The lock-step iterations for a batch of images with verified adversarial points (rows aligned with
    ``x``; ``idx`` the images' indices in the access)."""

    def __init__(self, access: LabelAccess, x: torch.Tensor, idx: torch.Tensor, cfg: TriangleConfig,
                 gen: torch.Generator) -> None:
        self.access, self.x, self.idx, self.cfg, self.gen = access, x, idx, cfg, gen
        self.alpha = torch.full((x.shape[0],), cfg.init_alpha, dtype=torch.float64)
        self.lower, self.upper = math.pi / 2 - cfg.half_range, math.pi / 2 + cfg.half_range

    def run(self, best: torch.Tensor) -> torch.Tensor:
        lockstep(self.access, self.idx, self.cfg.steps, lambda sel: self._iteration(best, sel))
        return best

    @staticmethod
    def _first_beta(alpha: torch.Tensor) -> torch.Tensor:
        return (math.pi - 2 * alpha).clamp_min(0) + (alpha / 2).clamp(max=math.pi / 16)

    def _iteration(self, best: torch.Tensor, sel: torch.Tensor) -> None:
        """One triangle search for the rows ``sel`` (in place: ``best`` and ``alpha``)."""
        x, cfg = self.x, self.cfg
        d = sel.to(x.device)
        n = sel.numel()
        diff = (best[d] - x[d]).flatten(1)
        dist = diff.norm(dim=1).clamp_min(TINY)
        u = diff / dist.unsqueeze(1)
        r = dct_directions(n, tuple(x.shape[1:]), cfg.freq, self.gen, x.device, coords=cfg.coords).flatten(1)
        v = r - (r * u).sum(1, keepdim=True) * u
        v = v / v.norm(dim=1, keepdim=True).clamp_min(TINY)
        now = dist.clone()  # each row's best distance so far
        alpha = self.alpha[sel].clone()
        live = torch.ones(n, dtype=torch.bool)  # rows that can still pay for this iteration

        def ask(mask: torch.Tensor, beta: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
            """Query the candidates of the rows in ``mask`` that can pay; rows that cannot leave ``live``.
            Returns which rows found an adversarial candidate (kept in ``best`` when nearer)."""
            hit = torch.zeros(n, dtype=torch.bool)
            rows = mask.nonzero().squeeze(1)
            if rows.numel() == 0:
                return hit
            room = self.access.room(self.idx[sel[rows]], 1)
            live[rows[~room]] = False
            rows = rows[room]
            if rows.numel() == 0:
                return hit
            a, b, s = alpha[rows], beta[rows], side[rows]
            radius = dist[rows.to(x.device)] * (torch.sin(a + b) / torch.sin(a)).to(x.device, x.dtype)
            cb, sb = torch.cos(b).to(x.device, x.dtype), (s * torch.sin(b)).to(x.device, x.dtype)
            rd = rows.to(x.device)
            flat = radius.unsqueeze(1) * (cb.unsqueeze(1) * u[rd] + sb.unsqueeze(1) * v[rd])
            pts = clip_box(x[d[rd]] + flat.view(-1, *x.shape[1:]))
            adv = self.access.is_adv(pts, self.idx[sel[rows]]).cpu()
            near = (pts - x[d[rd]]).flatten(1).norm(dim=1).cpu() < now[rd].cpu()
            keep = rows[adv & near]
            if keep.numel():
                k = keep.to(x.device)
                best[d[k]] = pts[(adv & near).to(x.device)]
                now[k] = (best[d[k]] - x[d[k]]).flatten(1).norm(dim=1)
            hit[rows[adv]] = True
            return hit

        def lower(mask: torch.Tensor) -> None:
            alpha[mask] = (alpha[mask] - cfg.alpha_down).clamp(min=self.lower)

        beta = self._first_beta(alpha)
        side = torch.ones(n, dtype=torch.float64)
        won = ask(live.clone(), beta, side)
        fail = live & ~won
        lower(fail)
        beta = torch.where(fail, torch.maximum(beta, math.pi - 2 * alpha + math.pi / 64), beta)
        side[fail] = -1.0
        second = ask(fail, beta, side)
        clean = fail & live & ~second
        lower(clean)
        won |= second
        # the search for a larger beta on the rows whose first candidates found a nearer point
        searching = won & live
        hi = math.pi - alpha
        beta = (beta + hi) / 2
        for _ in range(cfg.search_steps):
            if not bool(searching.any()):
                break
            hit = ask(searching, beta, side)
            searching &= ~hit & live
            lower(searching)
            beta = torch.where(searching, torch.maximum(beta, math.pi - 2 * alpha + math.pi / 64), beta)
            side = torch.where(searching, -side, side)
            hit = ask(searching, beta, side)
            searching &= ~hit & live
            lower(searching)
            hi = torch.where(searching, beta, hi)
            beta = torch.where(searching, (self._first_beta(alpha) + hi) / 2, beta)
        alpha[won] = (alpha[won] + cfg.alpha_up).clamp(max=self.upper)
        self.alpha[sel] = alpha


__all__ = ["TUNED", "TriangleConfig", "triangle"]
