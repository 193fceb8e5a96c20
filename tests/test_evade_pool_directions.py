"""The attacker's pool images as the Triangle Attack's directions (``TriangleConfig(pool_share, pool_dirs)``,
HopSkipJump's ``opening_pool``): per-image caps spent exactly and the ledger equal to the reported queries,
same seed same result, bitwise as before when off, directions really ``x' - x``, one clear error for a bad pool."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.image_starts import kmeans, spread
from stealkit.evade.decision_based.pool_directions import PoolDirections
from stealkit.evade.decision_based.triangle import TriangleConfig, triangle
from stealkit.oracle import LocalOracle
from tests.conftest import labelled_tiny_batch
from tests.test_evade_image_starts import _adversarial, _pool

SHAPE = (1, 4, 4)
HSJ = {"iterations": 1000, "init_evals": 20, "semicircle": True, "opening": 0.3, "opening_freq": 1.0}


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("extra", [{"pool_share": 0.5, "pool_dirs": 10}, {"pool_share": 1.0, "pool_dirs": 3},
                                   {"pool_share": 0.25, "pool_dirs": 50, "search_steps": 0}])
def test_triangle_with_pool_directions_spends_exactly_the_cap(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    r = triangle(oracle, x, y, max_queries=max_queries, config=TriangleConfig(freq=1.0, **extra),  # type: ignore[arg-type]
                 pool=_pool())
    per = r.extra["queries_per_example"]
    assert bool(r.success.all()) and per.tolist() == [max_queries] * 5
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"]
    assert _adversarial(victim, r.x_adv, y)


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("extra", [{"opening_pool": 0.5, "opening_pool_dirs": 10},
                                   {"opening_pool": 1.0, "pool_tries": 20, "pool_spread": 10},
                                   {"opening_pool": 0.3, "pool_tries": 20, "pool_at": "opening"}])
def test_opening_with_pool_directions_honours_the_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=1100)
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=HopSkipJumpConfig(**(HSJ | extra)),  # type: ignore[arg-type]
                    start_pool=_pool())
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 1100
    assert _adversarial(victim, r.x_adv[r.success], y[r.success])
    if max_queries == 250:
        assert bool(r.success.all()) and int(per.max()) >= 200  # the last image may be cut by the ledger


def test_same_seed_same_result_and_the_option_changes_the_search() -> None:
    victim, x, y = labelled_tiny_batch(seed=5, n=8)

    def run(share: float, seed: int = 0) -> tuple[torch.Tensor, list[int]]:
        oracle = LocalOracle(victim, SHAPE, mode="label")
        r = triangle(oracle, x, y, max_queries=120, pool=_pool(400),
                     config=TriangleConfig(freq=1.0, pool_share=share, pool_dirs=20, seed=seed))
        return r.x_adv, r.extra["queries_per_example"].tolist()

    a, b = run(0.5), run(0.5)
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert not torch.equal(a[0], run(0.0)[0])  # the pool directions move the points elsewhere
    assert not torch.equal(a[0], run(0.5, seed=1)[0])


def test_off_is_bitwise_as_before() -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    out = []
    for pool in (None, _pool()):
        oracle = LocalOracle(victim, SHAPE, mode="label")
        r = triangle(oracle, x, y, max_queries=150, config=TriangleConfig(freq=1.0), pool=pool)
        out.append((r.x_adv, r.extra["queries_per_example"].tolist(), oracle.ledger.total))
    for extra, pool in (({}, None), ({"pool_tries": 20}, _pool()), ({"pool_tries": 20, "opening_pool": 0.0}, _pool())):
        oracle = LocalOracle(victim, SHAPE, mode="label")
        r = hopskipjump(oracle, x, y, max_queries=150, config=HopSkipJumpConfig(**(HSJ | extra)),  # type: ignore[arg-type]
                        start_pool=pool)
        out.append((r.x_adv, r.extra["queries_per_example"].tolist(), oracle.ledger.total))
    assert torch.equal(out[0][0], out[1][0]) and out[0][1:] == out[1][1:]
    assert torch.equal(out[3][0], out[4][0]) and out[3][1:] == out[4][1:]


def test_the_directions_are_differences_to_the_spread_pool_images() -> None:
    pool, x = _pool(60), _pool(4, seed=2)
    dirs = PoolDirections(pool, x, dirs=6, share=1.0)
    assert torch.equal(dirs.cand, spread(pool, x, kmeans(pool, 6), 6))
    r = torch.zeros(3, 16)
    rows = torch.tensor([0, 2, 3])
    got = dirs.mix(r, rows, torch.Generator().manual_seed(0))
    for k, i in enumerate(rows.tolist()):
        diffs = [(pool[j] - x[i]).flatten() for j in dirs.cand[i].tolist()]
        assert any(torch.equal(got[k], d) for d in diffs)
    half = PoolDirections(pool, x, dirs=6, share=0.5).mix(torch.full((400, 16), 7.0), torch.zeros(400, dtype=torch.long),
                                                          torch.Generator().manual_seed(1))
    kept = int((half == 7.0).all(1).sum())
    assert 150 < kept < 250  # about half the rows keep their random direction


@pytest.mark.parametrize(("pool", "match"), [
    (torch.rand(5, 1, 4, 5), "shape"), (torch.rand(0, 1, 4, 4), "empty"),
    (torch.full((3, 1, 4, 4), float("nan")), "NaN"), (torch.rand(3, 1, 4, 4) * 255, r"\[0, 1\]")])
def test_a_bad_pool_is_one_clear_error_before_any_query(pool: torch.Tensor, match: str) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    with pytest.raises(InputError, match=match):
        triangle(oracle, x, y, max_queries=50, config=TriangleConfig(pool_share=0.5), pool=pool)
    with pytest.raises(InputError, match=match):
        hopskipjump(oracle, x, y, max_queries=50, config=HopSkipJumpConfig(**(HSJ | {"opening_pool": 0.5})),  # type: ignore[arg-type]
                    start_pool=pool)
    assert oracle.ledger.total == 0


def test_settings_are_checked() -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    for bad in ({"pool_share": -0.1}, {"pool_share": 1.5}, {"pool_dirs": 0}):
        with pytest.raises(InputError, match="pool_share"):
            TriangleConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="opening_pool"):
        HopSkipJumpConfig(opening_pool=2.0)
    with pytest.raises(InputError, match="set opening too"):
        HopSkipJumpConfig(opening_pool=0.5)
    with pytest.raises(InputError, match="pool="):
        triangle(oracle, x, y, max_queries=50, config=TriangleConfig(pool_share=0.5))
    with pytest.raises(InputError, match="start_pool"):
        hopskipjump(oracle, x, y, max_queries=50, config=HopSkipJumpConfig(**(HSJ | {"opening_pool": 0.5})))  # type: ignore[arg-type]
    assert oracle.ledger.total == 0
