"""The Triangle Attack alone and as HopSkipJump's opening: per-image budgets spent exactly, ledger = reported
queries, same seed same result, points adversarial and never farther than the start, clear errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess, binary_search
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.subspace import dct_directions, dct_matrix
from stealkit.evade.decision_based.triangle import TriangleConfig, triangle
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet, labelled_tiny_batch

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _batch(seed: int = 3) -> tuple[TinyNet, torch.Tensor, torch.Tensor]:
    return labelled_tiny_batch(seed)


def _adversarial(victim: TinyNet, x_adv: torch.Tensor, y: torch.Tensor) -> bool:
    with torch.no_grad():
        return bool((victim(x_adv).argmax(1) != y).all())


@pytest.mark.parametrize("max_queries", [5, 40, 250, 1000])
@pytest.mark.parametrize("extra", [{"freq": 1.0}, {"freq": 0.5, "coords": 0, "search_steps": 0},
                                   {"freq": 0.75, "coords": 2, "start_tries": 10}])
@pytest.mark.slow
def test_spends_exactly_the_per_image_cap_and_reports_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = _batch()
    oracle = LocalOracle(victim, SHAPE, mode="label")
    r = triangle(oracle, x, y, max_queries=max_queries, config=TriangleConfig(**extra))  # type: ignore[arg-type]
    per = r.extra["queries_per_example"]
    assert bool(r.success.all())
    assert per.tolist() == [max_queries] * 5  # one query per candidate: every image spends its whole budget
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"]
    assert _adversarial(victim, r.x_adv, y)


def test_a_ledger_budget_stops_it_without_passing_it() -> None:
    victim, x, y = _batch()
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=777)
    r = triangle(oracle, x, y, max_queries=1000, config=TriangleConfig(freq=1.0))
    assert int(r.extra["queries_per_example"].sum()) == oracle.ledger.total == 777
    assert _adversarial(victim, r.x_adv[r.success], y[r.success])


@pytest.mark.parametrize("max_queries", [5, 40, 250])
def test_opening_then_hopskipjump_honours_the_cap_and_the_ledger(max_queries: int) -> None:
    victim, x, y = _batch()
    oracle = LocalOracle(victim, SHAPE, mode="label")
    cfg = HopSkipJumpConfig(iterations=1000, init_evals=20, semicircle=True, opening=0.3, opening_freq=1.0)
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=cfg)
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"]
    assert _adversarial(victim, r.x_adv[r.success], y[r.success])
    alone = triangle(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=max(1, int(0.3 * max_queries)),
                     config=TriangleConfig(freq=1.0, coords=3))
    # HopSkipJump starts from the opening's points and never leaves one for a farther point
    assert bool((r.norms[r.success] <= alone.norms[r.success] + 1e-6).all())


@pytest.mark.slow
def test_same_seed_same_result_and_points_only_move_nearer() -> None:
    victim, x, y = _batch(seed=7)
    cfg = TriangleConfig(freq=1.0, seed=4)
    runs = [triangle(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=300, config=cfg) for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert torch.equal(runs[0].extra["queries_per_example"], runs[1].extra["queries_per_example"])
    other = triangle(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=300,
                     config=TriangleConfig(freq=1.0, seed=5))
    assert not torch.equal(runs[0].x_adv, other.x_adv)
    # from given starting points: never farther than the start, and nearer for most images
    start = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(11))
    oracle = LocalOracle(victim, SHAPE, mode="label")
    access = LabelAccess(oracle, y, None, max_queries=None)
    with torch.no_grad():
        ok = victim(start).argmax(1) != y
    assert int(ok.sum()) >= 2
    xs, ys, ss = x[ok], y[ok], binary_search(access, x[ok], start[ok], torch.arange(int(ok.sum())), 0.05)
    r = triangle(LocalOracle(victim, SHAPE, mode="label"), xs, ys, starting_points=ss, max_queries=200, config=cfg)
    d0 = (ss - xs).flatten(1).norm(dim=1)
    assert bool(r.success.all()) and _adversarial(victim, r.x_adv, ys)
    assert bool((r.norms <= d0 + 1e-6).all()) and bool((r.norms < 0.95 * d0).any())


def test_low_frequency_directions() -> None:
    gen = torch.Generator().manual_seed(0)
    m = dct_matrix(7)
    assert torch.allclose(m @ m.T, torch.eye(7), atol=1e-5)
    r = dct_directions(6, (2, 8, 8), 0.5, gen, "cpu", coords=3)
    coef = dct_matrix(8) @ r @ dct_matrix(8).T  # back to DCT coefficients
    assert torch.allclose(coef[:, :, 4:, :], torch.zeros(6, 2, 4, 8), atol=1e-5)
    assert torch.allclose(coef[:, :, :, 4:], torch.zeros(6, 2, 8, 4), atol=1e-5)
    assert ((coef.abs() > 1e-6).flatten(2).sum(2) == 3).all()  # exactly 3 coefficients per channel
    full = dct_directions(6, (2, 8, 8), 0.5, gen, "cpu")
    assert ((dct_matrix(8) @ full @ dct_matrix(8).T).abs()[:, :, :4, :4] > 0).all()


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="freq"):
        TriangleConfig(freq=0.0)
    with pytest.raises(InputError, match="half_range"):
        TriangleConfig(half_range=math.pi)
    with pytest.raises(InputError, match="half_range"):
        TriangleConfig(init_alpha=1.0)
    with pytest.raises(InputError, match="opening"):
        HopSkipJumpConfig(opening=1.0)
    victim, x, y = _batch()
    with pytest.raises(InputError, match="max_queries"):
        hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, config=HopSkipJumpConfig(opening=0.2))
    with pytest.raises(InputError, match="C, H, W"):
        triangle(LocalOracle(victim, (16,), mode="label"), x.flatten(1), y, max_queries=10)


@pytest.mark.slow
def test_cli_attack_triangle_spends_exactly_max_queries_per_image(tmp_path: Path) -> None:
    from stealkit.cli import main
    from tests.test_evade_priors import _save_mlp

    victim = _save_mlp(tmp_path / "victim", constant=None)
    out = tmp_path / "ta"
    rc = main(["-q", "attack", "triangle", "--victim", str(victim), "--n", "4", "--max-queries", "60",
               "--set", "search_steps=1", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["successes"] == summary["attempts"] >= 1
    # one clean query per sampled image, then exactly 60 per attacked image
    assert summary["victim_queries"]["predict"] == 4 + 60 * summary["attempts"]
    assert summary["median_queries_per_image"] == 60
