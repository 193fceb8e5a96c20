"""Decision-based attacks (Boundary, HopSkipJump) against a label-only oracle: budgets and correctness."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.decision_based.boundary import BoundaryConfig, boundary_attack
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.oracle import LocalOracle, QueryLedger
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


def _attack(name: str, oracle: LocalOracle, x: torch.Tensor, y: torch.Tensor, **kw: object):
    if name == "boundary":
        return boundary_attack(oracle, x, y, config=BoundaryConfig(steps=int(kw.pop("steps", 150))), **kw)
    return hopskipjump(oracle, x, y, config=HopSkipJumpConfig(iterations=int(kw.pop("steps", 4)), init_evals=20),
                       **kw)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    """Tiny models gain nothing from threads, and on a loaded machine OpenMP waits cost seconds."""
    torch.set_num_threads(1)


def _labels(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(1)


@pytest.mark.parametrize("name", ["boundary", "hopskipjump"])
def test_finds_verified_adversarials_and_reports_ledger_queries(tiny_model: nn.Module, name: str) -> None:
    x = torch.rand(8, *SHAPE, generator=torch.Generator().manual_seed(0))
    y = _labels(tiny_model, x)
    oracle = LocalOracle(tiny_model, SHAPE, mode="label")
    r = _attack(name, oracle, x, y, max_queries=600)
    assert r.success_rate >= 0.75
    assert bool((_labels(tiny_model, r.x_adv[r.success]) != y[r.success]).all())
    assert torch.equal(r.x_adv[~r.success], x[~r.success])
    assert float(r.x_adv.min()) >= 0 and float(r.x_adv.max()) <= 1
    assert r.queries == oracle.ledger.as_dict()
    assert int(r.extra["queries_per_example"].sum()) == oracle.ledger.total
    assert int(r.extra["queries_per_example"].max()) <= 600


@pytest.mark.parametrize("name", ["boundary", "hopskipjump"])
def test_distance_shrinks_with_more_queries(tiny_model: nn.Module, name: str) -> None:
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(1))
    y = _labels(tiny_model, x)
    short = _attack(name, LocalOracle(tiny_model, SHAPE, mode="label"), x, y, steps=1)
    long = _attack(name, LocalOracle(tiny_model, SHAPE, mode="label"), x, y, steps=300 if name == "boundary" else 8)
    both = short.success & long.success
    assert bool(both.any())
    assert float(long.norms[both].median()) < float(short.norms[both].median())


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["boundary", "hopskipjump"]), budget=st.integers(1, 400),
       max_queries=st.one_of(st.none(), st.integers(1, 150)), seed=st.integers(0, 100))
def test_never_exceeds_budget_or_max_queries(name: str, budget: int, max_queries: int | None, seed: int) -> None:
    model = TinyNet(seed=seed % 3).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(seed))
    y = _labels(model, x)
    oracle = LocalOracle(model, SHAPE, mode="label", budget=budget)
    r = _attack(name, oracle, x, y, max_queries=max_queries, steps=400 if name == "boundary" else 30)
    assert oracle.ledger.total <= budget
    if max_queries is not None:
        assert int(r.extra["queries_per_example"].max()) <= max_queries
    assert r.queries["predict"] == oracle.ledger.total
    assert bool((_labels(model, r.x_adv[r.success]) != y[r.success]).all())


@pytest.mark.parametrize("name", ["boundary", "hopskipjump"])
def test_shared_ledger_budget_is_respected(tiny_model: nn.Module, name: str) -> None:
    ledger = QueryLedger(budget=250)
    ledger.charge("predict", 100)  # spent elsewhere before the attack
    oracle = LocalOracle(tiny_model, SHAPE, mode="label", ledger=ledger)
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(2))
    r = _attack(name, oracle, x, _labels(tiny_model, x), steps=500 if name == "boundary" else 50)
    assert ledger.total <= 250
    assert r.queries["predict"] == ledger.total - 100


@pytest.mark.parametrize("name", ["boundary", "hopskipjump"])
def test_targeted_from_starting_points(tiny_model: nn.Module, name: str) -> None:
    pool = torch.rand(200, *SHAPE, generator=torch.Generator().manual_seed(3))
    labels = _labels(tiny_model, pool)
    x = pool[:6]
    y = labels[:6]
    present = labels.unique()
    assert present.numel() >= 2
    target = torch.stack([present[present != c][0] for c in y])
    starts = torch.stack([pool[(labels == int(t)).nonzero()[0, 0]] for t in target])
    oracle = LocalOracle(tiny_model, SHAPE, mode="probs")  # any mode: only labels are used
    r = _attack(name, oracle, x, y, targeted=True, target=target, starting_points=starts)
    assert bool(r.success.all())
    assert torch.equal(_labels(tiny_model, r.x_adv), target)
    assert bool((r.norms <= (starts - x).flatten(1).norm(dim=1) + 1e-5).all())


def test_rejects_bad_inputs(tiny_model: nn.Module) -> None:
    oracle = LocalOracle(tiny_model, SHAPE, mode="label")
    x = torch.rand(2, *SHAPE)
    with pytest.raises(InputError, match="oracle takes"):
        boundary_attack(oracle, torch.rand(2, 1, 5, 5), torch.zeros(2))
    with pytest.raises(InputError, match="max_queries"):
        hopskipjump(oracle, x, torch.zeros(2), max_queries=0)
    with pytest.raises(InputError, match="starting_points"):
        hopskipjump(oracle, x, torch.zeros(2), starting_points=torch.rand(3, *SHAPE))
