"""GeoDA's query allocation over iterations as a HopSkipJump option: plans that fit
the budget and grow geometrically, budgets honoured exactly, deterministic, one clear error without a budget."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.allocation import geoda_plan
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(("budget", "reserve"), [(5000, 20), (1000, 20), (17_000, 0), (333, 7)])
def test_plan_fits_the_budget_and_grows_by_eta_to_the_minus_two_thirds(budget: int, reserve: int) -> None:
    plan = geoda_plan(budget, reserve, eta=0.6, first=50)
    assert plan and plan[0] >= 50
    assert sum(plan) + reserve * len(plan) <= budget
    ratio = 0.6 ** (-2 / 3)
    for a, b in zip(plan, plan[1:], strict=False):
        assert b / a == pytest.approx(ratio, rel=0.05)
    # the longest such plan: one more iteration would leave the first one under 50
    assert geoda_plan(budget, reserve, eta=0.6, first=plan[0] + 1) != plan


def test_plan_is_empty_when_not_even_one_iteration_fits_and_bad_eta_is_one_clear_error() -> None:
    assert geoda_plan(60, 20, first=50) == []
    with pytest.raises(InputError, match="eta"):
        geoda_plan(1000, 20, eta=1.5)
    with pytest.raises(InputError, match="eta"):
        HopSkipJumpConfig(eta=0)
    with pytest.raises(InputError, match="schedule"):
        HopSkipJumpConfig(schedule="linear")


def test_geoda_schedule_needs_a_per_image_budget() -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(2, *SHAPE, generator=torch.Generator().manual_seed(3))
    with pytest.raises(InputError, match="max_queries"):
        hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, victim(x).argmax(1),
                    config=HopSkipJumpConfig(schedule="geoda"))


@pytest.mark.parametrize("max_queries", [5, 40, 250, 1000])
@pytest.mark.parametrize("extra", [{"schedule": "geoda"}, {"schedule": "geoda", "start_tries": 30, "eta": 0.8}])
def test_allocation_honours_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=3000)
    cfg = HopSkipJumpConfig(iterations=1000, init_evals=20, semicircle=True, **extra)  # type: ignore[arg-type]
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=cfg)
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 3000
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


def test_geoda_schedule_spends_the_budget_and_is_deterministic() -> None:
    victim = TinyNet(seed=1).eval()
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(5))
    y = victim(x).argmax(1)
    cfg = HopSkipJumpConfig(iterations=1000, init_evals=20, semicircle=True, schedule="geoda", seed=2)
    runs = [hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=600, config=cfg)
            for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    per = runs[0].extra["queries_per_example"][runs[0].success]
    assert torch.equal(per, runs[1].extra["queries_per_example"][runs[1].success])
    # the plan leaves at most one boundary search's worth of the budget unspent
    assert bool((per >= 600 - 25).all())


def test_tuned_preset_plans_the_budget_only_when_there_is_one() -> None:
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    with_budget = tuned_settings(substitute=False, budgeted=True)
    assert with_budget["schedule"] == "geoda" and HopSkipJumpConfig(**with_budget).schedule == "geoda"  # type: ignore[arg-type]
    assert "schedule" not in tuned_settings(substitute=False)
    assert tuned_settings(substitute=True, budgeted=True) == tuned_settings(substitute=True)
