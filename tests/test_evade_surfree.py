"""SurFree alone and as HopSkipJump's finishing phase: budgets honoured exactly, ledger = reported queries,
points adversarial and never farther, deterministic, orthogonal directions, clear errors."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig
from stealkit.evade.decision_based.surfree import (
    SurFreeConfig,
    _Search,
    dct_matrix,
    hopskipjump_surfree,
    surfree,
)
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet, labelled_tiny_batch

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _batch(seed: int = 3) -> tuple[TinyNet, torch.Tensor, torch.Tensor]:
    return labelled_tiny_batch(seed)


@pytest.mark.parametrize("max_queries", [5, 40, 250, 1000])
@pytest.mark.parametrize("extra", [{}, {"basis": "dct", "freq": 0.5}, {"evals": 1, "theta_max": 5.0, "n_ortho": 0}])
def test_surfree_honours_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = _batch()
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=3000)
    r = surfree(oracle, x, y, max_queries=max_queries, config=SurFreeConfig(**extra))  # type: ignore[arg-type]
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 3000
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


@pytest.mark.parametrize("max_queries", [5, 40, 250, 1000])
def test_finishing_phase_honours_the_per_image_cap_and_the_ledger(max_queries: int) -> None:
    victim, x, y = _batch()
    oracle = LocalOracle(victim, SHAPE, mode="label")
    r = hopskipjump_surfree(oracle, x, y, max_queries=max_queries, share=0.6,
                            hsj=HopSkipJumpConfig(iterations=1000, init_evals=20, semicircle=True))
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"]
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


def test_surfree_only_moves_nearer_and_is_deterministic() -> None:
    victim, x, y = _batch(seed=7)
    short = surfree(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=60, config=SurFreeConfig(seed=4))
    runs = [surfree(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=600, config=SurFreeConfig(seed=4))
            for _ in range(2)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert torch.equal(runs[0].extra["queries_per_example"], runs[1].extra["queries_per_example"])
    ok = short.success & runs[0].success
    assert bool(ok.any())
    # the same seed runs the same search, so more queries only bring points nearer
    assert bool((runs[0].norms[ok] <= short.norms[ok] + 1e-6).all()) and bool((runs[0].norms[ok] < short.norms[ok]).any())


def test_directions_are_orthogonal_to_the_current_one_and_to_the_kept_ones() -> None:
    victim, x, y = _batch()
    access = LabelAccess(LocalOracle(victim, SHAPE, mode="label"), y, None, max_queries=10)
    search = _Search(access, x, torch.arange(5), SurFreeConfig(n_ortho=4), torch.Generator().manual_seed(0))
    u = torch.nn.functional.normalize(torch.randn(5, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    rows = torch.arange(5)
    for _ in range(6):  # more than n_ortho: the ring wraps
        v = search._directions(rows, u)
        search.hist[:, search.count % 4] = v
        search.count += 1
        assert torch.allclose((v * u).sum(1), torch.zeros(5), atol=1e-5)
        assert torch.allclose(v.norm(dim=1), torch.ones(5), atol=1e-5)
    gram = torch.einsum("bkd,bjd->bkj", search.hist, search.hist)
    assert torch.allclose(gram, torch.eye(4).expand(5, 4, 4), atol=1e-4)


def test_dct_matrix_is_orthonormal() -> None:
    m = dct_matrix(7)
    assert torch.allclose(m @ m.T, torch.eye(7), atol=1e-5)


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(InputError, match="basis"):
        SurFreeConfig(basis="wavelet")
    with pytest.raises(InputError, match="theta_max"):
        SurFreeConfig(theta_max=120)
    victim, x, y = _batch()
    with pytest.raises(InputError, match="share"):
        hopskipjump_surfree(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=100, share=1.5)
    with pytest.raises(InputError, match="dct"):
        surfree(LocalOracle(victim, (16,), mode="label"), x.flatten(1), y, max_queries=10,
                config=SurFreeConfig(basis="dct"))
