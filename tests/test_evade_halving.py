"""Successive halving over HopSkipJump starts: the per-image budget holds exactly, counts match the ledger."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.halving import rung_caps, successive_halving
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(("budget", "arms", "share"), [(1000, 4, 0.3), (5000, 8, 0.5), (37, 2, 0.4)])
def test_rung_caps_spend_exactly_the_budget(budget: int, arms: int, share: float) -> None:
    caps = rung_caps(budget, arms, share)
    assert len(caps) == arms.bit_length()  # log2(arms) rungs and the final arm
    assert sum(c * (arms >> j) for j, c in enumerate(caps[:-1])) + caps[-1] == budget


@pytest.mark.parametrize("max_queries", [60, 250])
@pytest.mark.parametrize("extra", [{}, {"semicircle": True, "start_tries": 5}])
def test_halving_honours_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    r = successive_halving(oracle, x, y, max_queries=max_queries, arms=4,
                           config=HopSkipJumpConfig(init_evals=10, **extra))  # type: ignore[arg-type]
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == sum(r.queries.values())  # type: ignore[union-attr]
    assert bool(r.success.any())
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())
    assert torch.allclose(r.norms[r.success], (r.x_adv - x).flatten(1).norm(dim=1)[r.success])


def test_halving_is_deterministic_with_a_seed() -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    runs = [successive_halving(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=200,
                               config=HopSkipJumpConfig(init_evals=10, seed=3)) for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)


@pytest.mark.parametrize(("kw", "match"), [({"arms": 3}, "power of two"), ({"share": 1.0}, "share"),
                                           ({"max_queries": 5, "arms": 8}, "too small")])
def test_bad_halving_settings_are_one_clear_error(kw: dict[str, object], match: str) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(2, *SHAPE)
    args = {"max_queries": 100} | kw
    with pytest.raises(InputError, match=match):
        successive_halving(LocalOracle(victim, SHAPE, mode="label"), x, victim(x).argmax(1), **args)  # type: ignore[arg-type]
