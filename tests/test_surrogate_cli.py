"""The ``stealkit extract surrogate`` and ``stealkit study`` commands, end to end on a tiny digits victim."""

from __future__ import annotations

import json

import pytest
import torch

from stealkit.cli import main


@pytest.fixture(scope="module")
def victim_dir(tmp_path_factory):
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("victim")
    train_victim("digits", "mlp2", TrainConfig(epochs=10, batch_size=64, lr=0.01, seed=0), out=out,
                 arch_kwargs={"hidden": 32})
    return out


def _run(victim_dir, out, mode: str, budget: int, *extra: str, epochs: int = 1) -> tuple[dict, dict]:
    """``stealkit extract surrogate`` on the digits victim with a tiny student; its config.json and summary.json."""
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", str(budget), "--epochs",
               str(epochs), "--mode", mode, "--student", "mlp2", "--student-arg", "hidden=8", "--out", str(out),
               *extra])
    assert rc == 0
    return (json.loads((out / "config.json").read_text())["config"], json.loads((out / "summary.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--strategy", "knockoff", "--pool", "fashion-mnist"],
                                   ["--mode", "label", "--pool", "gaussian"], ["--ssl", "fixmatch", "--mode", "label"]])
def test_extract_surrogate_cli(victim_dir, tmp_path, extra):
    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "120", "--epochs", "3",
               "--student", "mlp2", "--student-arg", "hidden=16", "--out", str(out), *extra])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queries"]["predict"] == 120 == summary["n_distinct"]
    assert (out / "student" / "model.json").exists() and "Setting" in (out / "report.html").read_text()


def test_bad_loss_for_labels_is_one_clear_line(victim_dir, tmp_path, capsys):
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "10", "--mode", "label",
               "--loss", "kl", "--out", str(tmp_path / "r")])
    assert rc == 2 and "--loss ce" in capsys.readouterr().err


def test_study_group_lists_the_dfme_studies():
    from click.testing import CliRunner

    from stealkit.cli import cli

    res = CliRunner().invoke(cli, ["study", "--help"])
    assert res.exit_code == 0
    for name in ("dfme-table4", "dfme-logits", "dfme-hypothesis1"):
        assert name in res.output


@pytest.mark.parametrize("budget,extra,smoothing", [(100, [], 0.1), (99, [], 0.1),
                                                    (100, ["--preset", "paper"], 0.0),
                                                    (100, ["--set", "label_smoothing=0"], 0.0),
                                                    (100, ["--strategy", "knockoff", "--pool", "pool"], 0.0)])
def test_default_preset_smooths_labels_and_paper_does_not(victim_dir, tmp_path, budget, extra, smoothing):
    """The default smooths label answers (below 10 queries per class, digits 99, inside FixMatch; from 10 per class
    too); ``paper``, ``label_smoothing=0`` and knockoff train unsmoothed."""
    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", str(budget), "--epochs", "1",
               "--mode", "label", "--student", "mlp2", "--student-arg", "hidden=8", "--out", str(out), *extra])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label_smoothing"] == smoothing
    assert summary["queries"]["predict"] == budget == summary["n_distinct"]


@pytest.mark.parametrize("mode,budget,resolved", [
    ("label", 50, "semi+label_smoothing=0.1"), ("label", 99, "semi+label_smoothing=0.1"),
    ("label", 100, "plain+batching=equal"), ("probs", 50, "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000"),
    ("probs", 99, "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000"),
    ("probs", 100, "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000")])
@pytest.mark.slow
def test_default_is_semi_below_ten_answers_per_class_and_records_it(victim_dir, tmp_path, mode, budget, resolved):
    """``auto`` (the default) resolves by the budget and the answer kind: FixMatch with smoothing 0.1 below 10
    queries per class (digits: 100), ``plain`` from there (with probabilities also tau 2, lr 0.05, clip 5);
    config.json records the name and the settings; the ledger spends exactly the budget."""
    from stealkit.extract.surrogate_data.presets import resolve_preset

    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", str(budget), "--epochs", "1",
               "--mode", mode, "--student", "mlp2", "--student-arg", "hidden=8", "--set", "fixmatch.mu=1",
               "--out", str(out)])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["preset"] == "auto" and cfg["preset_resolved"] == resolved
    for key, value in resolve_preset("auto", budget, 10, mode=mode)[1].items():
        assert _setting(cfg["surrogate"], key) == value
    summary = json.loads((out / "summary.json").read_text())
    semi = budget < 100 and mode == "label"  # probability answers: the same recipe at every budget (eleventh pass)
    assert summary["ssl"] == ("fixmatch" if semi else "none")
    assert summary["label_smoothing"] == (0.1 if mode == "label" else 0.0)  # the cross entropy only
    assert cfg["surrogate"]["batching"] == summary["batching"] == ("ragged" if semi else "equal")
    assert summary["queries"]["predict"] == budget == summary["n_distinct"] == summary["queries_spent"]


@pytest.mark.parametrize("extra,batching", [([], "equal"), (["--set", "batching=ragged"], "ragged"),
                                            (["--preset", "paper"], "ragged")])
def test_default_batches_equally_from_ten_per_class_and_ragged_is_one_set_away(victim_dir, tmp_path, extra, batching):
    """The default at 10 answers per class (digits: 100) cuts epochs into equal batches (ninth pass); the eighth
    pass's default is one ``--set batching=ragged`` away, and ``paper`` keeps the ragged last batch;
    config.json records it; the ledger spends exactly the budget either way."""
    cfg, summary = _run(victim_dir, tmp_path / "run", "label", 100, *extra)
    assert cfg["surrogate"]["batching"] == summary["batching"] == batching
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"] == summary["queries_spent"]


@pytest.mark.parametrize("extra,clip", [(["--preset", "paper"], 0.0), ([], 5.0),
                                        (["--set", "grad_clip=0.5", "--tau", "2"], 0.5)])
@pytest.mark.slow
def test_grad_clip_is_recorded_and_spends_exactly_the_budget(victim_dir, tmp_path, extra, clip):
    """``--set grad_clip=C`` (tenth pass) reaches the student's training and config.json; off in ``paper``,
    5 in the default with probability answers from 10 per class."""
    cfg, summary = _run(victim_dir, tmp_path / "run", "probs", 100, *extra)
    assert cfg["surrogate"]["grad_clip"] == summary["grad_clip"] == clip
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"] == summary["queries_spent"]


@pytest.mark.parametrize("mode,extra,tau,lr,clip", [
    ("probs", [], 2.0, 0.05, 5.0),
    pytest.param("probs", ["--tau", "1"], 1.0, 0.05, 5.0, marks=pytest.mark.slow),
    pytest.param("probs", ["--tau", "1", "--lr", "0.1", "--set", "grad_clip=0"], 1.0, 0.1, 0.0, marks=pytest.mark.slow),
    pytest.param("probs", ["--set", "tau=3"], 3.0, 0.05, 5.0, marks=pytest.mark.slow),  # 1-3 min each
    ("probs", ["--preset", "paper"], 1.0, None, 0.0),
    pytest.param("probs", ["--schedule", "constant"], 2.0, 0.05, 5.0, marks=pytest.mark.slow),
    ("label", [], 1.0, None, 0.0)])
def test_default_with_probabilities_sets_tau_lr_and_clip_and_explicit_values_win(victim_dir, tmp_path, mode, extra,
                                                                                 tau, lr, clip):
    """Tenth pass: with probability answers from 10 per class the default trains at tau 2, lr 0.05, clip 5, recorded
    in config.json and the summary; an explicit ``--tau``/``--lr``/``--set`` wins; ``paper`` and label answers
    keep tau 1 and SGD's learning rate; the ledger spends exactly the budget."""
    cfg, summary = _run(victim_dir, tmp_path / "run", mode, 100, *extra)
    assert (cfg["surrogate"]["tau"], cfg["surrogate"]["lr"], cfg["surrogate"]["grad_clip"]) == (tau, lr, clip)
    assert summary["grad_clip"] == clip
    auto = "--preset" not in extra
    assert cfg["preset_resolved"] == ("paper" if not auto else "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000"
                                      if mode == "probs" else "plain+batching=equal")
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"] == summary["queries_spent"]


_PAPER_EQUAL = ["--preset", "paper", "--set", "batching=equal"]


@pytest.mark.parametrize("mode,same_as", [
    ("label", [*_PAPER_EQUAL, "--set", "label_smoothing=0.1", "--set", "label_smoothing_min_per_class=10"]),
    pytest.param("probs", [*_PAPER_EQUAL, "--tau", "2", "--lr", "0.05", "--set", "grad_clip=5", "--set",
                           "min_steps=3000"], marks=pytest.mark.slow)])  # two runs of 3,000 steps: minutes
def test_default_trains_bitwise_as_its_spelled_out_settings(victim_dir, tmp_path, mode, same_as):
    """Label answers at 10 per class train exactly as ``paper`` with equal batches and label smoothing 0.1;
    probability answers exactly as ``paper`` with equal batches, tau 2, lr 0.05, clip 5 and the 3,000-step floor:
    the same student to the last bit."""
    from safetensors.torch import load_file

    weights = []
    for i, extra in enumerate(([], same_as)):
        out = tmp_path / f"run{i}"
        _run(victim_dir, out, mode, 100, *extra, epochs=2)
        weights.append(load_file(str(out / "student" / "model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def _setting(config: dict, key: str) -> object:
    """A recorded setting; ``"active.initial"`` is a field of the group ``active``."""
    for part in key.split("."):
        config = config[part]
    return config


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.slow
def test_default_selects_by_margin_from_twenty_per_class_and_records_it(victim_dir, tmp_path, mode):
    """Tenth pass: at 200 answers (digits: 20 per class) from a pool larger than the budget (a synthetic source
    draws 4 candidates per query) the default queries in margin rounds; config.json names it; a --set changes the
    preset's group; the ledger spends exactly the budget; the rounds are checkpointed."""
    out = tmp_path / "run"
    cfg, summary = _run(victim_dir, out, mode, 200, "--pool", "uniform", "--set", "active.round_epochs=1")
    assert cfg["preset_resolved"].endswith("+select=margin+active.initial=0.5")
    assert cfg["surrogate"]["select"] == "margin" and cfg["surrogate"]["active"]["initial"] == 0.5
    assert cfg["surrogate"]["active"]["round_epochs"] == 1  # --set on top of the preset's group setting
    assert summary["queries"]["predict"] == 200 == summary["n_distinct"] == summary["queries_spent"]
    assert (out / "checkpoint" / "active.json").exists()


@pytest.mark.parametrize("args,word", [(["--set", "mixup=0.2"], "mixup"), (["--set", "pretraining.epochs=2"], "pretraining"),
                                       (["--set", "active.round_ssl=true"], "active.round_ssl")])
def test_a_removed_setting_is_one_line_naming_where_it_went(tmp_path, capsys, args, word):
    """Settings measured and not adopted were removed: ``--set`` of one is a one-line error naming the commit that
    still has it, before the victim is opened."""
    out = tmp_path / "run"
    (tmp_path / "absent").mkdir(exist_ok=True)  # exists, not a model: the options are checked first
    rc = main(["-q", "extract", "surrogate", "--victim", str(tmp_path / "absent"), "--budget", "10", *args,
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and word in err and "9158eae" in err and "absent" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("args", [["--ssl", "soft"], ["--augment", "shift"], ["--pretrain", "rotation"],
                                  ["--cold-start", "typiclust"], ["--preset", "plain"], ["--select", "mix"]])
def test_removed_flags_and_presets_are_refused(tmp_path, args):
    from click.testing import CliRunner

    from stealkit.cli import cli

    (tmp_path / "absent").mkdir(exist_ok=True)  # exists, not a model: the options are checked first
    res = CliRunner().invoke(cli, ["extract", "surrogate", "--victim", str(tmp_path / "absent"), "--budget", "10",
                                   "--out", str(tmp_path / "run"), *args])
    assert res.exit_code == 2 and not (tmp_path / "run").exists()


def test_the_command_and_the_python_api_reach_the_same_default(victim_dir, tmp_path, monkeypatch):
    """What the command runs with no option but the budget and the answer kind is ``SurrogateConfig.default`` (and
    :func:`~stealkit.extract.surrogate_data.run.resolve_surrogate` of the default options) for that budget, batch 64 included; the run is stopped
    before training."""
    from stealkit.extract.surrogate_data import surrogate as mod
    from stealkit.extract.surrogate_data.run import SurrogateOptions, resolve_surrogate

    seen = []

    class Stop(Exception):
        pass

    def capture(*args, config, **kwargs):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(mod, "extract_surrogate", capture)
    for mode, budget in (("label", 50), ("label", 200), ("probs", 50), ("probs", 200)):
        with pytest.raises(Stop):
            main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--mode", mode, "--budget", str(budget),
                  "--out", str(tmp_path / f"{mode}{budget}")])
        config = seen[-1]
        assert config.batch_size == 64
        assert config == resolve_surrogate(SurrogateOptions(mode=mode), budget, 10)[1]
        assert config == mod.SurrogateConfig.default(budget, 10, mode=mode, eval_every=5)
