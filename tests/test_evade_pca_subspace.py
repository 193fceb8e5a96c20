"""Probes in the principal subspace of the attacker's pool (``pca_k``, QEBA-I): the basis, the exact per-image
budget and the ledger, determinism, bitwise as before when off, and one clear error for a bad pool."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.pca_subspace import pca_basis
from stealkit.oracle import LocalOracle
from tests.conftest import labelled_tiny_batch

SHAPE = (1, 4, 4)
BASE = {"init_evals": 20, "semicircle": True, "orthogonal": True, "start_tries": 5}
PCA = {"pca_k": 3, "pca_w": 0.5}


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _pool(n: int = 200, seed: int = 11) -> torch.Tensor:
    return torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(seed))


def test_the_basis_is_the_pools_top_principal_subspace() -> None:
    gen = torch.Generator().manual_seed(0)
    plane = torch.linalg.qr(torch.randn(16, 2, generator=gen, dtype=torch.float64))[0]
    # images = a constant offset + large variation in a plane + tiny noise: the top-2 components span the plane
    coef = torch.randn(500, 2, generator=gen, dtype=torch.float64) * torch.tensor([0.1, 0.05], dtype=torch.float64)
    imgs = 0.5 + coef @ plane.T + 1e-4 * torch.randn(500, 16, generator=gen, dtype=torch.float64)
    basis = pca_basis(imgs.float().view(500, *SHAPE), 2)
    assert basis.shape == (16, 2) and basis.dtype == torch.float32
    assert torch.allclose(basis.T @ basis, torch.eye(2), atol=1e-5)
    b = basis.double()
    assert torch.allclose(b @ (b.T @ plane), plane, atol=1e-3)  # centred: the offset is not a component
    assert torch.equal(basis, pca_basis(imgs.float().view(500, *SHAPE), 2))  # deterministic, signs included


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("extra", [{}, {"pca_w": 1.0}, {"pca_rounds": 2}, {"opening": 0.3, "opening_freq": 1.0},
                                   {"pool_tries": 10, "pool_spread": 5}],
                         ids=["half", "all", "rounds", "opening", "with-pool-starts"])
def test_pca_probes_honour_the_per_image_cap_and_the_ledger(max_queries: int, extra: dict[str, object]) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=1100)
    cfg = HopSkipJumpConfig(**(BASE | PCA | extra | {"schedule": "geoda"}))  # type: ignore[arg-type]
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=cfg, start_pool=_pool())
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 1100
    with torch.no_grad():
        assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())
    if "pool_tries" not in extra:  # the probes move into the subspace, never add any: the spend without the option
        plain_cfg = HopSkipJumpConfig(**(BASE | extra | {"schedule": "geoda"}))  # type: ignore[arg-type]
        plain = hopskipjump(LocalOracle(victim, SHAPE, mode="label", budget=1100), x, y, max_queries=max_queries,
                            config=plain_cfg)
        assert torch.equal(per, plain.extra["queries_per_example"])
    if max_queries == 250:
        assert int(per.max()) >= 200


def test_pca_probes_are_deterministic_and_change_the_result() -> None:
    victim, x, y = labelled_tiny_batch(seed=5, n=5)

    def run(**kw: object) -> tuple[torch.Tensor, list[int]]:
        r = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=400,
                        config=HopSkipJumpConfig(seed=3, **(BASE | kw)),  # type: ignore[arg-type]
                        start_pool=_pool() if kw.get("pca_k") else None)
        return r.x_adv, r.extra["queries_per_example"].tolist()

    a, b = run(**PCA), run(**PCA)
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert not torch.equal(a[0], run()[0])
    assert not torch.equal(a[0], run(**(PCA | {"pca_w": 1.0}))[0])


def test_off_is_bitwise_as_before() -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    out = []
    for cfg in (HopSkipJumpConfig(**BASE), HopSkipJumpConfig(**(BASE | {"pca_w": 0.9, "pca_rounds": 3}))):  # type: ignore[arg-type]
        oracle = LocalOracle(victim, SHAPE, mode="label")
        r = hopskipjump(oracle, x, y, max_queries=200, config=cfg)
        out.append((r.x_adv, r.extra["queries_per_example"].tolist(), oracle.ledger.total))
    assert torch.equal(out[0][0], out[1][0]) and out[0][1:] == out[1][1:]


@pytest.mark.parametrize(("pool", "match"), [
    (torch.rand(5, 1, 4, 5), "shape"), (torch.rand(0, 1, 4, 4), "empty"),
    (torch.full((3, 1, 4, 4), float("nan")), "NaN"), (torch.rand(3, 1, 4, 4) * 255, r"\[0, 1\]"),
    (None, "start pool")])
def test_a_bad_pool_is_one_clear_error_before_any_query(pool: torch.Tensor | None, match: str) -> None:
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    with pytest.raises(InputError, match=match):
        hopskipjump(oracle, x, y, max_queries=50, config=HopSkipJumpConfig(**PCA), start_pool=pool)
    assert oracle.ledger.total == 0


def test_bad_pca_settings_are_one_input_error() -> None:
    for bad in ({"pca_k": -1}, {"pca_k": 3, "pca_w": 0.0}, {"pca_k": 3, "pca_w": 1.5}, {"pca_k": 3, "pca_rounds": -1},
                {"pca_k": 3, "subspace": 2}, {"pca_k": 3, "probe_freq": 0.5}, {"pca_k": 3, "shared_k": 2}):
        with pytest.raises(InputError):
            HopSkipJumpConfig(**bad)  # type: ignore[arg-type]
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    with pytest.raises(InputError, match="components"):
        hopskipjump(oracle, x, y, max_queries=50, config=HopSkipJumpConfig(pca_k=17), start_pool=_pool())
    with pytest.raises(InputError, match="two images"):
        pca_basis(_pool(1), 2)
    for cfg in (HopSkipJumpConfig(**PCA), HopSkipJumpConfig(**(PCA | {"opening": 0.2}))):  # type: ignore[arg-type]
        with pytest.raises(InputError, match="two images"):  # before the opening's queries too
            hopskipjump(oracle, x, y, max_queries=50, config=cfg, start_pool=_pool(1))
    assert oracle.ledger.total == 0
