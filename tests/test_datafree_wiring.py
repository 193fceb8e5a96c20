"""DFME's loss wiring: the disagreement it computes, the sign with which it enters the zeroth-order estimate
(the generator *maximises* it), and the loss the student *minimises*. Each test compares the attack with a
reference written out here from the paper (DFME Sec. 3.2-3.3, appendix B), so flipping a sign or swapping the
l1 loss for KL (or back) makes a test fail; ``test_the_checks_catch_a_sign_flip_and_a_loss_swap`` shows that
they do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stealkit.extract.datafree.dfme as dfme_mod
from stealkit.extract.datafree.dfme import DFMEAttack, DFMEConfig
from stealkit.oracle import LocalOracle, OutputMode

SHAPE = (1, 4, 4)
K = 4


class Victim(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.w1 = nn.Parameter(torch.randn(16, 12, generator=g))
        self.w2 = nn.Parameter(torch.randn(12, K, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * torch.tanh(x.flatten(1) @ self.w1) @ self.w2 / 4


def make_student() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, K))


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def paper_l1(student_logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """DFME Eq. 3 on logits recovered from probabilities (appendix B): mean_k |s_k - (log p_k - mean log p)|."""
    logp = probs.clamp_min(1e-30).log()
    return (student_logits - (logp - logp.mean(1, keepdim=True))).abs().mean(1)


def paper_kl(student_logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """KL(victim || student), the alternative the paper compares l1 with."""
    p = probs.clamp_min(1e-30)
    return (p * (p.log() - F.log_softmax(student_logits, 1))).sum(1)


def attack(loss: str = "l1", **kw) -> tuple[DFMEAttack, LocalOracle]:  # noqa: ANN003
    cfg = DFMEConfig(batch_size=16, nz=8, ngf=4, loss=loss, **kw)
    victim = Victim().eval()
    oracle = LocalOracle(victim, SHAPE, num_classes=K, mode="probs")
    return DFMEAttack(input_shape=SHAPE, num_classes=K, mode=OutputMode.PROBS, make_student=make_student,
                      config=cfg), oracle


# -- the per-sample disagreement ------------------------------------------------------------------------------
@pytest.mark.parametrize(("loss", "reference", "other"), [("l1", paper_l1, paper_kl), ("kl", paper_kl, paper_l1)])
def test_disagreement_is_the_configured_loss(loss: str, reference, other) -> None:  # noqa: ANN001
    atk, _ = attack(loss)
    g = torch.Generator().manual_seed(0)
    s = torch.randn(32, K, generator=g) * 2
    probs = torch.softmax(torch.randn(32, K, generator=g) * 2, 1)
    got = atk.disagreement(s, atk.victim_logits(probs))
    assert got.shape == (32,)
    assert torch.allclose(got, reference(s, probs), atol=1e-5, rtol=1e-4)
    assert bool((got >= 0).all())
    assert not torch.allclose(got, other(s, probs), atol=1e-2)  # the two losses are told apart
    # zero exactly when the student's logits equal the victim's (up to a shift, which l1 on centred logits
    # does not forgive but KL does)
    z = torch.randn(8, K, generator=g)
    z = z - z.mean(1, keepdim=True)
    assert float(atk.disagreement(z, atk.victim_logits(torch.softmax(z, 1))).abs().max()) < 1e-5


# -- the generator step: the estimate points up the disagreement ----------------------------------------------
def _captured_generator_gradient(atk: DFMEAttack, oracle: LocalOracle,
                                 monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    real = dfme_mod.estimate_gradient

    def spy(x_pre, loss_fn, query, **kw):  # noqa: ANN001, ANN003, ANN202
        est = real(x_pre, loss_fn, query, **kw)
        seen["x_pre"], seen["grad"] = x_pre.detach().clone(), est.grad.clone()
        return est

    monkeypatch.setattr(dfme_mod, "estimate_gradient", spy)
    student_before = [p.detach().clone() for p in atk.student.parameters()]
    atk.step(oracle.query, 0.0)
    # the gradient was taken against the student as it was before this step's student updates
    with torch.no_grad():
        for p, p0 in zip(atk.student.parameters(), student_before, strict=True):
            p.copy_(p0)
    return seen["x_pre"], seen["grad"]


def _true_gradient(reference, atk: DFMEAttack, victim: nn.Module, x_pre: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    xp = x_pre.clone().requires_grad_(True)
    px = (torch.tanh(xp) + 1) / 2
    reference(atk.student(px), torch.softmax(victim(px), 1)).mean().backward()
    return xp.grad


@pytest.mark.parametrize(("loss", "reference", "other"), [("l1", paper_l1, paper_kl), ("kl", paper_kl, paper_l1)])
def test_generator_estimate_ascends_the_configured_disagreement(loss: str, reference, other,  # noqa: ANN001
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator minimises what it is given (Adam on ``x_pre.backward(grad)``), so ``grad`` must estimate
    the gradient of *minus* the disagreement: cosine with -grad L near 1, and clearly below with the other loss."""
    atk, oracle = attack(loss, directions=400, student_steps=1)
    x_pre, grad = _captured_generator_gradient(atk, oracle, monkeypatch)
    true = _true_gradient(reference, atk, oracle.model, x_pre)
    cos = F.cosine_similarity(grad.flatten(1), -true.flatten(1), dim=1)
    assert float(cos.median()) > 0.8, cos
    wrong = _true_gradient(other, atk, oracle.model, x_pre)
    cos_other = F.cosine_similarity(grad.flatten(1), -wrong.flatten(1), dim=1)
    assert float(cos.median()) > float(cos_other.median()) + 0.2, (cos.median(), cos_other.median())


# -- the student steps: they minimise the disagreement on fresh queries ----------------------------------------
def test_student_loss_is_the_l1_disagreement_on_its_queries() -> None:
    atk, oracle = attack("l1", student_steps=3)
    outputs: list[torch.Tensor] = []
    hook = atk.student.register_forward_hook(
        lambda _m, _i, out: outputs.append(out.detach().clone()) if out.requires_grad else None)
    answers: list[torch.Tensor] = []

    def query(x: torch.Tensor) -> torch.Tensor:
        a = oracle.query(x)
        answers.append(a.clone())
        return a

    try:
        losses = atk.step(query, 0.0)
    finally:
        hook.remove()
    student_answers = answers[1:]  # the first call is the generator's (B * (m + 1) images)
    assert len(outputs) == len(student_answers) == 3
    expected = sum(float(paper_l1(o, a).mean()) for o, a in zip(outputs, student_answers, strict=True)) / 3
    assert losses["loss_student"] == pytest.approx(expected, rel=1e-5)


def test_student_steps_reduce_the_disagreement() -> None:
    """Many student steps against a near-frozen generator: the l1 disagreement on fixed generator samples falls.
    With the sign flipped (the student maximising it) it would rise."""
    atk, oracle = attack("l1", student_steps=30, lr_generator=1e-12, lr_student=0.05)
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(5))

    def l1_now() -> float:
        with torch.no_grad():
            x = atk.generator(z)
            return float(paper_l1(atk.student(x), torch.softmax(oracle.model(x), 1)).mean())

    atk.generator.eval()
    before = l1_now()
    atk.generator.train()
    atk.step(oracle.query, 0.0)
    atk.generator.eval()
    after = l1_now()
    assert after < 0.7 * before, (before, after)


# -- the checks above fail under the bugs they are meant to catch ------------------------------------------------
def test_the_checks_catch_a_sign_flip_and_a_loss_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1. a sign flip in the generator objective: the estimate then points down the disagreement
    atk, oracle = attack("l1", directions=400, student_steps=1)
    real_est = dfme_mod.estimate_gradient

    def flipped_est(x_pre, loss_fn, query, **kw):  # noqa: ANN001, ANN003, ANN202
        return real_est(x_pre, lambda px, ans: -loss_fn(px, ans), query, **kw)

    monkeypatch.setattr(dfme_mod, "estimate_gradient", flipped_est)
    x_pre, grad = _captured_generator_gradient(atk, oracle, monkeypatch)
    true = _true_gradient(paper_l1, atk, oracle.model, x_pre)
    assert float(F.cosine_similarity(grad.flatten(1), -true.flatten(1), dim=1).median()) < 0
    # 2. a KL/l1 swap: test_disagreement_is_the_configured_loss checks each loss against the *other*
    #    reference as well, and the generator test requires a clear margin over the other loss's gradient


# -- the reference code's extra 1/K -----------------------------------------------------------------------------
def test_the_references_extra_one_over_k_does_not_change_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference DFME code divides the l1 generator-gradient estimate by ``num_classes * N``; stealkit by
    ``N`` only (the per-sample l1 is a mean over classes in both), so its estimate is K times the reference's.
    The generator's optimiser is Adam, whose step is invariant to a constant gradient scale up to its epsilon:
    the generators' outputs after 10 iterations agree to well under 1% of how far they moved. (The only
    parameters that differ are the biases of the layers that feed a BatchNorm: BN cancels them, their gradient
    is round-off, and Adam's epsilon decides their step; they do not change the output.)"""
    real = dfme_mod.estimate_gradient
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(9))

    def run(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        def scaled(x_pre, loss_fn, query, **kw):  # noqa: ANN001, ANN003, ANN202
            est = real(x_pre, loss_fn, query, **kw)
            est.grad = est.grad * scale
            return est

        monkeypatch.setattr(dfme_mod, "estimate_gradient", scaled)
        atk, oracle = attack("l1", student_steps=1)
        with torch.no_grad():
            before = atk.generator(z)  # train mode: batch statistics, so BN cancels the biases exactly
        for _ in range(10):
            atk.step(oracle.query, 0.0)
        with torch.no_grad():
            return before, atk.generator(z)

    start, ours = run(1.0)
    _, reference = run(1.0 / K)
    moved = float((ours - start).abs().max())
    assert moved > 1e-3
    assert float((ours - reference).abs().max()) < 0.01 * moved
