"""Rotation pretraining on the pool (RotNet) and cold-start selection (TypiClust, k-center) for surrogate extraction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stealkit.errors import InputError
from stealkit.extract.surrogate_data import pretrained_weights as weights
from stealkit.extract.surrogate_data.pretrain import PretrainConfig
from stealkit.extract.surrogate_data.pretrained_weights import from_pretrained, pretrained_weights
from stealkit.extract.surrogate_data.rotation_pretrain import rotations
from stealkit.extract.surrogate_data.simclr_pretrain import nt_xent
from stealkit.extract.surrogate_data.surrogate import PRESETS, SurrogateConfig, extract_surrogate
from stealkit.extract.surrogate_data.typiclust import cold_start, typicality, typiclust
from stealkit.kmeans import kmeans
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet
from tests.test_surrogate_active import CountingNet, _pool


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _blobs(per: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well-separated 2-d blobs; returns the points and each point's blob."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 10.0], [10.0, 0.0], [-10.0, -10.0]])
    x = torch.cat([c + 0.5 * torch.randn(per, 2, generator=gen) for c in centres])
    return x, torch.arange(3).repeat_interleave(per)


def _counted_run(config: SurrogateConfig, budget: int, checkpoint_dir: Path, resume: bool) -> tuple[object, CountingNet]:
    """One checkpointed attack on a fresh probability oracle; the victim counts what it is really asked."""
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode="probs", budget=budget)
    victim.seen = 0
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config,
                               checkpoint_dir=checkpoint_dir, resume=resume)
    return result, victim


def test_rotations_are_the_four_quarter_turns():
    x = torch.arange(2 * 9, dtype=torch.float32).reshape(2, 1, 3, 3)
    views, labels = rotations(x)
    assert views.shape == (8, 1, 3, 3) and labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert torch.equal(views[:2], x) and torch.equal(views[2:4], torch.rot90(x, 1, dims=(2, 3)))
    assert torch.equal(views[4:6], x.flip(2).flip(3))  # 180 degrees
    with pytest.raises(InputError, match="square"):
        rotations(torch.zeros(1, 1, 3, 4))


def test_kmeans_finds_separated_blobs_and_typiclust_takes_one_central_point_each():
    x, blob = _blobs()
    assign = kmeans(x, 3, torch.Generator().manual_seed(1))
    assert all(len(set(assign[blob == b].tolist())) == 1 for b in range(3))  # each blob one cluster
    assert len(set(assign.tolist())) == 3
    outlier = torch.cat([x, torch.tensor([[30.0, 30.0]])])
    t = typicality(outlier, k_nn=5)
    assert int(t.argmin()) == outlier.shape[0] - 1  # the outlier is the least typical point
    picked = typiclust(x, 3, torch.empty(0, dtype=torch.long), torch.Generator().manual_seed(1), k_nn=5)
    assert sorted(blob[picked].tolist()) == [0, 1, 2]  # diverse: one per blob
    for j in picked.tolist():  # typical: each is among the 4 points closest to its blob's mean
        members = (blob == blob[j]).nonzero().flatten()
        d = (x[members] - x[members].mean(0)).norm(dim=1)
        assert j in members[d.argsort()[:4]].tolist()
    again = typiclust(x, 3, picked[:1], torch.Generator().manual_seed(1), k_nn=5)  # one blob already covered
    assert picked[0] not in again.tolist() and again.numel() == 3


def test_cold_start_kinds_pick_distinct_indices():
    x, _ = _blobs()
    gen = torch.Generator().manual_seed(0)
    for kind in ("typiclust", "kcenter", "random"):
        idx = cold_start(kind, x, 5, gen)  # type: ignore[arg-type]
        assert idx.numel() == 5 and len(set(idx.tolist())) == 5
    with pytest.raises(InputError, match="cold start"):
        cold_start("bald", x, 2, gen)  # type: ignore[arg-type]


def test_pretraining_learns_rotations_without_queries_and_is_reused(tmp_path: Path, monkeypatch):
    pool = torch.rand(64, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    pool[:, :, 0, :] = 1.0  # a bar on top: the rotation is visible
    path = tmp_path / "pre.safetensors"
    cfg = PretrainConfig(epochs=1, batch_size=16, min_steps=60)
    state, rec = pretrained_weights(path, "rotation", lambda: TinyNet(seed=5), pool, cfg, seed=0, reuse=False)
    assert rec["epochs"] == 15 and rec["rotation_accuracy"] > 0.9  # min_steps: 60 steps of 4 per epoch
    assert path.exists() and path.with_suffix(".json").exists()

    def boom(*_a, **_k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(weights, "run_pretraining", boom)
    again, rec2 = pretrained_weights(path, "rotation", lambda: TinyNet(seed=5), pool, cfg, seed=0, reuse=True)
    assert rec2["reused"] and all(torch.equal(state[k], again[k]) for k in state)
    with pytest.raises(InputError, match="other settings or another pool"):
        pretrained_weights(path, "rotation", lambda: TinyNet(seed=5), pool, PretrainConfig(epochs=2), seed=0, reuse=True)
    with pytest.raises(InputError, match="other settings or another pool"):
        pretrained_weights(path, "rotation", lambda: TinyNet(seed=5), pool[:32], cfg, seed=0, reuse=True)
    with pytest.raises(InputError, match="other settings or another pool"):
        pretrained_weights(path, "simclr", lambda: TinyNet(seed=5), pool, cfg, seed=0, reuse=True)
    frozen = from_pretrained(lambda: TinyNet(seed=5), state, freeze=True)()
    trainable = [n for n, p in frozen.named_parameters() if p.requires_grad]
    assert trainable == ["net.3.weight", "net.3.bias"]  # only the logits layer learns on the answers


def test_nt_xent_rewards_matching_pairs_and_simclr_learns_them():
    z = torch.eye(6)
    matched = nt_xent(z, z.clone(), 0.5)
    shuffled = nt_xent(z, z[torch.tensor([1, 2, 3, 4, 5, 0])], 0.5)
    assert float(matched) < float(shuffled)
    from stealkit.extract.surrogate_data.simclr_pretrain import pretrain_simclr

    pool = torch.rand(64, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    rec = pretrain_simclr(TinyNet(seed=5), pool, PretrainConfig(epochs=20, batch_size=16, min_steps=0), seed=0)
    assert rec["epochs"] == 20 and rec["pair_accuracy"] > 1 / 31  # above chance among 2*16-1 candidates


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("select,start,method", [("random", "typiclust", "rotation"), ("random", "kcenter", "rotation"),
                                                 ("kcenter", "typiclust", "rotation"), ("random", "random", "rotation"),
                                                 ("random", "typiclust", "simclr")])
def test_pretrained_cold_start_spends_exactly_the_budget(mode, select, start, method):
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=30)
    victim.seen = 0
    config = SurrogateConfig(epochs=2, batch_size=8, select=select, cold_start=start, pretrain=method,
                             pretraining=PretrainConfig(epochs=1, min_steps=0), seed=2)
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 30 == result.extra["n_distinct"] == victim.seen
    assert result.extra["pretraining"]["epochs"] == 1 and result.extra["cold_start"] == start


def test_resume_reuses_the_pretrained_weights_and_answers(tmp_path: Path, monkeypatch):
    config = SurrogateConfig(epochs=1, batch_size=8, cold_start="typiclust", pretrain="rotation",
                             pretraining=PretrainConfig(epochs=1, min_steps=0), seed=2)

    def run(resume: bool) -> tuple[object, CountingNet]:
        return _counted_run(config, 20, tmp_path, resume)

    first, _ = run(False)
    assert (tmp_path / "pretrained.safetensors").exists() and (tmp_path / "active.json").exists()
    monkeypatch.setattr(weights, "run_pretraining", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("recomputed")))
    resumed, victim = run(True)
    assert victim.seen == 0 and resumed.queries == first.queries == {"predict": 20, "explain": 0}  # type: ignore[attr-defined]
    a, b = first.student.state_dict(), resumed.student.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_settings_and_presets():
    with pytest.raises(InputError, match="pretraining"):
        SurrogateConfig(pretrain="mae")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="cold start"):
        SurrogateConfig(cold_start="bald")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="knockoff"):
        SurrogateConfig(cold_start="typiclust", strategy="knockoff")
    with pytest.raises(InputError, match="pretraining epochs"):
        PretrainConfig(epochs=0)
    assert PRESETS["paper"] == {"select": "random", "ssl": "none", "pretrain": "none", "cold_start": "random"}
    assert PRESETS["plain"] == {**PRESETS["paper"], "label_smoothing": 0.1, "label_smoothing_min_per_class": 10}
    assert PRESETS["typiclust"] == {**PRESETS["paper"], "pretrain": "rotation", "cold_start": "typiclust"}
    assert PretrainConfig(epochs=5, batch_size=128, min_steps=300).epochs_for(8000) == 5
    assert PretrainConfig(epochs=5, batch_size=128, min_steps=300).epochs_for(359) == 100


@pytest.mark.slow
def test_cli_pretrains_in_the_run_directory_and_resume_reuses_it(tmp_path: Path, capsys):
    import json

    from stealkit.cli import main
    from tests.test_datafree import tiny_victim_dir

    out = tmp_path / "run"
    args = ["-q", "extract", "surrogate", "--victim", str(tiny_victim_dir(tmp_path)), "--budget", "30",
            "--mode", "label", "--student", "mlp2", "--student-arg", "hidden=8", "--epochs", "2",
            "--pretrain", "rotation", "--cold-start", "typiclust", "--set", "pretraining.epochs=1",
            "--set", "pretraining.min_steps=0", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queries"] == {"predict": 30, "explain": 0}
    saved = (out / "checkpoint" / "pretrained.safetensors").read_bytes()
    assert main([*args, "--resume"]) == 0  # nothing paid twice, the same weights
    assert json.loads((out / "summary.json").read_text())["queries"] == {"predict": 30, "explain": 0}
    assert (out / "checkpoint" / "pretrained.safetensors").read_bytes() == saved
    capsys.readouterr()
    assert main([*args[:-2], "--set", "pretraining.epochs=2", "--out", str(out), "--resume"]) != 0  # other settings
    assert "other settings or another pool" in capsys.readouterr().err


def test_checkpointed_random_queries_are_the_plain_paths_images(tmp_path: Path):
    config = SurrogateConfig(epochs=1, batch_size=8, pretrain="rotation",
                             pretraining=PretrainConfig(epochs=1, min_steps=0), seed=3)
    answered = []
    for ckpt in (None, tmp_path):
        oracle = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="probs", budget=20)
        log: list[torch.Tensor] = []
        query = oracle.query
        oracle.query = lambda x, _q=query, _log=log: (_log.append(x.clone()), _q(x))[1]  # type: ignore[method-assign]
        extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config, checkpoint_dir=ckpt)
        answered.append(torch.cat(log).flatten(1).sum(1).sort().values)
    assert torch.allclose(answered[0], answered[1])  # the CLI (checkpointed) asks what the benchmark row asks


def test_budget_aware_cold_start_chooses_only_the_first_queries_the_rest_are_the_plain_images():
    from stealkit.extract.surrogate_data.typiclust import budget_aware_start

    x, _ = _blobs(per=12)
    picked = budget_aware_start("typiclust", x, 10, 3, torch.Generator().manual_seed(0))
    assert picked.numel() == 10 == picked.unique().numel()
    assert torch.equal(picked[:3], cold_start("typiclust", x, 3, torch.Generator().manual_seed(0)))
    rest = torch.tensor([i for i in range(x.shape[0]) if i not in picked[:3].tolist()][:7])
    assert torch.equal(picked[3:], rest)  # the shuffled pool's first images not chosen, as the plain attack's
    assert torch.equal(budget_aware_start("typiclust", x, 3, 10, torch.Generator().manual_seed(0)), picked[:3])


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("select,size", [("random", None), ("random", 7), ("kcenter", 4), ("random", 1000)])
def test_budget_aware_cold_start_and_finetune_lr_spend_exactly_the_budget(mode, select, size):
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=30)
    victim.seen = 0
    config = SurrogateConfig(epochs=2, batch_size=8, select=select, cold_start="typiclust", pretrain="rotation",
                             cold_start_size=size, pretraining=PretrainConfig(epochs=1, min_steps=0, finetune_lr=0.02),
                             seed=2)
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 30 == result.extra["n_distinct"] == victim.seen
    assert result.extra["finetune_lr"] == 0.02
    assert result.extra["cold_start_size"] == (size or 10 * oracle.num_classes)  # none: 10 per class


def test_resume_with_a_budget_aware_cold_start_pays_nothing_twice_and_refuses_other_sizes(tmp_path: Path):
    from stealkit.extract.surrogate_data.active import ActiveConfig

    def run(resume: bool, size: int, lr: float | None = 0.05) -> tuple[object, CountingNet]:
        config = SurrogateConfig(epochs=1, batch_size=8, select="entropy", cold_start="typiclust",
                                 cold_start_size=size, pretrain="rotation", active=ActiveConfig(rounds=2),
                                 pretraining=PretrainConfig(epochs=1, min_steps=0, finetune_lr=lr), seed=2)
        return _counted_run(config, 25, tmp_path, resume)

    first, _ = run(False, 3)
    resumed, victim = run(True, 3)
    assert victim.seen == 0 and resumed.queries == first.queries == {"predict": 25, "explain": 0}  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="cold_start_size"):
        run(True, 4)
    with pytest.raises(InputError, match="'lr'"):
        run(True, 3, lr=None)


def test_budget_aware_settings_refuse_bad_values():
    with pytest.raises(InputError, match="cold_start_size must be a positive"):
        SurrogateConfig(cold_start="typiclust", cold_start_size=0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(InputError, match="finetune_lr must be a positive"):
            PretrainConfig(finetune_lr=bad)
    assert "finetune_lr" not in PretrainConfig(finetune_lr=0.03).identity("rotation")  # the weights are reused


def test_lp_ft_probe_epochs_keep_the_pretrained_body_while_probing(tmp_path: Path):
    from safetensors.torch import load_file

    def body_moved(probe: int) -> bool:
        oracle = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="probs", budget=20)
        config = SurrogateConfig(epochs=2, batch_size=8, pretrain="rotation", seed=2,
                                 pretraining=PretrainConfig(epochs=1, min_steps=0, probe_epochs=probe))
        result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config,
                                   pretrain_cache=tmp_path / "w.safetensors")
        state = load_file(str(tmp_path / "w.safetensors"))
        body = result.student.net[1].weight  # the first linear layer; the last one is the probe's
        return not torch.equal(body, state["net.1.weight"])

    assert not body_moved(2)  # every epoch a linear probe: the features stay the pretrained ones
    assert body_moved(1)  # LP then FT: the second epoch fine-tunes everything
    assert body_moved(0)


def test_warm_max_per_class_starts_large_budgets_fresh_and_skips_unneeded_pretraining(monkeypatch):
    victim = CountingNet().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode="label", budget=30)
    victim.seen = 0
    config = SurrogateConfig(epochs=1, batch_size=8, cold_start="typiclust", pretrain="rotation", cold_start_size=5,
                             pretraining=PretrainConfig(epochs=1, min_steps=0, warm_max_per_class=2,
                                                        finetune_lr=0.01, probe_epochs=1), seed=2)
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=config)
    assert result.queries["predict"] == 30 == victim.seen  # 30 > 2 per class x 3 classes: fresh students
    assert result.extra["warm_start"] is False and result.extra["finetune_lr"] == config.peak_lr == 0.1
    assert "pretraining" in result.extra  # still computed: the cold start's features
    monkeypatch.setattr(weights, "run_pretraining", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("pretrained for nothing")))
    plain_start = SurrogateConfig(epochs=1, batch_size=8, pretrain="rotation", seed=2,
                                  pretraining=PretrainConfig(warm_max_per_class=2))
    oracle = LocalOracle(CountingNet().eval(), (1, 4, 4), mode="label", budget=30)
    result = extract_surrogate(oracle, _pool(), make_student=lambda: TinyNet(seed=5), config=plain_start)
    assert result.extra["warm_start"] is False and result.queries["predict"] == 30


@pytest.mark.parametrize("setting,message", [("pretraining.finetune_lr=0", "finetune_lr must be a positive"),
                                             ("cold_start_size=0", "cold_start_size must be a positive"),
                                             ("pretraining.probe_epochs=-1", "probe_epochs must be >= 0"),
                                             ("pretraining.warm_max_per_class=x", "warm_max_per_class")])
def test_cli_bad_budget_aware_values_give_one_error_line(tmp_path: Path, capsys, setting, message):
    from stealkit.cli import main

    out = tmp_path / "run"
    code = main(["-q", "extract", "surrogate", "--victim", str(tmp_path / "none"), "--budget", "30",
                 "--preset", "typiclust", "--set", setting, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing half-written
