"""A subspace of boundary normals shared across the images of a run (``shared_k``): the subspace itself, the
exact per-image budget and ledger, determinism, and a no-op with a single image."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.shared_subspace import SharedSubspace, subspace_probes
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)
SHARED = {"init_evals": 20, "semicircle": True, "orthogonal": True, "shared_k": 3, "shared_w": 0.5}


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def test_the_basis_spans_the_estimates_and_needs_two_images() -> None:
    gen = torch.Generator().manual_seed(0)
    plane = torch.linalg.qr(torch.randn(16, 2, generator=gen))[0]  # every estimate lies in this plane
    est = (torch.randn(4, 2, generator=gen) @ plane.T).view(4, *SHAPE)
    s = SharedSubspace(torch.tensor([0, 0, 1, 1]), k=2, window=2, per_class=False)
    s.add(torch.tensor([0]), est[:1])
    assert s.bases(torch.tensor([0, 1])) == [None, None]  # one image's estimates: no shared subspace
    s.add(torch.tensor([1, 2, 3]), est[1:])
    basis = s.bases(torch.tensor([0]))[0]
    assert basis is not None and basis.shape == (16, 2)
    assert torch.allclose(basis @ (basis.T @ plane), plane, atol=1e-5)
    u = subspace_probes(basis, 7, SHAPE, gen).flatten(1)
    assert torch.allclose(u.norm(dim=1), torch.ones(7), atol=1e-5)
    assert torch.allclose(u @ basis @ basis.T, u, atol=1e-5)
    by_class = SharedSubspace(torch.tensor([0, 0, 1, 2]), k=2, window=2, per_class=True)
    by_class.add(torch.tensor([0, 1, 2, 3]), est)
    got = by_class.bases(torch.tensor([0, 2, 3]))
    assert got[0] is not None and got[1] is None and got[2] is None  # classes 1 and 2 have one image each


def test_the_buffer_keeps_the_last_window_rounds() -> None:
    s = SharedSubspace(torch.zeros(2), k=5, window=2, per_class=False)
    for r in range(4):
        s.add(torch.tensor([0, 1]), torch.full((2, *SHAPE), float(r)))
    assert [float(v[0]) for v in s.rows[0]] == [2.0, 3.0]


@pytest.mark.parametrize("max_queries", [5, 40, 250])
@pytest.mark.parametrize("option", [{}, {"shared_class": True}, {"shared_prior": True}],
                         ids=["shared", "per-class", "prior"])
def test_shared_options_honour_the_per_image_cap_and_the_ledger(max_queries: int, option: dict) -> None:
    victim = TinyNet(seed=0).eval()
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=2000)
    cfg = HopSkipJumpConfig(**(SHARED | option | {"schedule": "geoda"}))
    r = hopskipjump(oracle, x, y, max_queries=max_queries, config=cfg)
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total == r.queries["predict"] <= 2000
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())
    if "shared_prior" not in option:  # shared probes move probes, never add any: the spend without the option
        plain = hopskipjump(LocalOracle(victim, SHAPE, mode="label", budget=2000), x, y, max_queries=max_queries,
                            config=HopSkipJumpConfig(**(SHARED | {"shared_k": 0, "schedule": "geoda"})))
        assert torch.equal(per, plain.extra["queries_per_example"])


def test_shared_probes_are_deterministic_change_the_result_and_are_a_no_op_for_one_image() -> None:
    victim = TinyNet(seed=2).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(6))
    y = victim(x).argmax(1)
    plain = {k: v for k, v in SHARED.items() if not k.startswith("shared")}

    def run(x: torch.Tensor, y: torch.Tensor, **kw: object) -> torch.Tensor:
        r = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=400,
                        config=HopSkipJumpConfig(seed=3, **kw))  # type: ignore[arg-type]
        return r.x_adv

    a, b = run(x, y, **SHARED), run(x, y, **SHARED)
    assert torch.equal(a, b)
    assert not torch.equal(a, run(x, y, **plain))
    assert torch.equal(run(x[:1], y[:1], **SHARED), run(x[:1], y[:1], **plain))


def test_bad_shared_settings_are_one_input_error() -> None:
    for bad in ({"shared_k": -1}, {"shared_k": 3, "shared_w": 1.0}, {"shared_k": 3, "shared_w": 0.0},
                {"shared_k": 3, "shared_window": 0}, {"shared_k": 3, "subspace": 2},
                {"shared_k": 3, "probe_freq": 0.5}):
        with pytest.raises(InputError):
            HopSkipJumpConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        SharedSubspace(torch.zeros(2), k=0, window=1, per_class=False)


def test_the_projection_is_unit_inside_the_subspace_and_keeps_rows_without_one() -> None:
    gen = torch.Generator().manual_seed(1)
    s = SharedSubspace(torch.tensor([0, 0, 1]), k=1, window=1, per_class=True)
    s.add(torch.tensor([0, 1, 2]), torch.randn(3, *SHAPE, generator=gen))
    v = torch.randn(3, *SHAPE, generator=gen)
    out = s.project(torch.tensor([0, 1, 2]), v)
    assert out is not None
    basis = s.bases(torch.tensor([0]))[0]
    assert basis is not None
    assert torch.allclose(out[0].flatten().norm(), torch.tensor(1.0), atol=1e-5)
    assert torch.allclose(basis @ (basis.T @ out[0].flatten()), out[0].flatten(), atol=1e-5)
    assert torch.equal(out[2], v[2])  # label 1 has one image: no subspace, the row is kept
    assert SharedSubspace(torch.zeros(1), k=1, window=1, per_class=False).project(torch.tensor([0]), v[:1]) is None


def test_the_shared_prior_is_deterministic_changes_the_result_and_is_a_no_op_for_one_image() -> None:
    victim = TinyNet(seed=2).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(6))
    y = victim(x).argmax(1)
    plain = {k: v for k, v in SHARED.items() if not k.startswith("shared")}
    prior = SHARED | {"shared_prior": True}

    def run(x: torch.Tensor, y: torch.Tensor, **kw: object) -> torch.Tensor:
        r = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=400,
                        config=HopSkipJumpConfig(seed=3, **kw))  # type: ignore[arg-type]
        return r.x_adv

    a = run(x, y, **prior)
    assert torch.equal(a, run(x, y, **prior))
    assert not torch.equal(a, run(x, y, **plain)) and not torch.equal(a, run(x, y, **SHARED))
    assert torch.equal(run(x[:1], y[:1], **prior), run(x[:1], y[:1], **plain))
    for bad in ({"shared_prior": True}, prior | {"history": True}):
        with pytest.raises(InputError):
            HopSkipJumpConfig(**bad)  # type: ignore[arg-type]
