"""Soft, sharpened, confidence-weighted teacher targets on the unqueried pool (``ssl="soft"``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.soft_targets import guess_targets, sharpen, soft_unlabelled_loss
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


class Fixed(nn.Module):
    """Predicts the same logits for every image."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1)


def test_sharpen_is_mixmatch_eq7():
    q = torch.tensor([[0.6, 0.3, 0.1]])
    expected = q**2 / (q**2).sum()
    assert torch.allclose(sharpen(q, 0.5), expected)
    assert torch.allclose(sharpen(q, 1.0), q)
    assert sharpen(q, 0.1)[0, 0] > 0.99


def test_targets_are_the_sharpened_average_and_the_weight_its_confidence():
    teacher = Fixed([2.0, 0.0, 0.0])
    u = torch.rand(5, 1, 8, 8)
    cfg = FixMatchConfig(views=3, sharpen=0.5, align=False)
    targets, conf = guess_targets(teacher, u, cfg, torch.Generator().manual_seed(0))
    q = torch.softmax(torch.tensor([2.0, 0.0, 0.0]), 0)
    assert torch.allclose(targets, sharpen(q[None], 0.5).expand(5, -1))
    assert torch.allclose(conf, q.max().expand(5))


def test_loss_is_confidence_weighted_soft_cross_entropy():
    cfg = FixMatchConfig(views=2, sharpen=1.0, align=False, cutout=0.0, noise=0.0)
    teacher, student = Fixed([1.0, 0.0]), Fixed([0.0, 1.0])
    loss = soft_unlabelled_loss(student, torch.rand(4, 1, 8, 8), cfg, torch.Generator().manual_seed(0),
                                teacher=teacher)
    q = torch.softmax(torch.tensor([1.0, 0.0]), 0)
    log_p = torch.log_softmax(torch.tensor([0.0, 1.0]), 0)
    assert float(loss.detach()) == pytest.approx(float(q.max() * -(q * log_p).sum()), rel=1e-5)


def test_settings_are_checked():
    with pytest.raises(InputError, match="views"):
        FixMatchConfig(views=0)
    with pytest.raises(InputError, match="sharpen"):
        FixMatchConfig(sharpen=0.0)
    with pytest.raises(InputError, match="semi-supervised"):
        SurrogateConfig(ssl="mixup")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_soft_targets_spend_exactly_the_budget_and_train(mode):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    oracle = LocalOracle(TinyNet(seed=3).eval(), (1, 4, 4), mode=mode, budget=20)
    config = SurrogateConfig(epochs=3, batch_size=8, ssl="soft", fixmatch=FixMatchConfig(warmup=0.2), seed=1)
    student = TinyNet(seed=5)
    before = [p.detach().clone() for p in student.parameters()]
    result = extract_surrogate(oracle, pool, make_student=lambda: student, config=config)
    assert result.queries["predict"] == 20 == result.extra["n_distinct"] == oracle.ledger.total
    assert result.extra["ssl"] == "soft"
    assert any(not torch.equal(p, b) for p, b in zip(result.student.parameters(), before, strict=True))
