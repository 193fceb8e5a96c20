"""The gradient attacks' loop after its per-step trimming (issue 53): the same adversarial examples, bit for bit,
as the loop before it (kept here verbatim as the reference), and every guarantee still checked on its own.

The reference is the loop as it stood at commit 11f3d3d: a CPU-generator random start drawn batch by batch,
``sign * loss`` differentiated, ``x_adv + step * unit`` then :func:`stealkit.evade.base.project`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stealkit.evade.base import TINY, Norm, check_batch, check_target, flat_norms, frozen, project
from stealkit.evade.gradient_based import gradient as G
from stealkit.evade.gradient_based.gradient import GradientAttackConfig, gradient_attack
from tests.fake_cuda import fake_cuda


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 5)).eval()


def _batch(n: int = 23, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    x[:3] = 0.0  # pixels on the box's edges: the clamp to [0, 1] is active
    x[3:6] = 1.0
    return x, torch.randint(0, 5, (n,), generator=g)


# -- the loop before the trimming, verbatim -------------------------------------------------------------------------
def _ref_random_start(x: torch.Tensor, eps: float, norm: Norm, gen: torch.Generator) -> torch.Tensor:
    if norm is Norm.LINF:
        delta = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x.device) * eps
    else:
        d = x[0].numel()
        u = torch.randn(x.shape, generator=gen).to(x.device)
        u = u / u.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (x.dim() - 1)))
        r = torch.rand(x.shape[0], generator=gen).to(x.device) ** (1.0 / d) * eps
        delta = u * r.view(-1, *([1] * (x.dim() - 1)))
    return project(x + delta, x, eps, norm)


def _ref_unit_step(g: torch.Tensor, norm: Norm) -> torch.Tensor:
    if norm is Norm.LINF:
        return g.sign()
    return g / g.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (g.dim() - 1)))


def _ref_loss_grad(model, x_adv, labels, sign, cfg, gen):  # type: ignore[no-untyped-def]
    total = None
    for _ in range(cfg.eot_samples):
        xa = x_adv.detach().requires_grad_(True)
        inp = xa
        if cfg.eot_sigma > 0:
            inp = xa + torch.randn(xa.shape, generator=gen).to(xa.device) * cfg.eot_sigma
        loss = F.cross_entropy(model(inp), labels, reduction="sum")
        (g,) = torch.autograd.grad(sign * loss, xa)
        total = g if total is None else total + g
    return total if cfg.eot_samples == 1 else total / cfg.eot_samples


def _ref_run_once(model, x, labels, sign, cfg, gen):  # type: ignore[no-untyped-def]
    x_adv = _ref_random_start(x, cfg.eps, cfg.norm, gen) if cfg.random_start else x.clone()
    velocity = torch.zeros_like(x) if cfg.momentum is not None else None
    for _ in range(cfg.steps):
        g = _ref_loss_grad(model, x_adv, labels, sign, cfg, gen)
        if velocity is not None:
            l1 = g.abs().flatten(1).sum(1).clamp_min(TINY).view(-1, *([1] * (x.dim() - 1)))
            velocity = cfg.momentum * velocity + g / l1
            g = velocity
        x_adv = project(x_adv + cfg.step * _ref_unit_step(g, cfg.norm), x, cfg.eps, cfg.norm)
    return x_adv.detach()


def _reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: GradientAttackConfig,
               target: torch.Tensor | int | None = None) -> torch.Tensor:
    x, y = check_batch(x, y)
    tgt = check_target(target, y, cfg.targeted)
    gen = torch.Generator().manual_seed(cfg.seed)
    sign = -1.0 if cfg.targeted else 1.0
    aim = tgt if tgt is not None else y
    outs = []
    with frozen(model), torch.enable_grad():
        for i in range(0, x.shape[0], cfg.batch_size):
            xb, ab = x[i : i + cfg.batch_size], aim[i : i + cfg.batch_size]
            yb = y[i : i + cfg.batch_size]
            tb = tgt[i : i + cfg.batch_size] if tgt is not None else None
            best = _ref_run_once(model, xb, ab, sign, cfg, gen)
            if cfg.restarts > 1:
                best_ok, best_loss = G._score(model, best, yb, ab, tb, sign)
                for _ in range(cfg.restarts - 1):
                    cand = _ref_run_once(model, xb, ab, sign, cfg, gen)
                    ok, loss = G._score(model, cand, yb, ab, tb, sign)
                    take = (ok & ~best_ok) | (~ok & ~best_ok & (loss > best_loss))
                    best = torch.where(take.view(-1, *([1] * (x.dim() - 1))), cand, best)
                    best_ok, best_loss = best_ok | ok, torch.where(take, loss, best_loss)
            outs.append(best)
    return torch.cat(outs)


CASES = {
    "pgd-linf": dict(eps=0.1, step=0.01, steps=7, random_start=True),
    "pgd-linf-restarts": dict(eps=0.1, step=0.03, steps=4, random_start=True, restarts=3),
    "pgd-l2": dict(eps=0.5, step=0.1, steps=6, norm=Norm.L2, random_start=True),
    "pgd-l2-restarts": dict(eps=0.5, step=0.2, steps=3, norm=Norm.L2, random_start=True, restarts=2),
    "bim-linf": dict(eps=0.05, step=0.01, steps=5),
    "fgsm-l2": dict(eps=0.3, step=0.3, steps=1, norm=Norm.L2),
    "mifgsm-linf": dict(eps=0.1, step=0.02, steps=5, momentum=1.0),
    "mifgsm-l2": dict(eps=0.5, step=0.1, steps=4, norm=Norm.L2, momentum=0.5),
    "targeted-linf": dict(eps=0.1, step=0.02, steps=5, random_start=True, targeted=True),
    "targeted-l2-restarts": dict(eps=0.5, step=0.2, steps=3, norm=Norm.L2, random_start=True, targeted=True,
                                 restarts=2),
    "eot-linf": dict(eps=0.1, step=0.02, steps=3, random_start=True, eot_samples=3, eot_sigma=0.2),
    "eot-l2-restarts": dict(eps=0.5, step=0.1, steps=3, norm=Norm.L2, random_start=True, eot_samples=2,
                            eot_sigma=0.1, restarts=2),
}


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("batch_size", [23, 4])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_bit_identical_to_the_loop_before_the_trimming(case: str, batch_size: int, seed: int) -> None:
    model, (x, y) = _model(), _batch()
    cfg = GradientAttackConfig(**CASES[case], seed=seed, batch_size=batch_size)  # type: ignore[arg-type]
    target = torch.full_like(y, 2) if cfg.targeted else None
    got = gradient_attack(model, x, y, cfg, target=target)
    want = _reference(model, x, y, cfg, target)
    assert torch.equal(got.x_adv, want), (case, float((got.x_adv - want).abs().max()))


@pytest.mark.parametrize("case", ["pgd-linf", "pgd-l2-restarts", "eot-linf", "targeted-linf"])
@pytest.mark.slow
def test_simulated_gpu_gives_the_cpu_examples(case: str) -> None:
    """On a (simulated) GPU the random starts are drawn ahead, pinned and copied without a wait: same examples."""
    model, (x, y) = _model(), _batch()
    cfg = GradientAttackConfig(**CASES[case], seed=3, batch_size=4)  # type: ignore[arg-type]
    target = torch.full_like(y, 2) if cfg.targeted else None
    want = gradient_attack(model, x, y, cfg, target=target)
    with fake_cuda():
        got = gradient_attack(model.to("cuda"), x.to("cuda"), y.to("cuda"), cfg,
                              target=None if target is None else target.to("cuda"))
        assert got.x_adv.device.type == "cuda"
        same = torch.equal(got.x_adv.cpu(), want.x_adv) and torch.equal(got.success.cpu(), want.success)
    model.to("cpu")
    assert same


# -- each guarantee, checked on its own (each fails if that piece of the loop is removed) ----------------------------
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_every_step_is_projected_onto_the_ball_and_the_box(norm: str) -> None:
    """Large steps, many of them: without the projection or the clamp the examples leave the ball or [0, 1]."""
    model, (x, y) = _model(), _batch()
    eps = 0.05 if norm == "linf" else 0.3
    for steps in (1, 2, 5):
        r = gradient_attack(model, x, y, GradientAttackConfig(eps=eps, step=4 * eps, steps=steps, norm=Norm(norm),
                                                              random_start=True, batch_size=8))
        assert float(r.norms.max()) <= eps * (1 + 1e-5)
        assert float(r.x_adv.min()) >= 0.0 and float(r.x_adv.max()) <= 1.0
        assert bool((r.x_adv[:3] >= 0).all()) and bool((r.x_adv[3:6] <= 1).all())
        if norm == "linf":  # the steps are big enough that the ball's edge is reached somewhere
            assert float(r.norms.max()) == pytest.approx(eps, rel=1e-5)


def test_success_is_the_models_verdict_on_the_examples() -> None:
    model, (x, y) = _model(), _batch()
    for targeted in (False, True):
        target = torch.full_like(y, 2) if targeted else None
        r = gradient_attack(model, x, y, GradientAttackConfig(eps=0.3, step=0.05, steps=10, random_start=True,
                                                              targeted=targeted, batch_size=8), target=target)
        with torch.no_grad():
            labels = model(r.x_adv).argmax(1)
        assert torch.equal(r.labels, labels)
        assert torch.equal(r.success, labels == 2 if targeted else labels != y)
        assert 0 < int(r.success.sum()) < len(y) or targeted


@pytest.mark.slow
def test_the_random_start_is_seeded_and_random() -> None:
    """One step of size 0: the result is the projected random start, the same for a seed, different across seeds."""
    model, (x, y) = _model(), _batch()
    for norm, eps in (("linf", 0.1), ("l2", 0.5)):
        def start(seed: int, *, norm: str = norm, eps: float = eps) -> torch.Tensor:
            return gradient_attack(model, x, y, GradientAttackConfig(eps=eps, step=0.0, steps=1, norm=Norm(norm),
                                                                     random_start=True, seed=seed,
                                                                     batch_size=4)).x_adv
        a, b, c = start(0), start(0), start(1)
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert float(flat_norms(a - x, norm).max()) > eps / 2  # a start, not the clean image
        # the start is drawn from the seeded CPU generator, batch after batch, in order
        gen = torch.Generator().manual_seed(0)
        want = torch.cat([_ref_random_start(x[i : i + 4], eps, Norm(norm), gen) for i in range(0, len(x), 4)])
        assert torch.equal(a, want)
