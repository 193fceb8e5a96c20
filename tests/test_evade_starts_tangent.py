"""HopSkipJump's additions: best-of-noise starts (OPT-attack), CGBA's semicircle search, the evaluation schedule;
budgets honoured exactly."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess, binary_search, find_starts
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.semicircle import semicircle_search
from stealkit.evade.decision_based.starts import best_of_noise
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def test_best_of_noise_and_the_semicircle_search_only_move_nearer_and_stay_adversarial() -> None:
    victim = TinyNet(seed=3).eval()
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(4))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    access = LabelAccess(oracle, y, None, max_queries=400)
    gen = torch.Generator().manual_seed(0)
    starts, found = find_starts(access, x, trials=50, gen=gen)
    idx = found.nonzero().squeeze(1)
    assert idx.numel() >= 4
    first = binary_search(access, x[idx], starts[idx], idx, 1e-3)
    better = best_of_noise(access, x[idx], first, idx, tries=60, tol=1e-3, gen=gen)
    before, after = (first - x[idx]).flatten(1).norm(dim=1), (better - x[idx]).flatten(1).norm(dim=1)
    assert bool((after <= before + 1e-6).all()) and bool((after < before).any())
    assert bool((victim(better).argmax(1) != y[idx]).all())
    # CGBA's search from there with an arbitrary normal estimate: never farther, every point adversarial
    arc = semicircle_search(access, x[idx], better, torch.randn(better.shape, generator=gen), idx, tol=1e-3)
    assert bool(((arc - x[idx]).flatten(1).norm(dim=1) <= after + 1e-6).all())
    assert bool((victim(arc).argmax(1) != y[idx]).all())
    assert int(access.used.max()) <= 400 and int(access.used.sum()) == oracle.ledger.total


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("extra", [{"start_tries": 30}, {"semicircle": True},
                                   {"semicircle": True, "start_tries": 30, "arc_tol": 1e-2}])
def test_additions_honour_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=900)
    r = hopskipjump(oracle, x, y, max_queries=max_queries,
                    config=HopSkipJumpConfig(iterations=50, init_evals=20, **extra))  # type: ignore[arg-type]
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total <= 900
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


def test_negative_start_tries_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="start_tries"):
        HopSkipJumpConfig(start_tries=-1)


@pytest.mark.parametrize("substitute", [False, True])
def test_tuned_settings_are_valid_config_fields(substitute: bool) -> None:
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    cfg = HopSkipJumpConfig(**tuned_settings(substitute=substitute))  # type: ignore[arg-type]
    assert cfg != HopSkipJumpConfig()


def test_tuned_settings_leave_out_the_image_subspace_for_flat_inputs() -> None:
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    assert "subspace" not in tuned_settings(substitute=True, shape=(30,))
    assert tuned_settings(substitute=True, shape=(1, 28, 28)) == tuned_settings(substitute=True)


def test_tuned_budgeted_settings_open_with_the_triangle_attack_on_large_enough_images_only() -> None:
    from stealkit.evade.decision_based.hopskipjump import TUNED, tuned_settings

    image = tuned_settings(substitute=False, shape=(1, 28, 28), budgeted=True)
    assert image["opening"] == 0.1 and HopSkipJumpConfig(**image).opening == 0.1  # type: ignore[arg-type]
    for shape in ((30,), (1, 8, 8)):  # not an image, or one smaller than OPENING_MIN_SIDE
        small = tuned_settings(substitute=False, shape=shape, budgeted=True)
        assert "opening" not in small and small["start_tries"] == TUNED[False]["start_tries"]
    assert "opening" not in tuned_settings(substitute=True, shape=(1, 28, 28), budgeted=True)
