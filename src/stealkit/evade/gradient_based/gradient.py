"""Gradient attacks on a differentiable (substitute) model: FGSM, BIM, PGD and MI-FGSM as one loop.

The attacks CoDFe launches from its stolen substitute (CoDFe Sec. 2 "Adversarial attacks", Sec. 4.1):

* FGSM (Goodfellow et al. 2015): one step of size eps along the gradient's sign.
* BIM (Kurakin et al. 2017): ``steps`` steps of size ``step``, projected after each; no random start.
* PGD (Madry et al. 2018): BIM from a uniformly random point of the ball, best of ``restarts`` runs.
* MI-FGSM (Dong et al. 2018): BIM whose step follows a momentum of L1-normalised gradients,
  ``g <- mu g + grad / ||grad||_1``.

They differ only in the start, the step and the projection, which depend on the norm (Linf or L2), as in
foolbox 3. Targeted attacks descend the cross-entropy of the target class; untargeted ones ascend that of
the true class. With ``eot_samples > 1`` every gradient is the mean over that many draws
``x + r, r ~ N(0, eot_sigma^2 I)`` of the loss gradient (expectation over transformation, Athalye et al.
2018; the estimate of Li et al. 2019, Sec. 6.2, for attacking randomised / smoothed classifiers).
Clipping to the ball and to [0, 1] happens only in :func:`stealkit.evade.base.project`.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import (
    TINY,
    AttackResult,
    Norm,
    check_batch,
    check_target,
    flat_norms,
    frozen,
    is_success,
    model_labels,
    project,
)


@dataclass(frozen=True)
class GradientAttackConfig:
    """Settings of the shared loop. ``momentum`` (MI-FGSM's decay mu) of ``None`` means plain steps."""

    eps: float
    step: float
    steps: int
    norm: Norm = Norm.LINF
    random_start: bool = False
    restarts: int = 1
    momentum: float | None = None
    targeted: bool = False
    eot_samples: int = 1
    eot_sigma: float = 0.0
    seed: int = 0
    batch_size: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "norm", Norm.parse(self.norm))
        for name in ("eps", "step", "eot_sigma"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("steps", "restarts", "eot_samples", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InputError(f"{name} must be a positive integer, got {v!r}")
        if self.momentum is not None and not (math.isfinite(self.momentum) and self.momentum >= 0):
            raise InputError(f"momentum must be a finite number >= 0, got {self.momentum!r}")


# -- the three per-norm pieces ----------------------------------------------------------------------------
def _draw_start(shape: torch.Size, norm: Norm, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """The random start's draws from the CPU generator (Linf: ``U(-1, 1)`` per pixel; L2: a Gaussian direction and
    a uniform ``[B]`` for the radius), in the order the generator gives them."""
    if norm is Norm.LINF:
        return (torch.rand(shape, generator=gen) * 2 - 1,)
    return torch.randn(shape, generator=gen), torch.rand(shape[0], generator=gen)


def _place_start(draws: tuple[torch.Tensor, ...], x: torch.Tensor, eps: float, norm: Norm) -> torch.Tensor:
    """The start of :func:`_draw_start`'s draws (already on ``x``'s device), projected: a uniformly random point of
    the ball (Linf: uniform cube; L2: uniform in the ball)."""
    if norm is Norm.LINF:
        delta = draws[0] * eps
    else:
        d = x[0].numel()
        u = draws[0]
        u = u / u.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (x.dim() - 1)))
        r = draws[1] ** (1.0 / d) * eps
        delta = u * r.view(-1, *([1] * (x.dim() - 1)))
    return project(x + delta, x, eps, norm)


def _random_start(x: torch.Tensor, eps: float, norm: Norm, gen: torch.Generator) -> torch.Tensor:
    """A uniformly random point of the ball, drawn now from ``gen`` (the CPU generator) and moved to ``x``'s device."""
    return _place_start(tuple(t.to(x.device) for t in _draw_start(x.shape, norm, gen)), x, eps, norm)


class _Starts:
    """The random starts of a run on an accelerator, drawn ahead in a helper thread (issue 53).

    The draws come from the same CPU generator in the same order as :func:`_random_start` would take them (only
    when nothing else draws from it: no EOT noise), are pinned and copied without waiting for the device, so the
    device never idles while the CPU draws the next batch's start and a pageable copy does not drain its queue.
    The examples are bit for bit those of the inline draws. At most ``ahead`` batches are drawn ahead (memory).
    """

    def __init__(self, shapes: list[torch.Size], norm: Norm, gen: torch.Generator, device: torch.device,
                 ahead: int = 2) -> None:
        self._shapes, self._norm, self._gen, self._device = iter(shapes), norm, gen, device
        self._pin = device.type == "cuda" and torch.backends.cuda.is_built()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stealkit-pgd-starts")
        self._pending: list[Future[tuple[torch.Tensor, ...]]] = []  # futures, in draw order (one worker: FIFO, so the generator's order is kept)
        for _ in range(ahead):
            self._submit()

    def _submit(self) -> None:
        shape = next(self._shapes, None)
        if shape is not None:
            self._pending.append(self._pool.submit(self._draw, shape))

    def _draw(self, shape: torch.Size) -> tuple[torch.Tensor, ...]:
        draws = _draw_start(shape, self._norm, self._gen)
        return tuple(t.pin_memory() for t in draws) if self._pin else draws

    def next(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        draws = self._pending.pop(0).result()
        self._submit()
        return _place_start(tuple(t.to(self._device, non_blocking=True) for t in draws), x, eps, self._norm)

    def close(self) -> None:
        for f in self._pending:
            f.cancel()
        self._pool.shutdown(wait=True)


def _unit_step(g: torch.Tensor, norm: Norm) -> torch.Tensor:
    """The steepest-ascent direction of unit norm: sign(g) for Linf, g / ||g||_2 for L2."""
    if norm is Norm.LINF:
        return g.sign()
    return g / g.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (g.dim() - 1)))


# -- the loop --------------------------------------------------------------------------------------------
def _loss_grad(model: nn.Module, x_adv: torch.Tensor, labels: torch.Tensor, sign: float, cfg: GradientAttackConfig,
               gen: torch.Generator) -> torch.Tensor:
    """Gradient of ``sign * CE(model(x_adv [+ noise]), labels)`` (summed over the batch), EOT-averaged.

    Untargeted (``sign`` 1) differentiates the loss itself (no multiply and its backward node per step); targeted
    differentiates ``-loss``, which is bit for bit ``-1.0 * loss``."""
    total: torch.Tensor | None = None
    for _ in range(cfg.eot_samples):
        xa = x_adv.detach().requires_grad_(True)
        inp = xa
        if cfg.eot_sigma > 0:
            inp = xa + torch.randn(xa.shape, generator=gen).to(xa.device) * cfg.eot_sigma
        loss = F.cross_entropy(model(inp), labels, reduction="sum")
        (g,) = torch.autograd.grad(loss if sign > 0 else -loss, xa)
        total = g if total is None else total + g
    assert total is not None
    return total if cfg.eot_samples == 1 else total / cfg.eot_samples


def _run_once(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, sign: float, cfg: GradientAttackConfig,
              gen: torch.Generator, starts: _Starts | None = None) -> torch.Tensor:
    if not cfg.random_start:
        x_adv = x.clone()
    else:
        x_adv = starts.next(x, cfg.eps) if starts is not None else _random_start(x, cfg.eps, cfg.norm, gen)
    velocity = torch.zeros_like(x) if cfg.momentum is not None else None
    linf = cfg.norm is Norm.LINF
    for _ in range(cfg.steps):
        g = _loss_grad(model, x_adv, labels, sign, cfg, gen)
        if velocity is not None:
            l1 = g.abs().flatten(1).sum(1).clamp_min(TINY).view(-1, *([1] * (x.dim() - 1)))
            velocity = cfg.momentum * velocity + g / l1
            g = velocity
        if linf and velocity is None:
            # g is this step's own tensor: its sign in place, and ``x_adv + step * sign`` as one add (step * +-1
            # and 0 are exact, so the fused multiply-add rounds as the separate ones did: the same bits)
            x_adv = project(torch.add(x_adv, g.sign_(), alpha=cfg.step), x, cfg.eps, cfg.norm)
        else:
            x_adv = project(x_adv + cfg.step * _unit_step(g, cfg.norm), x, cfg.eps, cfg.norm)
    return x_adv.detach()


def gradient_attack(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: GradientAttackConfig, *,
                    target: torch.Tensor | int | None = None) -> AttackResult:
    """Run the shared loop on ``model`` (white-box: its own gradients) in chunks of ``config.batch_size``.

    With ``restarts > 1`` each example keeps the first successful restart, else the one of highest loss.
    Randomness (start, EOT noise) comes from one ``torch.Generator`` seeded with ``config.seed``.
    """
    x, y = check_batch(x, y)
    tgt = check_target(target, y, config.targeted)
    gen = torch.Generator().manual_seed(config.seed)
    sign = -1.0 if config.targeted else 1.0
    aim = tgt if tgt is not None else y
    outs: list[torch.Tensor] = []
    starts = None
    if config.random_start and config.eot_sigma == 0 and x.device.type != "cpu" and x.shape[0]:
        # the starts are the generator's only draws: draw them ahead, off the device's critical path
        shapes = [x[i : i + config.batch_size].shape for i in range(0, x.shape[0], config.batch_size)
                  for _ in range(config.restarts)]
        starts = _Starts(shapes, config.norm, gen, x.device)
    with frozen(model), torch.enable_grad():
        try:
            for i in range(0, x.shape[0], config.batch_size):
                xb, ab = x[i : i + config.batch_size], aim[i : i + config.batch_size]
                yb = y[i : i + config.batch_size]
                tb = tgt[i : i + config.batch_size] if tgt is not None else None
                best = _run_once(model, xb, ab, sign, config, gen, starts)
                if config.restarts > 1:
                    best_ok, best_loss = _score(model, best, yb, ab, tb, sign)
                    for _ in range(config.restarts - 1):
                        cand = _run_once(model, xb, ab, sign, config, gen, starts)
                        ok, loss = _score(model, cand, yb, ab, tb, sign)
                        take = (ok & ~best_ok) | (~ok & ~best_ok & (loss > best_loss))
                        best = torch.where(take.view(-1, *([1] * (x.dim() - 1))), cand, best)
                        best_ok, best_loss = best_ok | ok, torch.where(take, loss, best_loss)
                outs.append(best)
        finally:
            if starts is not None:
                starts.close()
        x_adv = torch.cat(outs) if outs else x.clone()
        labels = model_labels(model, x_adv, batch_size=config.batch_size)
    return AttackResult(x_adv=x_adv, success=is_success(labels, y, tgt), norms=flat_norms(x_adv - x, config.norm),
                        norm=config.norm, labels=labels, target=tgt,
                        extra={"config": config})


def _score(model: nn.Module, x_adv: torch.Tensor, y: torch.Tensor, aim: torch.Tensor, tgt: torch.Tensor | None,
           sign: float) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = model(x_adv)
    return is_success(logits.argmax(1), y, tgt), sign * F.cross_entropy(logits, aim, reduction="none")


# -- the four named attacks -------------------------------------------------------------------------------
def fgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float, norm: str | Norm = "linf",
         targeted: bool = False, target: torch.Tensor | int | None = None, eot_samples: int = 1,
         eot_sigma: float = 0.0, seed: int = 0, batch_size: int = 256) -> AttackResult:
    """FGSM (Goodfellow et al. 2015): ``x + eps * sign(grad)`` (Linf) or the L2 fast gradient method."""
    cfg = GradientAttackConfig(eps=eps, step=eps, steps=1, norm=Norm.parse(norm), targeted=targeted,
                               eot_samples=eot_samples, eot_sigma=eot_sigma, seed=seed, batch_size=batch_size)
    return gradient_attack(model, x, y, cfg, target=target)


def bim(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float, step: float | None = None,
        steps: int | None = None, norm: str | Norm = "linf", targeted: bool = False,
        target: torch.Tensor | int | None = None, eot_samples: int = 1, eot_sigma: float = 0.0, seed: int = 0,
        batch_size: int = 256) -> AttackResult:
    """BIM / I-FGSM (Kurakin et al. 2017). Defaults are the paper's: step 1/255 and
    ``min(255 eps + 4, 1.25 * 255 eps)`` steps."""
    if steps is None:
        steps = max(1, int(min(eps * 255 + 4, 1.25 * eps * 255)))
    cfg = GradientAttackConfig(eps=eps, step=1 / 255 if step is None else step, steps=steps, norm=Norm.parse(norm),
                               targeted=targeted, eot_samples=eot_samples, eot_sigma=eot_sigma, seed=seed,
                               batch_size=batch_size)
    return gradient_attack(model, x, y, cfg, target=target)


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float, step: float | None = None,
        steps: int = 10, norm: str | Norm = "linf", random_start: bool = True, restarts: int = 1,
        targeted: bool = False, target: torch.Tensor | int | None = None, eot_samples: int = 1,
        eot_sigma: float = 0.0, seed: int = 0, batch_size: int = 256) -> AttackResult:
    """PGD (Madry et al. 2018): BIM from a random point of the ball, best of ``restarts``.
    ``step`` defaults to ``2.5 * eps / steps`` (Madry et al.'s rule)."""
    cfg = GradientAttackConfig(eps=eps, step=2.5 * eps / steps if step is None else step, steps=steps,
                               norm=Norm.parse(norm), random_start=random_start, restarts=restarts,
                               targeted=targeted, eot_samples=eot_samples, eot_sigma=eot_sigma, seed=seed,
                               batch_size=batch_size)
    return gradient_attack(model, x, y, cfg, target=target)


def mifgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float, step: float | None = None,
           steps: int = 10, decay: float = 1.0, norm: str | Norm = "linf", targeted: bool = False,
           target: torch.Tensor | int | None = None, eot_samples: int = 1, eot_sigma: float = 0.0, seed: int = 0,
           batch_size: int = 256) -> AttackResult:
    """MI-FGSM (Dong et al. 2018): momentum ``decay`` (mu, 1.0 in the paper), step ``eps / steps`` by default."""
    cfg = GradientAttackConfig(eps=eps, step=eps / steps if step is None else step, steps=steps,
                               norm=Norm.parse(norm), momentum=decay, targeted=targeted, eot_samples=eot_samples,
                               eot_sigma=eot_sigma, seed=seed, batch_size=batch_size)
    return gradient_attack(model, x, y, cfg, target=target)


__all__ = ["GradientAttackConfig", "bim", "fgsm", "frozen", "gradient_attack", "mifgsm", "pgd"]
