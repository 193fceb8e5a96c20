"""The smoothed classifier on tiny models whose smoothed probabilities are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from stealkit.certify.smoothing import (
    ABSTAIN,
    SmoothingConfig,
    certify,
    certify_counts,
    noisy_counts,
    predict,
)
from stealkit.errors import InputError


class Halfspace(nn.Module):
    """Two classes split by the hyperplane mean(x) = 0.5 on 1x2x2 images: class 1 iff w.x + b > 0 with
    w = (1, 1, 1, 1) / 2 (unit norm), b = -1. The smoothed P(class 1) is Phi((w.x + b) / sigma) exactly and
    the distance to the boundary is |w.x + b|."""

    num_classes = 2

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        with torch.no_grad():
            self.lin.weight.fill_(0.5)
            self.lin.bias.fill_(-1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.lin(x.flatten(1))
        return torch.cat([-s, s], dim=1)


def images(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()


def test_counts_have_the_right_sizes_and_seed() -> None:
    model = Halfspace().eval()
    x = images([0.2, 0.5, 0.9])
    gen = torch.Generator().manual_seed(3)
    c = noisy_counts(model, x, 0.5, (7, 50), num_classes=2, batch_size=16, generator=gen)
    assert c.shape == (2, 3, 2)
    assert (c[0].sum(1) == 7).all() and (c[1].sum(1) == 50).all()
    again = noisy_counts(model, x, 0.5, (7, 50), num_classes=2, batch_size=16,
                         generator=torch.Generator().manual_seed(3))
    assert torch.equal(c, again)


def test_smoothed_probability_matches_closed_form() -> None:
    model = Halfspace().eval()
    x = images([0.6])  # w.x + b = 0.2
    n = 20000
    c = noisy_counts(model, x, 0.5, (n,), num_classes=2, batch_size=4096, generator=torch.Generator().manual_seed(0))
    p = c[0, 0, 1].item() / n
    assert p == pytest.approx(norm.cdf(0.2 / 0.5), abs=4 * np.sqrt(0.25 / n))


@pytest.mark.parametrize("fast", [True, False])
def test_certificates_are_sound_and_close_for_a_halfspace(fast: bool) -> None:
    """Every certified radius is below the true distance to the boundary; Cohen's is close to it."""
    model = Halfspace().eval()
    margins = np.array([0.05, 0.2, 0.4, -0.3])
    x = images(list((margins + 1.0) / 2))  # w.x + b = 2 * v - 1 = margin
    cfg = SmoothingConfig(sigma=0.5, n0=100, n=4000, alpha=0.001, batch_size=1500, fast=fast)
    certs = certify(model, x, cfg)
    for cert, m in zip(certs, margins, strict=True):
        assert cert.label == int(m > 0)
        assert sum(cert.counts) == 4000 and sum(cert.counts_selection) == 100
        for r in cert.radius.values():
            assert r is None or r <= abs(m) + 1e-9
        assert cert.pa_lower <= norm.cdf(abs(m) / 0.5) + 1e-9
    assert certs[2].radius["cohen"] == pytest.approx(0.4, abs=0.06)
    assert certs[2].radius["renyi"] is not None and certs[2].radius["pixeldp"] is not None


def test_abstains_at_the_boundary() -> None:
    model = Halfspace().eval()
    x = images([0.5])  # on the boundary: p = 1/2
    cert = certify(model, x, SmoothingConfig(sigma=0.5, n0=100, n=2000))[0]
    assert cert.prediction("cohen") == ABSTAIN
    assert cert.prediction("renyi") == ABSTAIN
    assert cert.prediction("pixeldp") == ABSTAIN
    labels, counts = predict(model, x, 0.5, 2000, alpha=0.001)
    assert labels[0].item() == ABSTAIN and counts.sum().item() == 2000
    labels, _ = predict(model, images([0.95]), 0.5, 500, alpha=0.001)
    assert labels[0].item() == 1


def test_certify_counts_uses_selection_for_the_label() -> None:
    cfg = SmoothingConfig(sigma=1.0, n0=10, n=100)
    cert = certify_counts(np.array([1, 9, 0]), np.array([90, 10, 0]), cfg)
    assert cert.label == 1  # chosen by the selection sample, not the estimation sample
    assert all(r is None for r in cert.radius.values())
    rec = cert.to_record()
    assert rec["prediction"] == {"cohen": ABSTAIN, "renyi": ABSTAIN, "pixeldp": ABSTAIN}


def test_renyi_certifies_below_one_half_where_cohen_abstains() -> None:
    cfg = SmoothingConfig(sigma=1.0, n0=10, n=10000)
    counts = np.array([4800, 1000, 1000, 1000, 1000, 1200])
    cert = certify_counts(counts // 1000, counts, cfg)
    assert cert.radius["cohen"] is None and cert.radius["renyi"] is not None and cert.radius["renyi"] > 0


def test_config_validation() -> None:
    with pytest.raises(InputError):
        SmoothingConfig(sigma=0.0)
    with pytest.raises(InputError):
        SmoothingConfig(sigma=0.5, n=0)
    with pytest.raises(InputError):
        SmoothingConfig(sigma=0.5, alpha=1.5)
    with pytest.raises(InputError):
        SmoothingConfig(sigma=0.5, bounds=("lipschitz",))
    with pytest.raises(InputError):
        certify(Halfspace(), torch.rand(4), SmoothingConfig(sigma=0.5))
