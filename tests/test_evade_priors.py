"""Substitute priors and subspace sampling of the decision-based attacks (stealkit.evade.decision_based.priors / subspace)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from stealkit.evade.decision_based.boundary import BoundaryConfig, boundary_attack
from stealkit.evade.decision_based.decision import LabelAccess
from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump
from stealkit.evade.decision_based.priors import (
    SubstitutePrior,
    prior_estimate,
    prior_probes,
    tilt,
    transfer_starts,
    unit,
)
from stealkit.evade.decision_based.subspace import random_directions, subspace_dim
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.flatten() @ b.flatten()) / (a.norm() * b.norm()))


def _boundary_case(d: int, alpha: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A true normal ``n`` and a prior ``v`` with cos(v, n) = alpha, in d dimensions (shape [1, d])."""
    gen = torch.Generator().manual_seed(seed)
    n = unit(torch.randn(1, d, generator=gen))
    w = torch.randn(1, d, generator=gen)
    w = unit(w - float((w * n).sum()) * n)
    return n, alpha * n + math.sqrt(1 - alpha**2) * w


@pytest.mark.parametrize("offset", [0.0, 0.3])
def test_prior_estimate_recovers_agreement_and_beats_the_prior(offset: float) -> None:
    d, alpha = 200, 0.5
    n, v = _boundary_case(d, alpha, seed=0)
    gen = torch.Generator().manual_seed(1)
    c = tilt(alpha, d)
    u = prior_probes(v, torch.randn(600, d, generator=gen), c)
    # a flat boundary; the centre lies `offset` probe-noise widths on the adversarial side
    phi = torch.where((u @ n.T).squeeze(1) + offset / math.sqrt(d) > 0, 1.0, -1.0)
    est = prior_estimate(phi, u, v, d)
    assert abs(est.alpha - alpha) < 0.15
    assert _cos(est.normal, n) > alpha + 0.1
    assert abs(float(est.normal.norm()) - 1) < 1e-5


def test_prior_estimate_flips_an_anti_aligned_prior() -> None:
    d = 100
    n, v = _boundary_case(d, -0.6, seed=3)
    u = prior_probes(v, torch.randn(400, d, generator=torch.Generator().manual_seed(4)), tilt(0.3, d))
    est = prior_estimate(torch.where((u @ n.T).squeeze(1) > 0, 1.0, -1.0), u, v, d)
    assert est.alpha < -0.3
    assert _cos(est.normal, n) > 0.5


def test_prior_probes_are_unit_antithetic_pairs() -> None:
    v = unit(torch.randn(1, 50))
    u = prior_probes(v, torch.randn(10, 50), 0.2)
    assert u.shape == (10, 50)
    assert torch.allclose(u.norm(dim=1), torch.ones(10), atol=1e-5)
    assert torch.allclose((u[:5] @ v.T).squeeze(), torch.full((5,), 0.2), atol=1e-5)
    assert torch.allclose(u[:5] + u[5:], 2 * (u[:5] - 0.2 * v), atol=1e-5)


def test_low_frequency_directions_live_in_the_subspace() -> None:
    gen = torch.Generator().manual_seed(0)
    r = random_directions(64, (1, 28, 28), 7, gen, "cpu")
    assert r.shape == (64, 1, 28, 28)
    assert subspace_dim((1, 28, 28), 7) == 49
    assert torch.linalg.matrix_rank(r.flatten(1)) == 49
    assert random_directions(3, (1, 28, 28), 0, gen, "cpu").shape == (3, 1, 28, 28)
    assert subspace_dim((1, 28, 28), 0) == 784


def test_transfer_starts_are_verified_and_charged() -> None:
    model = TinyNet().eval()
    x = torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(2))
    y = model(x).argmax(1)
    oracle = LocalOracle(model, SHAPE, mode="label")
    access = LabelAccess(oracle, y, None, max_queries=50)
    starts, found = transfer_starts(access, SubstitutePrior(model), x, y, None, trials=10,
                                    gen=torch.Generator().manual_seed(0))
    assert bool(found.all())
    assert bool((model(starts).argmax(1) != y).all())
    assert int(access.used.sum()) == oracle.ledger.total
    assert int(access.used.max()) <= 50


@pytest.mark.parametrize("attack", ["hopskipjump", "boundary"])
@pytest.mark.parametrize("max_queries", [7, 60, 333])
def test_substitute_runs_honour_the_per_image_cap_and_the_ledger(attack: str, max_queries: int) -> None:
    victim, sub = TinyNet(seed=0).eval(), TinyNet(seed=1).eval()
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = victim(x).argmax(1)
    oracle = LocalOracle(victim, SHAPE, mode="label", budget=1200)
    if attack == "hopskipjump":
        r = hopskipjump(oracle, x, y, max_queries=max_queries, substitute=sub,
                        config=HopSkipJumpConfig(iterations=50, init_evals=20))
    else:
        r = boundary_attack(oracle, x, y, max_queries=max_queries, substitute=sub, config=BoundaryConfig(steps=500))
    per = r.extra["queries_per_example"]
    assert int(per.max()) <= max_queries
    assert int(per.sum()) == oracle.ledger.total <= 1200
    assert r.queries == oracle.ledger.as_dict()
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())


def test_a_perfect_substitute_helps_hopskipjump() -> None:
    """With the victim itself as substitute the prior is exact: at the same budget the distance is smaller."""
    victim = TinyNet(seed=2).eval()
    x = torch.rand(12, *SHAPE, generator=torch.Generator().manual_seed(5))
    y = victim(x).argmax(1)
    cfg = HopSkipJumpConfig(iterations=100, init_evals=10)
    plain = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=150, config=cfg)
    prior = hopskipjump(LocalOracle(victim, SHAPE, mode="label"), x, y, max_queries=150, config=cfg,
                        substitute=victim)
    both = plain.success & prior.success
    assert int(both.sum()) >= 8
    assert float(prior.norms[both].median()) < float(plain.norms[both].median())


def _save_mlp(path: Path, constant: int | None, seed: int = 0) -> Path:
    from stealkit.data import load_splits
    from stealkit.models import ModelSpec, build_model, save_model
    from stealkit.train import TrainConfig, fit

    torch.manual_seed(seed)
    model = build_model("mlp2", input_shape=(1, 8, 8), num_classes=10, hidden=16)
    if constant is None:
        splits = load_splits("digits")
        fit(model, splits.victim_train.x, splits.victim_train.y, TrainConfig(epochs=15, batch_size=32), desc="v")
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
            last.bias[constant] = 5.0
    spec = ModelSpec(arch="mlp2", input_shape=(1, 8, 8), num_classes=10, kwargs={"hidden": 16},
                     extra={"dataset": "digits", "split_seed": 0})
    return save_model(model.eval(), spec, path)


def test_cli_says_so_in_one_line_when_no_image_is_classified_correctly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stealkit.cli import main
    from stealkit.data import load_splits

    test_y = load_splits("digits").test.y
    sample = test_y[torch.randperm(len(test_y), generator=torch.Generator().manual_seed(0))[:3]]
    absent = next(c for c in range(10) if c not in sample.tolist())
    victim = _save_mlp(tmp_path / "weak", constant=absent)
    out = tmp_path / "hsj"
    rc = main(["attack", "hopskipjump", "--victim", str(victim), "--n", "3", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "none of the 3 sampled test images" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_cli_substitute_accepts_an_extraction_run_directory(tmp_path: Path) -> None:
    from stealkit.cli import main

    victim = _save_mlp(tmp_path / "victim", constant=None)
    shutil.copytree(_save_mlp(tmp_path / "sub", constant=None, seed=1), tmp_path / "run" / "student")
    out = tmp_path / "hsj"
    rc = main(["-q", "attack", "hopskipjump", "--victim", str(victim), "--n", "8", "--max-queries", "120",
               "--substitute", str(tmp_path / "run"), "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attempts"] >= 1 and summary["victim_queries"]["predict"] <= 8 + 8 * 120
    assert main(["attack", "hopskipjump", "--victim", str(victim), "--n", "4", "--substitute", str(tmp_path),
                 "--out", str(tmp_path / "bad")]) == 2
