"""Property tests of the white-box evasion attacks on tiny models (milliseconds each)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from stealkit.errors import InputError
from stealkit.evade import EOTModel, bim, choose_targets, fgsm, mifgsm, pgd, project
from stealkit.evade.base import flat_norms
from stealkit.evade.gradient_based.cw import carlini_wagner_l2
from tests.conftest import TinyNet

ATTACKS = {
    "fgsm": lambda m, x, y, **kw: fgsm(m, x, y, **kw),
    "bim": lambda m, x, y, **kw: bim(m, x, y, steps=5, step=kw["eps"] / 3 + 1e-3, **kw),
    "pgd": lambda m, x, y, **kw: pgd(m, x, y, steps=5, **kw),
    "pgd-restarts": lambda m, x, y, **kw: pgd(m, x, y, steps=3, restarts=2, **kw),
    "mifgsm": lambda m, x, y, **kw: mifgsm(m, x, y, steps=5, **kw),
}


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    """Tiny models gain nothing from threads, and on a loaded machine OpenMP waits cost seconds."""
    torch.set_num_threads(1)


def _labels(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(1)


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_eps_zero_returns_input(tiny_model: nn.Module, tiny_batch: torch.Tensor, name: str, norm: str) -> None:
    y = _labels(tiny_model, tiny_batch)
    r = ATTACKS[name](tiny_model, tiny_batch, y, eps=0.0, norm=norm)
    assert torch.equal(r.x_adv, tiny_batch)
    assert not bool(r.success.any())
    assert float(r.norms.max()) == 0.0


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(ATTACKS)), norm=st.sampled_from(["linf", "l2"]),
       eps=st.floats(0.001, 3.0), seed=st.integers(0, 1000), edge=st.booleans())
def test_perturbation_stays_in_ball_and_box(name: str, norm: str, eps: float, seed: int, edge: bool) -> None:
    model = TinyNet(seed=seed % 3).eval()
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(6, 1, 4, 4, generator=gen)
    if edge:  # pixels on the box's faces, where clipping bites
        x = x.round()
    y = torch.randint(0, 3, (6,), generator=gen)
    r = ATTACKS[name](model, x, y, eps=eps, norm=norm, seed=seed)
    assert float(r.x_adv.min()) >= 0.0 and float(r.x_adv.max()) <= 1.0
    assert bool((flat_norms(r.x_adv - x, norm) <= eps * (1 + 1e-5) + 1e-6).all())
    assert torch.allclose(r.norms, flat_norms(r.x_adv - x, norm))


@settings(max_examples=40, deadline=None)
@given(norm=st.sampled_from(["linf", "l2"]), eps=st.floats(0.0, 5.0), seed=st.integers(0, 10_000))
def test_project_is_idempotent_and_bounded(norm: str, eps: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(4, 1, 3, 3, generator=gen)
    z = x + torch.randn(4, 1, 3, 3, generator=gen) * 3
    p = project(z, x, eps, norm)
    assert torch.allclose(project(p, x, eps, norm), p, atol=1e-6)
    assert bool((flat_norms(p - x, norm) <= eps * (1 + 1e-5) + 1e-6).all())
    assert float(p.min()) >= 0 and float(p.max()) <= 1


def test_project_accepts_per_example_radius() -> None:
    x = torch.full((2, 1, 2, 2), 0.5)
    p = project(x + 1.0, x, torch.tensor([0.1, 0.3]), "linf")
    assert torch.allclose(p[0], torch.full((1, 2, 2), 0.6)) and torch.allclose(p[1], torch.full((1, 2, 2), 0.8))


@pytest.mark.parametrize("name", ["fgsm", "bim", "pgd", "mifgsm"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_targeted_success_is_classified_as_target(tiny_model: nn.Module, name: str, norm: str) -> None:
    x = torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    y = _labels(tiny_model, x)
    target = (y + 1) % 3
    r = ATTACKS[name](tiny_model, x, y, eps=2.0 if norm == "l2" else 0.5, norm=norm, targeted=True, target=target)
    assert bool(r.success.any())
    labels = _labels(tiny_model, r.x_adv)
    assert torch.equal(r.success, labels == target)
    assert torch.equal(r.labels, labels)


def test_untargeted_success_matches_model(tiny_model: nn.Module, tiny_batch: torch.Tensor) -> None:
    y = _labels(tiny_model, tiny_batch)
    r = pgd(tiny_model, tiny_batch, y, eps=0.3, step=0.05, steps=10)
    assert torch.equal(r.success, _labels(tiny_model, r.x_adv) != y)
    assert r.success_rate > 0.5


def test_iterative_attacks_beat_fgsm_and_restarts_never_hurt(tiny_model: nn.Module) -> None:
    x = torch.rand(200, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    y = _labels(tiny_model, x)
    f = fgsm(tiny_model, x, y, eps=0.08)
    b = bim(tiny_model, x, y, eps=0.08, step=0.01, steps=20)
    assert b.success_rate >= f.success_rate
    p1 = pgd(tiny_model, x, y, eps=0.08, step=0.01, steps=10, seed=1)
    p3 = pgd(tiny_model, x, y, eps=0.08, step=0.01, steps=10, restarts=3, seed=1)
    assert bool((p3.success | ~p1.success).all())  # the first restart is p1's run


def test_same_seed_same_result(tiny_model: nn.Module, tiny_batch: torch.Tensor) -> None:
    y = _labels(tiny_model, tiny_batch)
    a = pgd(tiny_model, tiny_batch, y, eps=0.2, seed=7, eot_samples=2, eot_sigma=0.1)
    b = pgd(tiny_model, tiny_batch, y, eps=0.2, seed=7, eot_samples=2, eot_sigma=0.1)
    assert torch.equal(a.x_adv, b.x_adv)


def test_model_state_is_restored(tiny_batch: torch.Tensor) -> None:
    model = TinyNet().train()
    y = torch.zeros(tiny_batch.shape[0], dtype=torch.long)
    pgd(model, tiny_batch, y, eps=0.1)
    assert model.training and all(p.requires_grad for p in model.parameters())


def test_fgsm_linf_is_one_sign_step() -> None:
    lin = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with torch.no_grad():
        lin[1].weight.copy_(torch.tensor([[1.0, -1.0, 2.0, 0.5], [-1.0, 1.0, -2.0, -0.5]]))
        lin[1].bias.zero_()
    x = torch.full((1, 1, 2, 2), 0.5)
    r = fgsm(lin, x, torch.tensor([0]), eps=0.1)
    expected = (x + 0.1 * torch.tensor([-1.0, 1.0, -1.0, -1.0]).view(1, 1, 2, 2)).clamp(0, 1)
    assert torch.allclose(r.x_adv, expected)


def test_cw_l2_smaller_than_pgd_l2_at_equal_success(tiny_model: nn.Module) -> None:
    x = torch.rand(24, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    y = _labels(tiny_model, x)
    cw = carlini_wagner_l2(tiny_model, x, y, steps=60, binary_search_steps=6, lr=0.05)
    pg = pgd(tiny_model, x, y, eps=1.5, norm="l2", steps=20)
    both = cw.success & pg.success
    assert int(both.sum()) >= 10
    assert torch.equal(cw.success, _labels(tiny_model, cw.x_adv) != y)
    assert float(cw.norms[both].mean()) < float(pg.norms[both].mean())
    assert float(cw.norms[both].median()) < float(pg.norms[both].median())
    assert float(cw.x_adv.min()) >= 0 and float(cw.x_adv.max()) <= 1


def test_cw_targeted_with_confidence(tiny_model: nn.Module) -> None:
    x = torch.rand(12, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    y = _labels(tiny_model, x)
    t = (y + 1) % 3
    r = carlini_wagner_l2(tiny_model, x, y, targeted=True, target=t, kappa=0.5, steps=60, binary_search_steps=5,
                          lr=0.05)
    assert bool(r.success.any())
    with torch.no_grad():
        logits = tiny_model(r.x_adv[r.success])
    top2 = logits.topk(2, dim=1).values
    assert bool((logits.argmax(1) == t[r.success]).all())
    assert bool((top2[:, 0] - top2[:, 1] >= 0.5 - 1e-4).all())


def test_eot_model_averages_probabilities(tiny_model: nn.Module, tiny_batch: torch.Tensor) -> None:
    plain = EOTModel(tiny_model, sigma=0.0, n=5)
    assert torch.allclose(plain(tiny_batch), torch.log_softmax(tiny_model(tiny_batch), 1), atol=1e-6)
    smooth = EOTModel(tiny_model, sigma=0.25, n=8, seed=3)
    out = smooth(tiny_batch)
    assert torch.allclose(out.exp().sum(1), torch.ones(tiny_batch.shape[0]), atol=1e-5)
    assert torch.equal(out, EOTModel(tiny_model, sigma=0.25, n=8, seed=3)(tiny_batch))
    xg = tiny_batch.clone().requires_grad_(True)
    smooth(xg).sum().backward()
    assert xg.grad is not None and bool(torch.isfinite(xg.grad).all())


def test_eot_gradient_matches_manual_average(tiny_model: nn.Module) -> None:
    """One FGSM-L2 step with EOT moves along the mean of the per-draw loss gradients (Li et al. Sec. 6.2)."""
    x = torch.full((1, 1, 4, 4), 0.5)
    y = torch.tensor([0])
    r = fgsm(tiny_model, x, y, eps=0.05, norm="l2", eot_samples=4, eot_sigma=0.1, seed=11)
    gen = torch.Generator().manual_seed(11)
    total = torch.zeros_like(x)
    for _ in range(4):
        xa = x.clone().requires_grad_(True)
        noisy = xa + torch.randn(x.shape, generator=gen) * 0.1
        torch.nn.functional.cross_entropy(tiny_model(noisy), y, reduction="sum").backward()
        total += xa.grad
    expected = (x + 0.05 * total / total.norm()).clamp(0, 1)
    assert torch.allclose(r.x_adv, expected, atol=1e-6)


def test_choose_targets() -> None:
    y = torch.tensor([0, 1, 2, 3])
    assert torch.equal(choose_targets("second", y, 4), torch.ones(4, dtype=torch.long))
    rnd = choose_targets("random", y, 4, seed=1)
    assert bool((rnd != y).all()) and int(rnd.max()) < 4
    logits = torch.tensor([[0.0, 1, 2, 3], [3.0, 2, 1, 0], [1.0, 0, 2, 3], [1.0, 2, 0, 3]])
    assert torch.equal(choose_targets("least-likely", y, 4, substitute_logits=logits), torch.tensor([0, 3, 1, 2]))


def test_user_errors_are_input_errors(tiny_model: nn.Module, tiny_batch: torch.Tensor) -> None:
    y = torch.zeros(tiny_batch.shape[0], dtype=torch.long)
    with pytest.raises(InputError, match="norm"):
        pgd(tiny_model, tiny_batch, y, eps=0.1, norm="l1")
    with pytest.raises(InputError, match="eps"):
        pgd(tiny_model, tiny_batch, y, eps=-0.1)
    with pytest.raises(InputError, match="target"):
        pgd(tiny_model, tiny_batch, y, eps=0.1, targeted=True)
    with pytest.raises(InputError, match="one label per image"):
        fgsm(tiny_model, tiny_batch, y[:3], eps=0.1)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        fgsm(tiny_model, tiny_batch * 255, y, eps=0.1)
    with pytest.raises(InputError, match="target policy"):
        choose_targets("second-best", y, 3)
