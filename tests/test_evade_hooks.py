"""HopSkipJump's two hooks, ``starts=`` (a sequence of StartFinder) and ``probes=`` (a ProbeSampler): the default
composition gives the figures of the code before the hooks (9158eae), plug-ins are called as documented, their
queries go through the ledger and the per-image cap, and a sampler of the wrong shape is one clear error."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.decision import LabelAccess
from stealkit.evade.decision_based.hopskipjump import (
    HopSkipJumpConfig,
    default_starts,
    hopskipjump,
    tuned_settings,
)
from stealkit.evade.decision_based.image_starts import PoolStarts
from stealkit.evade.decision_based.probes import ProbeRound, RandomProbes
from stealkit.evade.decision_based.starts import NoiseStarts
from stealkit.evade.decision_based.subspace import dct_directions
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet, labelled_tiny_batch

SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _one_thread(_quiet: None) -> None:
    torch.set_num_threads(1)


def _pool() -> torch.Tensor:
    return torch.rand(60, *SHAPE, generator=torch.Generator().manual_seed(9))


#: (settings, extra arguments) -> (rounded norms, per-image queries) measured at 9158eae, before the hooks
CASES = {
    "tuned": (tuned_settings(substitute=False, budgeted=True), {},
              [0.198449, 0.054739, 0.279789, 0.340852, 0.252759], [294] * 5),
    "opening+pool": (tuned_settings(substitute=False, budgeted=True)
                     | {"opening": 0.1, "opening_freq": 1.0, "pool_tries": 30, "pool_spread": 10}, {"pool": True},
                     [0.195689, 0.054768, 0.281468, 0.339485, 0.253974], [294] * 5),
    "substitute": (tuned_settings(substitute=True, shape=SHAPE) | {"subspace": 2}, {"substitute": True},
                   [0.313676, 0.107079, 0.444104, 0.511347, 0.402936], [298, 300, 298, 298, 298]),
}


def _run(name: str, **hooks: object) -> tuple[object, LocalOracle]:
    settings, extra, _, _ = CASES[name]
    victim, x, y = labelled_tiny_batch(seed=3)
    oracle = LocalOracle(victim, SHAPE, mode="label")
    kw: dict[str, object] = {}
    if extra.get("pool"):
        kw["start_pool"] = _pool()
    if extra.get("substitute"):
        kw["substitute"] = TinyNet(seed=1).eval()
    r = hopskipjump(oracle, x, y, max_queries=300, config=HopSkipJumpConfig(seed=1, **settings),  # type: ignore[arg-type]
                    **kw, **hooks)  # type: ignore[arg-type]
    return r, oracle


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_default_composition_gives_the_figures_from_before_the_hooks(name: str) -> None:
    r, oracle = _run(name)
    _, _, norms, per = CASES[name]
    assert [round(float(v), 6) for v in r.norms] == pytest.approx(norms, abs=2e-6)  # type: ignore[attr-defined]
    assert r.extra["queries_per_example"].tolist() == per  # type: ignore[attr-defined]
    assert oracle.ledger.total == sum(per)


@pytest.mark.parametrize("name", sorted(CASES))
def test_spelling_out_the_default_hooks_is_bitwise_the_default(name: str) -> None:
    settings, extra, _, _ = CASES[name]
    cfg = HopSkipJumpConfig(seed=1, **settings)  # type: ignore[arg-type]
    default, _ = _run(name)
    spelled, _ = _run(name, starts=default_starts(cfg, _pool() if extra.get("pool") else None),
                      probes=RandomProbes(cfg.subspace, cfg.orthogonal))
    assert torch.equal(default.x_adv, spelled.x_adv)  # type: ignore[attr-defined]


class RecordingProbes:
    """A probe sampler that records each round it is asked about and hands out the built-in directions."""

    def __init__(self, inner: RandomProbes) -> None:
        self.inner, self.calls = inner, []  # type: ignore[var-annotated]

    def __call__(self, rnd: ProbeRound) -> list[torch.Tensor]:
        self.calls.append((rnd.t, rnd.idx.tolist(), list(rnd.counts), rnd.points.shape, rnd.previous.clone()))
        return self.inner(rnd)


@pytest.mark.parametrize("name", ["tuned", "substitute"])
def test_a_recording_probe_sampler_sees_every_round_and_changes_nothing(name: str) -> None:
    settings, _, _, _ = CASES[name]
    cfg = HopSkipJumpConfig(seed=1, **settings)  # type: ignore[arg-type]
    rec = RecordingProbes(RandomProbes(cfg.subspace, cfg.orthogonal))
    r, oracle = _run(name, probes=rec)
    default, _ = _run(name)
    assert torch.equal(r.x_adv, default.x_adv)  # type: ignore[attr-defined]
    assert rec.calls and [c[0] for c in rec.calls] == list(range(1, len(rec.calls) + 1))
    for t, idx, counts, shape, previous in rec.calls:
        assert len(idx) == len(counts) == shape[0] and tuple(shape[1:]) == SHAPE and min(counts) >= 2
        # the previous estimate is zero in the first round, a unit vector per example after
        norms = previous.flatten(1).norm(dim=1)
        assert bool((norms == 0).all()) if t == 1 else torch.allclose(norms, torch.ones_like(norms), atol=1e-4)
    rounds = r.extra["rounds"]  # type: ignore[attr-defined]
    assert int(rounds.sum()) == sum(len(c[1]) for c in rec.calls)


def test_a_plugged_low_frequency_sampler_changes_the_result_within_the_caps() -> None:
    def low(rnd: ProbeRound) -> list[torch.Tensor]:  # CGBA's DCT probes, once a config field
        return [dct_directions(n, tuple(rnd.points.shape[1:]), 0.5, rnd.gen, rnd.points.device) for n in rnd.counts]

    r, oracle = _run("tuned", probes=low)
    default, _ = _run("tuned")
    per = r.extra["queries_per_example"]  # type: ignore[attr-defined]
    assert int(per.max()) <= 300 and int(per.sum()) == oracle.ledger.total == r.queries["predict"]  # type: ignore[attr-defined]
    assert not torch.equal(r.x_adv, default.x_adv)  # type: ignore[attr-defined]
    victim, _, y = labelled_tiny_batch(seed=3)
    assert bool((victim(r.x_adv[r.success]).argmax(1) != y[r.success]).all())  # type: ignore[attr-defined]


def test_a_probe_sampler_of_the_wrong_shape_is_one_clear_error() -> None:
    def bad(rnd: ProbeRound) -> list[torch.Tensor]:
        return [torch.randn(n, 16) for n in rnd.counts]

    with pytest.raises(InputError, match="probe sampler"):
        _run("tuned", probes=bad)


class RecordingStart:
    """A start finder that records its calls and, with ``inner``, hands over to it."""

    def __init__(self, inner: object | None = None) -> None:
        self.inner, self.calls = inner, []  # type: ignore[var-annotated]

    def __call__(self, access: LabelAccess, x: torch.Tensor, best: torch.Tensor, idx: torch.Tensor, *,
                 tol: float, gen: torch.Generator) -> torch.Tensor:
        self.calls.append((idx.tolist(), tol, int(access.used.sum())))
        return best if self.inner is None else self.inner(access, x, best, idx, tol=tol, gen=gen)  # type: ignore[operator]


def test_starts_replace_the_configured_start_phase_in_order() -> None:
    settings, _, _, _ = CASES["tuned"]
    first, second = RecordingStart(NoiseStarts(settings["start_tries"])), RecordingStart()  # type: ignore[arg-type]
    r, _ = _run("tuned", starts=[first, second])
    default, _ = _run("tuned")
    assert torch.equal(r.x_adv, default.x_adv)  # type: ignore[attr-defined]
    assert len(first.calls) == len(second.calls) == 1
    assert first.calls[0][0] == list(range(5)) and second.calls[0][2] > first.calls[0][2]  # second after first
    # no finder at all: the config's start_tries are not run
    none, oracle = _run("tuned", starts=[])
    assert not torch.equal(none.x_adv, default.x_adv)  # type: ignore[attr-defined]
    assert int(none.extra["queries_per_example"].max()) <= 300  # type: ignore[attr-defined]


def test_starts_reach_hopskipjump_after_the_triangle_opening_and_spend_within_the_caps() -> None:
    rec = RecordingStart(PoolStarts(_pool(), 40, 0))
    r, oracle = _run("opening+pool", starts=[rec])
    assert len(rec.calls) == 1 and rec.calls[0][2] > 0  # after the opening had spent its share
    per = r.extra["queries_per_example"]  # type: ignore[attr-defined]
    assert int(per.max()) <= 300 and int(per.sum()) == oracle.ledger.total == r.queries["predict"]  # type: ignore[attr-defined]
    starts = r.extra["start_norms"]  # type: ignore[attr-defined]
    assert bool((r.norms <= starts + 1e-6).all())  # type: ignore[attr-defined]
