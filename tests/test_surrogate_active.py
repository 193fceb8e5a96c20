"""Active selection (ActiveThief, k-center greedy) and FixMatch on the unqueried pool for surrogate extraction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import (
    ActiveConfig,
    kcenter_greedy,
    probs_and_features,
    score_subset,
    select_batch,
)
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig, strong_view, weak_view
from stealkit.extract.surrogate_data.surrogate import (
    PRESETS,
    SurrogateConfig,
    epoch_indices,
    extract_surrogate,
)
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class CountingNet(nn.Module):
    """A victim that counts the images it is really asked about (behind the ledger)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.seen = TinyNet(seed=3), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += int(x.shape[0])
        return self.net(x)


def _pool(n: int = 80) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(0))


def test_schedule_spends_exactly_the_budget():
    for n in (1, 7, 50, 301):
        sizes = ActiveConfig(initial=0.2, rounds=4).schedule(n)
        assert sum(sizes) == n and all(s > 0 for s in sizes)
    assert ActiveConfig(initial=0.2, rounds=4).schedule(100) == [20, 20, 20, 20, 20]


def test_kcenter_greedy_takes_the_farthest_points():
    feats = torch.tensor([[0.0], [1.0], [2.0], [10.0], [9.5], [5.0]])
    centres = torch.tensor([[0.0]])
    picked = kcenter_greedy(feats, centres, 3).tolist()
    assert picked[0] == 3  # 10 is farthest from 0
    assert picked[1] == 5  # then 5 (distance 5 from both 0 and 10)
    assert picked[2] in (1, 2, 4) and len(set(picked)) == 3
    assert sorted(kcenter_greedy(feats, torch.empty(0, 1), 6).tolist()) == list(range(6))  # no centre, no repeat


def test_uncertainty_selection_picks_the_least_certain():
    probs = torch.tensor([[0.98, 0.01, 0.01], [0.34, 0.33, 0.33], [0.5, 0.49, 0.01], [0.9, 0.05, 0.05]])
    cands = torch.arange(4)
    gen = torch.Generator().manual_seed(0)
    args = (probs, torch.zeros(4, 2), torch.empty(0, dtype=torch.long))
    assert select_batch("entropy", 1, cands, *args, gen=gen).tolist() == [1]
    assert select_batch("margin", 1, cands, *args, gen=gen).tolist() == [1]
    assert sorted(select_batch("margin", 2, cands, *args, gen=gen).tolist()) == [1, 2]
    with pytest.raises(InputError, match="unknown selection"):
        select_batch("mix", 1, cands, *args, gen=gen)  # type: ignore[arg-type]  # removed: no gain


def test_features_are_the_logit_layer_inputs():
    model = TinyNet(seed=1).eval()
    x = _pool(10)
    probs, feats = probs_and_features(model, x, batch=3)
    assert probs.shape == (10, 3) and feats.shape == (10, 8)
    assert torch.allclose(torch.softmax(model.net[3](feats), dim=1), probs, atol=1e-6)
    assert torch.allclose(feats, model.net[:3](x), atol=1e-6)


def test_views_keep_shape_range_and_flip_only_when_allowed():
    x = torch.zeros(64, 1, 8, 8)
    x[:, :, :, :2] = 1.0  # a bar on the left edge
    gen = torch.Generator().manual_seed(0)
    cfg = FixMatchConfig(shift=1, flip=False)
    w = weak_view(x, cfg, gen)
    assert w.shape == x.shape and float(w[:, :, :, 5:].sum()) == 0.0  # no flip: the bar stays on the left
    s = strong_view(x, cfg, gen)
    assert s.shape == x.shape and float(s.min()) >= 0.0 and float(s.max()) <= 1.0
    flipped = weak_view(x, FixMatchConfig(shift=1, flip=True), gen)
    assert float(flipped[:, :, :, 5:].sum()) > 0  # some images mirrored
    with pytest.raises(InputError):
        FixMatchConfig(threshold=1.5)


def test_pool_epoch_cycles_the_labelled_images():
    idx = torch.arange(10)
    out = epoch_indices(idx, 90, FixMatchConfig(mu=3))
    assert out.numel() == 30 and set(out.tolist()) == set(range(10))
    assert torch.equal(epoch_indices(idx, 90, FixMatchConfig(epoch="labelled")), idx)


def test_bad_combinations_are_refused():
    with pytest.raises(InputError, match="unknown selection"):
        SurrogateConfig(select="bald")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="replaces the knockoff policy"):
        SurrogateConfig(select="kcenter", strategy="knockoff")
    with pytest.raises(InputError, match="semi-supervised"):
        SurrogateConfig(ssl="mixmatch")  # type: ignore[arg-type]
    assert {PRESETS["paper"][k] for k in ("select", "ssl")} == {"random", "none"}


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("select,ssl", [("entropy", "none"), ("margin", "fixmatch"), ("kcenter", "none"),
                                        ("kcenter", "fixmatch"), ("random", "fixmatch")])
def test_active_and_ssl_spend_exactly_the_budget(mode, select, ssl):
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=30)
    victim.seen = 0  # the oracle may probe the model once when built
    config = SurrogateConfig(epochs=2, batch_size=8, select=select, ssl=ssl,  # type: ignore[arg-type]
                             active=ActiveConfig(rounds=3, round_epochs=1), seed=2)
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 30 == result.extra["n_distinct"] == victim.seen
    if select != "random":
        rounds = result.extra["active"]["rounds"]
        assert [r["selected"] for r in rounds] == ActiveConfig(rounds=3).schedule(30)
        assert rounds[-1]["answered"] == 30


def test_resume_after_an_interruption_pays_for_nothing_twice(tmp_path: Path):
    pool = _pool()
    config = SurrogateConfig(epochs=2, batch_size=8, select="kcenter", active=ActiveConfig(rounds=3, round_epochs=1),
                             seed=4)

    def run(ckpt: Path, *, resume: bool, stop_at: int | None = None) -> tuple[object, CountingNet, LocalOracle]:
        victim = CountingNet().eval()
        oracle = LocalOracle(victim, (1, 4, 4), mode="probs", budget=40)
        victim.seen = 0
        calls = {"n": 0}

        def make() -> nn.Module:
            calls["n"] += 1
            if stop_at is not None and calls["n"] > stop_at:
                raise KeyboardInterrupt  # killed while training a round's substitute
            return TinyNet(seed=5)

        result = extract_surrogate(oracle, pool, make_student=make, config=config, checkpoint_dir=ckpt,
                                   resume=resume)
        return result, victim, oracle

    whole, _, _ = run(tmp_path / "a", resume=False)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", resume=False, stop_at=2)  # rounds 0 and 1 done, killed in round 2
    resumed, victim, oracle = run(tmp_path / "b", resume=True)
    assert resumed.queries == whole.queries == {"predict": 40, "explain": 0}  # type: ignore[attr-defined]
    assert victim.seen < 40  # the resumed process re-used the saved answers
    assert oracle.ledger.total == 40
    picked = [r["selected"] for r in resumed.extra["active"]["rounds"]]  # type: ignore[attr-defined]
    assert picked == [r["selected"] for r in whole.extra["active"]["rounds"]]  # type: ignore[attr-defined]
    a = {k: v for k, v in whole.student.state_dict().items()}  # type: ignore[attr-defined]
    b = resumed.student.state_dict()  # type: ignore[attr-defined]
    assert all(torch.allclose(a[k], b[k]) for k in a)  # same student as an uninterrupted run


def test_resume_with_other_settings_is_refused(tmp_path: Path):
    pool = _pool()
    oracle = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="probs", budget=20)
    cfg = SurrogateConfig(epochs=1, batch_size=8, select="entropy", active=ActiveConfig(rounds=2, round_epochs=1))
    extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=cfg, checkpoint_dir=tmp_path)
    oracle2 = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="probs", budget=20)
    with pytest.raises(InputError, match="resume with the same settings"):
        extract_surrogate(oracle2, pool, make_student=lambda: TinyNet(seed=5), checkpoint_dir=tmp_path,
                          config=SurrogateConfig(epochs=1, batch_size=8, select="margin",
                                                 active=ActiveConfig(rounds=2, round_epochs=1)), resume=True)


def test_cli_presets_and_resume_errors(tmp_path: Path):
    from stealkit.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["extract", "surrogate", "--help"])
    assert res.exit_code == 0 and "--select" in res.output and "--preset" in res.output
    out = tmp_path / "r"
    (tmp_path / "nope").mkdir(exist_ok=True)  # exists, not a model: the options are checked first
    base = ["extract", "surrogate", "--victim", str(tmp_path / "nope"), "--budget", "10", "--out", str(out)]
    res = runner.invoke(cli, [*base, "--preset", "paper", "--resume"])
    assert res.exit_code != 0 and "nothing to resume" in str(res.exception)
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "active.json").write_text("{}")
    res = runner.invoke(cli, base)
    assert res.exit_code != 0 and "pass --resume" in str(res.exception)


def test_candidate_subset_scores_only_its_rows_and_spends_the_budget():
    model = TinyNet(seed=1)
    x = torch.rand(10, 1, 4, 4)
    rows = torch.tensor([1, 4, 7])
    probs, feats = score_subset(model, x, rows)
    full_p, full_f = probs_and_features(model, x)
    assert torch.allclose(probs[rows], full_p[rows]) and torch.allclose(feats[rows], full_f[rows])
    assert probs[0].abs().sum() == 0 and feats[0].abs().sum() == 0
    with pytest.raises(InputError, match="candidates"):
        ActiveConfig(candidates=-1)
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode="probs", budget=30)
    victim.seen = 0
    config = SurrogateConfig(epochs=1, batch_size=8, select="kcenter", seed=2,
                             active=ActiveConfig(rounds=3, round_epochs=1, candidates=12))
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 30 == result.extra["n_distinct"] == victim.seen
    assert [r["selected"] for r in result.extra["active"]["rounds"]] == ActiveConfig(rounds=3).schedule(30)


def _default_config(budget: int, classes: int, mode: str, **changes: object) -> SurrogateConfig:
    """The command's default for ``budget`` answers, applied as the CLI applies it (group keys included)."""
    from stealkit.extract.surrogate_data.surrogate import resolve_config

    return resolve_config("auto", budget, classes, mode=mode, settings=changes, epochs=1, batch_size=8, seed=2)[1]


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.slow
def test_the_default_from_a_hundred_per_class_selects_by_margin_within_the_budget(mode):
    """Tenth pass: 300 answers of 3 classes (100 per class) from a 600-image pool: half at random, then four rounds
    of margin selection; the ledger, the distinct answers and what the victim saw are exactly the budget."""
    config = _default_config(300, 3, mode, **{"active.round_epochs": 1})
    assert config.select == "margin" and config.active.initial == 0.5 and config.active.rounds == 4
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=300)
    victim.seen = 0
    result = extract_surrogate(oracle, _pool(600), make_student=lambda: TinyNet(seed=5), config=config)
    rounds = result.extra["active"]["rounds"]
    assert [r["selected"] for r in rounds] == [150, 38, 38, 37, 37] == ActiveConfig(initial=0.5).schedule(300)
    assert rounds[-1]["answered"] == 300 == result.queries["predict"] == result.extra["n_distinct"] == victim.seen
    assert "select_skipped" not in result.extra


def test_a_budget_that_answers_the_whole_pool_skips_the_rounds(tmp_path: Path):
    """Nothing to choose when the budget covers the pool: the same queries and student as random selection, bitwise,
    no round trained; --resume of such a run is refused (there is no checkpoint to continue)."""
    pool = _pool(40)

    def run(select: str, **kw: object) -> object:
        oracle = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="probs", budget=50)
        config = SurrogateConfig(epochs=2, batch_size=8, select=select, seed=3)  # type: ignore[arg-type]
        return extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config, **kw)

    margin, plain = run("margin", checkpoint_dir=tmp_path / "c"), run("random")
    assert margin.extra["select_skipped"] == "the budget answers the whole pool"  # type: ignore[attr-defined]
    assert "active" not in margin.extra and margin.queries == plain.queries == {"predict": 40, "explain": 0}  # type: ignore[attr-defined]
    a, b = margin.student.state_dict(), plain.student.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "c").exists()
    with pytest.raises(InputError, match="nothing to resume"):
        run("margin", checkpoint_dir=tmp_path / "c", resume=True)


def test_pool_holdout_is_the_benchmarks_validation_split():
    """The last fifth of one fixed shuffle, with its labels: disjoint from the four fifths, the same cut the
    benchmarks' ``--validate`` made inline before (so their validation figures are unchanged)."""
    from stealkit.extract.common import pool_holdout

    class Split:
        def __init__(self, n: int) -> None:
            self.x, self.y = torch.arange(n * 2.0).view(n, 2), torch.arange(n)

        def __len__(self) -> int:
            return len(self.y)

    for n in (8, 10, 37):
        split = Split(n)
        x, y, x_val, y_val = pool_holdout(split)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(1234))
        cut = n * 4 // 5
        assert torch.equal(y, order[:cut]) and torch.equal(y_val, order[cut:])
        assert torch.equal(x, split.x[order[:cut]]) and torch.equal(x_val, split.x[order[cut:]])
        assert len(y_val) == n - n * 4 // 5 and not set(y.tolist()) & set(y_val.tolist())
