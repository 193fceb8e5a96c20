"""What a stolen substitute gives a decision-based attack: a gradient prior and transfer starting points.

Two uses of a substitute of the victim (a model extracted by :mod:`stealkit.extract`), no victim query spent
on the substitute itself:

* **Starting points** -- Suya et al., "Hybrid Batch Attacks" (USENIX Security 2020), Sec. 4: transfer
  candidates crafted on the local model seed the query-based search. :func:`transfer_starts` walks each image
  up the substitute's adversarial margin (unit L2 steps) until the substitute flips, keeps the iterates at
  1, 1.5, 2, 3 and 4 times that many steps, asks the victim about all of them in one batch and starts from
  the nearest one it calls adversarial (images without one fall back to uniform noise).

* **A gradient prior** -- Cheng et al., "Improving Black-box Adversarial Attacks with a Transfer-based Prior"
  (P-RGF, NeurIPS 2019), Sec. 3.2: the random-gradient-free estimate is built around the transfer gradient
  ``v``, mixed with random directions orthogonal to it in proportion to how well ``v`` agrees with the true
  gradient (their ``alpha = cos(v, grad)``, estimated on the fly). With labels only (HopSkipJump's sign
  answers, Chen et al. 2020, Sec. 4.1), :func:`prior_estimate` adapts this: the probes are
  ``u_b = c v + sqrt(1 - c^2) r_b`` with ``r_b`` random unit directions orthogonal to ``v``. Near a locally
  flat boundary of normal ``n = alpha v + sqrt(1 - alpha^2) w`` the answer is ``sign(<n, u_b>)``, so the share
  ``p`` of adversarial answers is ``Phi(c alpha sqrt(d) / (sqrt(1 - c^2) sqrt(1 - alpha^2)))`` and gives
  ``alpha`` back; the same answers give the orthogonal part ``w`` as HopSkipJump's Monte-Carlo mean over the
  ``r_b``. The estimate is ``a v + b w_hat`` with ``(a, b)`` proportional to ``(alpha, beta sqrt(1 - alpha^2))``
  (``beta``: the measured cosine of ``w_hat``), the P-RGF optimum for a fixed mixing. The tilt ``c`` is set
  from the agreement measured so far (a running mean of ``alpha``) so that ``p`` stays informative. The probes come in
antithetic pairs (``+c`` and ``-c`` around the same ``r_b``) so that the centre's small offset from the
boundary (the binary search stops on the adversarial side) cancels out of the estimate of ``alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import TINY, clip_box, frozen
from stealkit.evade.decision_based.decision import LabelAccess, OutOfQueries, check_starts, find_starts

#: multiples of the substitute's flipping step count tried as starting points
START_SCALES: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)


def _view(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.dim() - 1)))


def unit(v: torch.Tensor) -> torch.Tensor:
    """Each row of ``v`` scaled to L2 norm 1."""
    return v / _view(v.flatten(1).norm(dim=1).clamp_min(TINY), v)


@dataclass
class SubstitutePrior:
    """A substitute model used for prior directions and starting points (never queried on the victim).

    ``target``: per-example target classes for a targeted attack, else ``None`` (untargeted).
    """

    model: nn.Module
    batch_size: int = 512

    def margin(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """The substitute's adversarial margin (> 0: the substitute calls ``x`` adversarial)."""
        z = self.model(x.to(self._device()))
        aim = (target if target is not None else y).to(z.device)
        own = z.gather(1, aim.view(-1, 1)).squeeze(1)
        other = z.scatter(1, aim.view(-1, 1), float("-inf")).amax(1)
        return own - other if target is not None else other - own

    def direction(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Unit gradient of the adversarial margin at ``x`` (towards the adversarial side), on ``x``'s device."""
        return self.direction_and_margin(x, y, target)[0]

    def direction_and_margin(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`direction` and the margin at ``x`` (on the CPU) from one forward pass."""
        grads, margins = [], []
        with frozen(self.model), torch.enable_grad():
            for i in range(0, x.shape[0], self.batch_size):
                xb = x[i : i + self.batch_size].detach().to(self._device()).requires_grad_(True)
                tb = target[i : i + self.batch_size] if target is not None else None
                m = self.margin(xb, y[i : i + self.batch_size], tb)
                (g,) = torch.autograd.grad(m.sum(), xb)
                grads.append(g)
                margins.append(m.detach().cpu())
        return unit(torch.cat(grads).to(x.device)), torch.cat(margins)

    def _device(self) -> torch.device:
        p = next(self.model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def candidates(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, *, step: float = 0.05,
                   max_steps: int = 200) -> torch.Tensor:
        """Transfer candidates [len(START_SCALES), B, ...]: margin ascent in unit-L2 steps of ``step``; an image
        leaves the batch once it has all its candidates (``max(START_SCALES)`` times its flipping step)."""
        b = x.shape[0]
        flip = torch.full((b,), max_steps, dtype=torch.long)  # max_steps: not flipped (yet)
        path = [x]
        active = torch.ones(b, dtype=torch.bool)
        for k in range(1, max_steps + 1):
            idx = active.nonzero().squeeze(1)
            d = idx.to(x.device)
            g, m = self.direction_and_margin(path[-1][d], y[d], None if target is None else target[d])
            if k > 1:  # the margin at iterate k - 1
                new = (m > 0) & (flip[idx] == max_steps)
                flip[idx[new]] = k - 1
                done = (flip[idx] < max_steps) & (k - 1 >= (flip[idx].float() * max(START_SCALES)).ceil())
                active[idx[done]] = False
                keep = ~done.to(x.device)
                idx, d, g = idx[~done], d[keep], g[keep]
            if idx.numel() == 0:
                break
            nxt = path[-1].clone()
            nxt[d] = clip_box(path[-1][d] + step * g)
            path.append(nxt)
        if bool(active.any()):  # the margin at the last iterate
            d = active.nonzero().squeeze(1).to(x.device)
            with torch.no_grad(), frozen(self.model):
                hit = (self.margin(path[-1][d], y[d], None if target is None else target[d]) > 0).cpu()
            idx = active.nonzero().squeeze(1)
            flip[idx[hit & (flip[idx] == max_steps)]] = len(path) - 1
        stack = torch.stack(path)
        rows = torch.arange(b)
        picks = [(flip.float() * s).ceil().long().clamp_max(len(path) - 1) for s in START_SCALES]
        return torch.stack([stack[p.to(stack.device), rows.to(stack.device)] for p in picks])


def transfer_starts(access: LabelAccess, prior: SubstitutePrior, x: torch.Tensor, y: torch.Tensor,
                    target: torch.Tensor | None, *, trials: int, gen: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting points from the substitute's transfer candidates (one victim query each), uniform noise for
    the images where none transfers: ``(starts, found)``."""
    cands = prior.candidates(x, y, target)
    k, b = cands.shape[0], x.shape[0]
    idx = torch.arange(b)
    ok = access.room(idx, k)
    starts, found = x.clone(), torch.zeros(b, dtype=torch.bool)
    sel = idx[ok]
    if sel.numel():
        d = sel.to(x.device)
        flat = cands[:, d].reshape(-1, *x.shape[1:])
        try:
            adv = access.is_adv(flat, sel.repeat(k)).view(k, -1).cpu()
        except OutOfQueries:
            adv = torch.zeros(k, sel.numel(), dtype=torch.bool)
        norms = (cands[:, d] - x[d]).flatten(2).norm(dim=2).cpu()
        norms = torch.where(adv, norms, torch.full_like(norms, float("inf")))
        best = norms.argmin(0)
        hit = adv.any(0)
        starts[d[hit.to(d.device)]] = cands[best[hit].to(x.device), d[hit.to(d.device)]]
        found[sel[hit]] = True
    if not bool(found.all()):
        rest = idx[~found]
        more, got = find_starts(access, x[rest.to(x.device)], trials=trials, gen=gen, owners=rest)
        starts[rest[got].to(x.device)] = more[got.to(x.device)]
        found[rest[got]] = True
    return starts, found


def first_points(access: LabelAccess, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, *,
                 starting_points: torch.Tensor | None, prior: SubstitutePrior | None, trials: int,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A decision attack's adversarial starts: ``(starts, found)`` -- the given ``starting_points`` (one query
    each checks them), else the substitute's transfer examples (:func:`transfer_starts`), else uniform noise."""
    if starting_points is not None:
        return check_starts(access, x, starting_points)
    if prior is not None:
        return transfer_starts(access, prior, x, y, target, trials=trials, gen=gen)
    return find_starts(access, x, trials=trials, gen=gen)


@dataclass
class PriorEstimate:
    """One prior-guided estimate: the unit normal and the measured agreement ``alpha = cos(v, n)``."""

    normal: torch.Tensor
    alpha: float


def tilt(agreement: float, dim: int, spread: float = 0.5) -> float:
    """The weight ``c`` of the prior in each probe: ``c / sqrt(1 - c^2) = spread sqrt(1 - a^2) / (a sqrt(d))``
    for the agreement ``a`` measured so far, which puts the share of adversarial answers near
    ``Phi(spread)`` if ``a`` is right."""
    a = min(max(abs(agreement), 0.02), 0.98)
    ratio = spread * math.sqrt(1 - a * a) / (a * math.sqrt(dim))
    return ratio / math.sqrt(1 + ratio * ratio)


def prior_probes(v: torch.Tensor, r: torch.Tensor, c: float) -> torch.Tensor:
    """Unit probe directions ``+-c v + sqrt(1 - c^2) r_b`` in antithetic pairs: row ``b`` of the first half and
    of the second half share ``r_b`` (the rows of ``r`` made orthogonal to ``v``) with opposite tilts. ``v``
    [1, ...] is unit; ``r`` [n, ...] raw random directions, n even (an odd last row is dropped)."""
    half = r.shape[0] // 2
    r = r[:half] - _view((r[:half] * v).flatten(1).sum(1), r[:half]) * v
    rest = math.sqrt(1 - c * c) * unit(r)
    return torch.cat([c * v + rest, -c * v + rest])


def _probit(k: int, n: int) -> float:
    """``Phi^{-1}`` of the smoothed share ``(k + 0.5) / (n + 1)``."""
    return math.sqrt(2) * float(torch.erfinv(torch.tensor(2 * (k + 0.5) / (n + 1) - 1)))


def prior_estimate(phi: torch.Tensor, u: torch.Tensor, v: torch.Tensor, dim: int) -> PriorEstimate:
    """The prior-guided estimate of the boundary normal from sign answers ``phi`` (+1 adversarial, -1 not)
    at the antithetic probe directions ``u`` [n, ...] of :func:`prior_probes` (as sent, i.e. after clipping)
    around prior ``v`` [1, ...]; ``dim``: the dimension the random parts were drawn in.

    ``alpha`` comes from the difference of the probits of the two halves' shares of adversarial answers,
    ``(t_+ - t_-) / 2 = c alpha sqrt(d) / (sqrt(1 - c^2) sqrt(1 - alpha^2))``, which cancels the offset of a
    probe centre lying slightly on the adversarial side of the boundary; ``w`` is the Monte-Carlo mean of
    ``(phi_b - mean phi) r_b`` within each half (each half its own baseline, Eq. 16 of Chen et al.).
    """
    a_b = (u * v).flatten(1).sum(1)
    rest = u - _view(a_b, u) * v
    n = phi.numel()
    up = torch.arange(n, device=phi.device) < (n + 1) // 2
    n_up, n_down = int(up.sum()), int((~up).sum())
    if n_down == 0:
        raise InputError("prior_estimate needs probes tilted both ways (see prior_probes)")
    c = float(a_b[up].mean() - a_b[~up].mean()) / 2
    s = float(rest.flatten(1).norm(dim=1).mean())
    diff = (_probit(int((phi[up] > 0).sum()), n_up) - _probit(int((phi[~up] > 0).sum()), n_down)) / 2
    rho = diff * s / (max(c, 1e-6) * math.sqrt(dim))
    alpha = rho / math.sqrt(1 + rho * rho)
    centred = torch.where(_view(up, rest), _view(phi - phi[up].mean(), rest), _view(phi - phi[~up].mean(), rest))
    centred = centred * rest
    w = centred.mean(0, keepdim=True)
    w = w - float((w * v).sum()) * v
    w_norm = float(w.norm())
    noise = float(centred.flatten(1).pow(2).sum(1).mean()) / n
    beta = math.sqrt(max(w_norm**2 - noise, 0.0)) / w_norm if w_norm > TINY else 0.0
    a, b = alpha, beta * math.sqrt(max(1 - alpha * alpha, 0.0))
    if a == 0 and b == 0:
        b = 1.0 if w_norm > TINY else 0.0
        a = 0.0 if w_norm > TINY else 1.0
    est = a * v + (b / max(w_norm, TINY)) * w
    return PriorEstimate(normal=unit(est), alpha=alpha)


def load_prior(model: nn.Module | None) -> SubstitutePrior | None:
    if model is None:
        return None
    if not isinstance(model, nn.Module):
        raise InputError(f"substitute must be a torch module, got {type(model).__name__}")
    return SubstitutePrior(model)


__all__ = ["START_SCALES", "PriorEstimate", "SubstitutePrior", "first_points", "load_prior", "prior_estimate", "prior_probes",
           "tilt", "transfer_starts", "unit"]
