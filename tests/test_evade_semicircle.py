"""CGBA's semicircular boundary search as HopSkipJump's step: verified, never farther, deterministic (its
budget and never-farther tests are with the other additions in test_evade_starts_tangent.py)."""

from __future__ import annotations

import math

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess, binary_search
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.semicircle import arc_points, semicircle_search
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def test_arc_points_lie_on_the_circle_with_diameter_x_to_xb() -> None:
    x = torch.full((3, *SHAPE), 0.5)
    v = torch.zeros(3, *SHAPE)
    v.view(3, -1)[:, 0] = 1
    w = torch.zeros(3, *SHAPE)
    w.view(3, -1)[:, 1] = 1
    dist = torch.tensor([0.2, 0.3, 0.4])
    angle = torch.tensor([0.0, math.pi / 4, math.pi / 2])
    z = arc_points(x, v, w, dist, angle)
    xb = x + dist.view(-1, 1, 1, 1) * v
    # Thales: the angle at z between x and xb is a right angle; |z - x| = D cos(a)
    assert torch.allclose(((z - x).flatten(1) * (z - xb).flatten(1)).sum(1), torch.zeros(3), atol=1e-6)
    assert torch.allclose((z - x).flatten(1).norm(dim=1), dist * torch.cos(angle), atol=1e-6)


def test_search_finds_the_projection_on_a_flat_boundary() -> None:
    """Against a linear classifier with the exact normal, the search lands on the projection of x."""
    normal = torch.randn(16, generator=torch.Generator().manual_seed(0))
    normal /= normal.norm()

    class Linear(torch.nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            s = (z.flatten(1) - 0.5) @ normal - 0.1
            return torch.stack([-s, s], 1)

    x = torch.full((1, *SHAPE), 0.5)
    oracle = LocalOracle(Linear(), SHAPE, mode="label")
    access = LabelAccess(oracle, torch.tensor([0]), None, max_queries=200)
    xb = (x.flatten(1) + 0.1 * normal + 0.08 * torch.randn(16, generator=torch.Generator().manual_seed(1)))
    xb = binary_search(access, x, xb.view(1, *SHAPE), torch.tensor([0]), 1e-6)
    out = semicircle_search(access, x, xb, normal.view(1, *SHAPE), torch.tensor([0]), tol=1e-6)
    assert float((out - x).norm()) == pytest.approx(0.1, abs=1e-4)
    assert float((out - x).norm()) < float((xb - x).norm())


def test_semicircle_is_deterministic_with_a_seed() -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    runs = [hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=300,
                        config=HopSkipJumpConfig(init_evals=20, semicircle=True, seed=5)) for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert torch.equal(runs[0].extra["queries_per_example"], runs[1].extra["queries_per_example"])


def test_bad_arc_tolerance_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="arc_tol"):
        HopSkipJumpConfig(arc_tol=0)
