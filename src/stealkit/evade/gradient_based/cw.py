"""Carlini & Wagner L2 attack (Carlini and Wagner 2017, "Towards evaluating the robustness of neural networks").

The L2 attack of their Sec. V.A: optimise ``w`` in tanh space, ``x' = (tanh(w) + 1) / 2`` (so x' stays in
[0, 1] without clipping), minimising ``||x' - x||_2^2 + c * f(x')`` with Adam, where

* untargeted: ``f = max(Z_y - max_{i != y} Z_i, -kappa)``,
* targeted:   ``f = max(max_{i != t} Z_i - Z_t, -kappa)``,

``Z`` the logits and ``kappa`` the confidence. The constant ``c`` is found per example by binary search
(``binary_search_steps`` rounds; multiplied by 10 while no adversarial example has been found, bisected
after), each round restarting Adam from the clean image; the best (smallest L2) adversarial example over all
rounds is returned, the clean image where none was found. Early abort as in the reference code: a round stops
when the loss has not fallen by 0.01% over a tenth of the iterations. Cited by CoDFe Sec. 2 and used by
Li et al. (2019) Sec. 6.2 for L2 attacks (with :class:`~stealkit.evade.gradient_based.eot.EOTModel` for the noisy model).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import (
    AttackResult,
    Norm,
    check_batch,
    check_target,
    flat_norms,
    frozen,
    is_success,
    model_labels,
)


def _margin(logits: torch.Tensor, aim: torch.Tensor, targeted: bool) -> torch.Tensor:
    """``Z_aim - max_{i != aim} Z_i`` for targeted, its negative for untargeted (>= kappa means success)."""
    real = logits.gather(1, aim[:, None]).squeeze(1)
    other = logits.masked_fill(torch.nn.functional.one_hot(aim, logits.shape[1]).bool(), -math.inf).amax(1)
    return real - other if targeted else other - real


def carlini_wagner_l2(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, targeted: bool = False,
                      target: torch.Tensor | int | None = None, kappa: float = 0.0, initial_const: float = 1e-2,
                      binary_search_steps: int = 9, steps: int = 200, lr: float = 0.01, abort_early: bool = True,
                      batch_size: int = 256) -> AttackResult:
    """Minimum-L2 adversarial examples on ``model`` (white-box); see the module docstring.

    ``success`` is judged by ``model``'s label on the returned images; ``extra["const"]`` holds the final
    constant of each example. Defaults follow the reference code except ``steps`` (10,000 there; 200 suits
    CPU-scale runs) and ``initial_const`` (1e-3 there; 1e-2 saves one binary-search round on small images).
    """
    x, y = check_batch(x, y)
    tgt = check_target(target, y, targeted)
    for name, v in (("kappa", kappa), ("initial_const", initial_const), ("lr", lr)):
        if not math.isfinite(v) or v < 0 or (name != "kappa" and v == 0):
            raise InputError(f"{name} must be a finite positive number, got {v!r}")
    if binary_search_steps < 1 or steps < 1:
        raise InputError("binary_search_steps and steps must be positive integers")
    aim = tgt if tgt is not None else y
    outs, consts = [], []
    with frozen(model), torch.enable_grad():
        for i in range(0, x.shape[0], batch_size):
            adv, c = _cw_batch(model, x[i : i + batch_size], aim[i : i + batch_size], targeted, kappa,
                               initial_const, binary_search_steps, steps, lr, abort_early)
            outs.append(adv)
            consts.append(c)
        x_adv = torch.cat(outs)
        labels = model_labels(model, x_adv, batch_size=batch_size)
    return AttackResult(x_adv=x_adv, success=is_success(labels, y, tgt), norms=flat_norms(x_adv - x, Norm.L2),
                        norm=Norm.L2, labels=labels, target=tgt,
                        extra={"const": torch.cat(consts), "kappa": kappa, "steps": steps,
                               "binary_search_steps": binary_search_steps})


def _cw_batch(model: nn.Module, x: torch.Tensor, aim: torch.Tensor, targeted: bool, kappa: float, c0: float,
              rounds: int, steps: int, lr: float, abort_early: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b = x.shape[0]
    w0 = torch.atanh((x * 2 - 1) * (1 - 1e-6))
    const = torch.full((b,), c0, device=x.device)
    lo = torch.zeros(b, device=x.device)
    hi = torch.full((b,), math.inf, device=x.device)
    best_l2 = torch.full((b,), math.inf, device=x.device)
    best_adv = x.clone()
    view = (-1, *([1] * (x.dim() - 1)))
    for _ in range(rounds):
        modifier = torch.zeros_like(x, requires_grad=True)
        adam_m, adam_v = torch.zeros_like(x), torch.zeros_like(x)
        found = torch.zeros(b, dtype=torch.bool, device=x.device)
        prev = math.inf
        for it in range(steps):
            x_new = (torch.tanh(w0 + modifier) + 1) / 2
            logits = model(x_new)
            l2sq = (x_new - x).flatten(1).pow(2).sum(1)
            margin = _margin(logits, aim, targeted)
            loss_vec = l2sq + const * torch.clamp(kappa - margin, min=0)
            loss = loss_vec.sum()
            (g,) = torch.autograd.grad(loss, modifier)
            with torch.no_grad():  # Adam (Kingma and Ba 2015, default betas), as in the reference code
                adam_m.mul_(0.9).add_(g, alpha=0.1)
                adam_v.mul_(0.999).addcmul_(g, g, value=0.001)
                m_hat = adam_m / (1 - 0.9 ** (it + 1))
                v_hat = adam_v / (1 - 0.999 ** (it + 1))
                modifier -= lr * m_hat / (v_hat.sqrt() + 1e-8)
            with torch.no_grad():
                pred = logits.argmax(1)
                ok = (margin >= kappa) & ((pred == aim) if targeted else (pred != aim))
                better = ok & (l2sq.sqrt() < best_l2)
                best_l2 = torch.where(better, l2sq.sqrt(), best_l2)
                best_adv = torch.where(better.view(view), x_new.detach(), best_adv)
                found |= ok
            if abort_early and it % max(1, steps // 10) == 0:
                if float(loss.detach()) > prev * 0.9999:
                    break
                prev = float(loss.detach())
        hi = torch.where(found, torch.minimum(hi, const), hi)
        lo = torch.where(found, lo, torch.maximum(lo, const))
        const = torch.where(torch.isfinite(hi), (lo + hi) / 2, const * 10)
    return best_adv, const
