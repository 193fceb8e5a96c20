"""Orthogonal probe directions (structured Monte Carlo) for HopSkipJump: orthonormal blocks, budgets exact, same
seed same result."""

from __future__ import annotations

import pytest
import torch

from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.orthogonal import orthogonal_directions
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def test_directions_are_orthonormal_within_each_block_of_d() -> None:
    u = orthogonal_directions(40, SHAPE, torch.Generator().manual_seed(0), "cpu").flatten(1)
    assert u.shape == (40, 16)
    for start in (0, 16, 32):
        block = u[start : start + 16]
        assert torch.allclose(block @ block.T, torch.eye(block.shape[0]), atol=1e-5)
    again = orthogonal_directions(40, SHAPE, torch.Generator().manual_seed(0), "cpu").flatten(1)
    assert torch.equal(u, again)


@pytest.mark.parametrize("max_queries", [5, 40, 250])
def test_orthogonal_probes_honour_the_per_image_cap_and_the_ledger(max_queries: int) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=900)
    r = hopskipjump(oracle, x, y, max_queries=max_queries,
                    config=HopSkipJumpConfig(iterations=50, init_evals=20, semicircle=True, orthogonal=True))
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 900
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


def test_orthogonal_probes_with_a_seed_give_the_same_result() -> None:
    victim = TinyNet(seed=2).eval()
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(6))
    y = victim(x).argmax(1)
    cfg = HopSkipJumpConfig(init_evals=20, semicircle=True, orthogonal=True, seed=3)
    runs = [hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=400, config=cfg)
            for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert torch.equal(runs[0].extra["queries_per_example"], runs[1].extra["queries_per_example"])
