"""Starts from the attacker's natural images (``start_pool``, ``pool_tries``, ``pool_spread``): the nearest pool
images found without a query, points only move nearer and stay adversarial, per-image caps and the ledger
honoured exactly, same seed same result, bitwise as before without a pool, clear errors for a bad pool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess, binary_search, find_starts
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.image_starts import best_of_pool, check_pool, kmeans, nearest, spread
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet, labelled_tiny_batch

SHAPE = (1, 4, 4)
BASE = {"iterations": 1000, "init_evals": 20, "semicircle": True, "start_tries": 5}


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _pool(n: int = 200, seed: int = 11) -> torch.Tensor:
    return torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(seed))


def _adversarial(victim: TinyNet, x_adv: torch.Tensor, y: torch.Tensor) -> bool:
    with torch.no_grad():
        return bool((victim(x_adv).argmax(1) != y).all())


def test_nearest_ranks_the_pool_by_pixel_distance_without_a_query() -> None:
    pool, x = _pool(50), _pool(3, seed=2)
    got = nearest(pool, x, 7, chunk=16)  # chunks across the pool give the same ranking
    brute = torch.stack([(pool - xi).flatten(1).norm(dim=1).argsort()[:7] for xi in x])
    assert got.tolist() == brute.tolist()
    assert nearest(pool, x, 500).shape == (3, 50)  # never more than the pool holds


def test_spread_takes_the_nearest_image_of_each_cluster_nearest_first() -> None:
    pool, x = _pool(60), _pool(4, seed=2)
    labels = kmeans(pool, 6, seed=1)
    assert torch.equal(labels, kmeans(pool, 6, seed=1)) and len(set(labels.tolist())) == 6
    got = spread(pool, x, labels, 4)
    assert got.shape == (4, 4)
    for i in range(4):
        d = (pool - x[i]).flatten(1).norm(dim=1)
        firsts = sorted((float(d[labels == c].min()), int(torch.nonzero(labels == c).squeeze(1)[d[labels == c].argmin()]))
                        for c in range(6))
        assert got[i].tolist() == [j for _, j in firsts[:4]]
        assert len({int(labels[j]) for j in got[i]}) == 4  # one per cluster


def test_a_near_other_class_image_in_the_pool_becomes_the_start() -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    access = LabelAccess(oracle, y, None, max_queries=10_000)
    gen = torch.Generator().manual_seed(0)
    starts, found = find_starts(access, x, trials=100, gen=gen)
    idx = found.nonzero().squeeze(1)
    first = binary_search(access, x[idx], starts[idx], idx, 1e-4)
    # far noise starts, then a boundary point just past half way: a pool image of another class nearer than them
    far = binary_search(access, x[idx], starts[idx], idx, 1e-4)
    near = x[idx] + 0.6 * (far - x[idx]) / 0.5
    plain = (first - x[idx]).flatten(1).norm(dim=1)
    inside = torch.zeros(idx.numel(), dtype=torch.bool)
    with torch.no_grad():
        other = victim(near.clamp(0, 1)).argmax(1) != y[idx]
    inside = other & ((near >= 0) & (near <= 1)).flatten(1).all(1)
    pool = torch.cat([_pool(100), near.clamp(0, 1)[inside]])
    before = int(access.used.sum())
    better = best_of_pool(access, x[idx], first, idx, pool, tries=len(pool), tol=1e-4)
    after = (better - x[idx]).flatten(1).norm(dim=1)
    assert bool((after <= plain + 1e-6).all())  # never farther
    assert _adversarial(victim, better, y[idx])
    assert int(access.used.sum()) - before >= idx.numel() * len(pool)  # one query per candidate, at least
    assert int(access.used.sum()) == oracle.ledger.total
    # where the pool held an other-class image at 0.6 of the boundary distance of the old start, the start is
    # no farther than that image
    dist_near = (near - x[idx]).flatten(1).norm(dim=1)
    assert bool(inside.any())
    assert bool((after[inside] <= dist_near[inside] + 1e-5).all())
    assert bool((after[inside] < plain[inside]).all())


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("extra", [{"pool_tries": 30}, {"pool_tries": 100, "start_tries": 0},
                                   {"pool_tries": 30, "opening": 0.3, "opening_freq": 1.0},
                                   {"pool_tries": 8, "pool_spread": 10}])
def test_pool_starts_honour_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=1100)
    cfg = HopSkipJumpConfig(**(BASE | extra))  # type: ignore[arg-type]
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=cfg, start_pool=_pool())
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 1100
    assert _adversarial(victim, r.x_adv[r.success], y[r.success])
    if max_queries == 250:  # enough for every phase (the last image may be cut by the ledger's 1,100)
        assert int(per.max()) >= 200 and bool(r.success.all())
        starts = r.extra["start_norms"]
        assert bool((r.norms <= starts + 1e-6).all())  # the rounds never leave the start for a farther point


def test_a_ledger_budget_stops_the_pool_tries_without_passing_it() -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=333)
    cfg = HopSkipJumpConfig(**(BASE | {"pool_tries": 200}))  # type: ignore[arg-type]
    r = hopskipjump(oracle, x, y, max_queries=1000, config=cfg, start_pool=_pool())
    assert int(r.extra["queries_per_example"].sum()) == oracle.ledger.total <= 333
    assert _adversarial(victim, r.x_adv[r.success], y[r.success])


def test_pool_starts_are_nearer_on_average_and_the_same_seed_gives_the_same_result() -> None:
    victim, x, y = labelled_tiny_batch(seed=5, n=8)
    cfg = HopSkipJumpConfig(**(BASE | {"pool_tries": 100, "start_tries": 0, "iterations": 0}))  # type: ignore[arg-type]
    plain = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=500, config=cfg)
    runs = [hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=500, config=cfg,
                        start_pool=_pool(400)) for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert runs[0].extra["queries_per_example"].tolist() == runs[1].extra["queries_per_example"].tolist()
    assert bool((runs[0].norms <= plain.norms + 1e-6).all()) and float(runs[0].norms.sum()) < float(plain.norms.sum())


@pytest.mark.parametrize("opening", [0.0, 0.3])
def test_without_a_pool_the_attack_is_bitwise_as_before(opening: float) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    base = BASE | {"opening": opening, "opening_freq": 1.0}
    out = []
    for extra in ({}, {"pool_tries": 30}):
        oracle = LocalOracle(victim, SHAPE, mode="label")
        r = hopskipjump(oracle, x, y, max_queries=200, config=HopSkipJumpConfig(**(base | extra)))  # type: ignore[arg-type]
        out.append((r.x_adv, r.extra["queries_per_example"].tolist(), oracle.ledger.total))
    for x_adv, per, total in out[1:]:
        assert torch.equal(x_adv, out[0][0]) and per == out[0][1] and total == out[0][2]


@pytest.mark.parametrize(("pool", "match"), [
    (torch.rand(5, 1, 4, 5), "shape"), (torch.rand(5, 16), "shape"), (torch.rand(0, 1, 4, 4), "empty"),
    (torch.full((3, 1, 4, 4), float("nan")), "NaN"), (torch.rand(3, 1, 4, 4) * 255, r"\[0, 1\]"),
    (torch.rand(3, 1, 4, 4) - 0.5, r"\[0, 1\]")])
def test_a_bad_pool_is_one_clear_error(pool: torch.Tensor, match: str) -> None:
    with pytest.raises(InputError, match=match):
        check_pool(pool, SHAPE)
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    with pytest.raises(InputError, match=match):
        hopskipjump(oracle, x, y, max_queries=50, config=HopSkipJumpConfig(pool_tries=5), start_pool=pool)
    assert oracle.ledger.total == 0  # nothing was asked


def test_pool_settings_are_checked() -> None:
    with pytest.raises(InputError, match="pool_tries"):
        HopSkipJumpConfig(pool_tries=-1)
    with pytest.raises(InputError, match="pool_spread"):
        HopSkipJumpConfig(pool_spread=-2)
    victim, x, y = labelled_tiny_batch(seed=3)
    with pytest.raises(InputError, match="pool_tries"):
        hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=50, start_pool=_pool())


@pytest.mark.slow
def test_cli_start_pool_from_the_attacker_split_or_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from stealkit.cli import main
    from tests.test_evade_priors import _save_mlp

    victim = _save_mlp(tmp_path / "victim", constant=None)
    out = tmp_path / "hsj"
    rc = main(["-q", "attack", "hopskipjump", "--victim", str(victim), "--n", "4", "--max-queries", "150",
               "--start-pool", "pool", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["start_pool"] == "pool" and config["config"]["start_pool_images"] > 0
    assert summary["successes"] == summary["attempts"] >= 1
    assert summary["victim_queries"]["predict"] <= 4 + 150 * summary["attempts"]
    capsys.readouterr()
    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((3, 1, 8, 8), 255.0, dtype=np.float32))
    objs = tmp_path / "objs.npy"
    np.save(objs, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not a safetensors file")
    truncated = tmp_path / "truncated.npy"
    np.save(truncated, np.zeros((3, 1, 8, 8), dtype=np.float32))
    truncated.write_bytes(truncated.read_bytes()[:100])
    for source, match in ((str(bad), "[0, 1]"), (str(objs), "pickle"), ("nowhere.npy", "expected 'pool'"),
                          (str(corrupt), "not a readable safetensors file"), (str(truncated), "not a plain numeric")):
        assert main(["attack", "hopskipjump", "--victim", str(victim), "--n", "2", "--max-queries", "50",
                     "--start-pool", source, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
    assert main(["attack", "hopskipjump", "--victim", str(victim), "--n", "2", "--start-pool", "pool",
                 "--substitute", str(victim), "--out", str(tmp_path / "y")]) == 2
    assert "give one" in capsys.readouterr().err


def test_the_tuned_preset_adds_the_pool_settings_only_with_a_pool_and_no_substitute() -> None:
    from stealkit.evade.decision_based.hopskipjump import TUNED_POOL, tuned_settings

    plain = tuned_settings(substitute=False, shape=(1, 28, 28), budgeted=True)
    pooled = tuned_settings(substitute=False, shape=(1, 28, 28), budgeted=True, pool=True)
    assert pooled == plain | TUNED_POOL and "pool_tries" not in plain
    assert tuned_settings(substitute=True, pool=True) == tuned_settings(substitute=True)
    assert HopSkipJumpConfig(**pooled).pool_spread == 100  # type: ignore[arg-type]
