"""What a person sees: every command family's closing line reads as figures (no Python dict, ``None`` or
17-digit float on the terminal), and a wrong ``--budget`` or victim path is one line naming what is accepted,
raised before any model is loaded or trained (issue 44)."""

from __future__ import annotations

import re

import pytest
import torch

from stealkit import fmt
from stealkit.cli import main

REPR = re.compile(r"\{'|'\}|\bNone\b|\d\.\d{6,}")


def _clean(text: str) -> str:
    """``text`` with paths (which may hold anything) cut out; the rest must not look like a Python repr."""
    return re.sub(r"\S*/\S*", "PATH", text)


@pytest.fixture(scope="module")
def victim(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("victim") / "m"
    assert main(["-q", "train", "--dataset", "digits", "--arch", "mlp2", "--epochs", "10", "--batch-size", "64",
                 "--out", str(out)]) == 0
    return out


def test_formatting_helpers():
    assert fmt.queries({"predict": 1000, "explain": 0}) == "1,000 predict / 0 explain"
    assert fmt.queries(None) == "n/a" and fmt.queries(12345) == "12,345"
    assert fmt.figure(None) == "n/a" and fmt.figure(0.4226788580417633, 3) == "0.423"
    assert fmt.figure(True) == "yes" and fmt.figure(7) == "7"
    assert fmt.record({"round": 0, "selected": 10, "fidelity": None, "queries": {"predict": 5}, "t": 0.123456}) == \
        "round 0, selected 10, queries 5 predict, t 0.1235"


@pytest.mark.parametrize("args", [
    ["extract", "baseline", "--budget", "40", "--checkpoints", "40", "--student", "mlp2", "--epochs", "2"],
    ["extract", "surrogate", "--budget", "40", "--epochs", "1", "--student", "mlp2", "--student-arg", "hidden=8"],
    ["extract", "codfe", "--budget", "64", "--batch-size", "16", "--set", "noise_set=16", "--eval-every", "64"],
    ["attack", "hopskipjump", "--n", "4", "--max-queries", "40"],
    ["certify", "--sigma", "0.25", "--n0", "10", "--n", "20", "--num", "3"],
    ["extract", "gradient-matching", "--budget", "10", "--checkpoints", "5,10", "--student", "mlp2", "--steps", "20"],
    ["extract", "exact"],
], ids=["baseline", "surrogate", "codfe", "hopskipjump", "certify", "gradient-matching", "exact"])
@pytest.mark.slow
def test_each_command_family_prints_figures_not_reprs(victim, tmp_path, capsys, args):
    opt = "--model" if args[0] == "certify" else "--victim"
    rc = main([*args, opt, str(victim), "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    shown = _clean(out + err)
    assert "report" in out and not REPR.search(shown), shown


def test_train_prints_figures_not_reprs(tmp_path, capsys):
    assert main(["train", "--dataset", "digits", "--arch", "logistic", "--epochs", "1", "--out",
                 str(tmp_path / "m")]) == 0
    out, err = capsys.readouterr()
    assert "test accuracy" in out and not REPR.search(_clean(out + err))


@pytest.mark.parametrize("cmd", [["extract", "surrogate"], ["extract", "baseline"], ["extract", "codfe"],
                                 ["extract", "gradient-matching"], ["extract", "exact"], ["attack", "hopskipjump"]])
@pytest.mark.parametrize("budget", ["0", "-3"])
def test_a_budget_below_one_is_one_line_before_the_victim_is_loaded(tmp_path, capsys, monkeypatch, cmd, budget):
    import stealkit.victims

    monkeypatch.setattr(stealkit.victims, "standard_victim", lambda *a, **k: pytest.fail("victim was resolved"))
    rc = main([*cmd, "--victim", "standard:digits-conv2", "--budget", budget, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"--budget {budget}" in err and "positive integer" in err
    assert "pool is empty" not in err


@pytest.mark.parametrize("cmd", [["extract", "surrogate", "--budget", "10"], ["extract", "codfe", "--budget", "10"],
                                 ["attack", "hopskipjump"], ["certify"]])
def test_a_mistyped_victim_path_names_every_accepted_form(tmp_path, capsys, monkeypatch, cmd):
    import stealkit.models

    monkeypatch.setattr(stealkit.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    opt = "--model" if cmd[0] == "certify" else "--victim"
    rc = main([*cmd, opt, str(tmp_path / "runs" / "vicitm"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "vicitm: no such file or directory" in err
    for form in ("stealkit train", "standard:NAME", ".onnx", ".pt", "http(s)://", "v2+http://"):
        assert form in err, form
    assert "save_model" not in err


@pytest.mark.parametrize("alias", ["fmnist", "fashion_mnist", "FashionMNIST"])
def test_dataset_aliases_reach_the_command_as_the_canonical_name(alias):
    from stealkit.commands.common import dataset_name

    assert dataset_name(None, None, alias) == "fashion-mnist"
    with pytest.raises(Exception, match="known data sets"):
        dataset_name(None, None, "fashon-mnist")


def test_train_stores_the_canonical_dataset_name(tmp_path):
    import json

    out = tmp_path / "m"
    assert main(["-q", "train", "--dataset", "DIGITS", "--arch", "logistic", "--epochs", "1", "--out", str(out)]) == 0
    spec = json.loads((out / "model.json").read_text())
    assert spec["extra"]["dataset"] == spec["metrics"]["dataset"] == "digits"
    assert json.loads((out / "config.json").read_text())["config"]["dataset"] == "digits"


def test_reproduce_only_takes_the_names_of_study_list(tmp_path, capsys):
    from stealkit.experiments.config import load_config
    from stealkit.experiments.reproduce import config_paths, resolve_only, study_aliases
    from stealkit.studies.registry import STUDIES

    configs = [load_config(p) for p in config_paths("small")]
    names, aliases = {c.name for c in configs}, study_aliases(configs)
    for study in ("explanations", "codfe", "dfme-logits", "stn-certify", "transfer"):
        assert study in STUDIES and (study in names or study in aliases)
    # one name: a study's reproduce name is its `study list` name (a study run by two configs selects both)
    for study in ("explanations", "dfme-table4", "stn-certify", "defences"):
        assert study in names and resolve_only(configs, (study,)) == {study}
    assert resolve_only(configs, ("codfe", "transfer")) == {"codfe-figure-2-table-3", "codfe-tables-1-2"}
    assert resolve_only(configs, ("milli-figures-2-4",)) == {"explanations"}  # the former name still works
    assert {n for s in STUDIES for n in aliases.get(s, {s} & names)} <= names
    assert main(["reproduce", "--only", "explanation", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "explanations" in err and "unknown studies explanation;" in err


def test_the_reproduce_report_counts_every_run_of_a_study_from_its_ledgers(tmp_path):
    import json

    from stealkit.experiments.reproduce import study_ledger

    runs = {"two-layer": {"queries": {"predict": 6227, "explain": 9570}},
            "logistic": {"queries": {"predict": 1, "explain": 9}},
            "study/runs/attack": {"victim_queries": {"predict": 40}},
            "study": {"rows": [{"queries": 123}]},  # a study's table: no ledger, not counted
            "victim": {"accuracy": 0.9}}
    for sub, summary in runs.items():
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / sub / "summary.json").write_text(json.dumps(summary))
    ledger = study_ledger(tmp_path)
    assert ledger == {"predict": 6268, "explain": 9579}
    assert fmt.queries(ledger) == "6,268 predict / 9,579 explain"
    assert study_ledger(tmp_path / "victim") is None


def test_the_documented_keys_file_is_accepted_by_the_servers_loader():
    from pathlib import Path

    from stealkit.serve.keys import load_keys

    path = Path(__file__).resolve().parents[1] / "docs" / "keys.example.toml"
    config = load_keys(path)
    assert len(config.keys) == 2


def test_model_files_get_the_mode_of_any_file_the_user_writes(tmp_path):
    """docs/architecture.md: files get what any file the user writes gets (the umask applies); safetensors
    alone would leave model.safetensors 0600 beside a 0644 model.json."""
    import os
    import stat

    from stealkit.fsutil import default_file_mode
    from stealkit.models import save_model
    from stealkit.models.io import build_from_spec
    from stealkit.models.spec import ModelSpec

    spec = ModelSpec(arch="logistic", input_shape=(1, 8, 8), num_classes=10)
    old = os.umask(0o027)
    try:
        out = save_model(build_from_spec(spec), spec, tmp_path / "m")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    finally:
        os.umask(old)
    assert modes == {"model.safetensors": 0o640, "model.json": 0o640}, modes
    assert default_file_mode() == 0o666 & ~old


def test_the_cheap_architecture_check_knows_the_zoo():
    from stealkit.commands.common import ARCH_NAMES
    from stealkit.models.zoo import ARCHITECTURES

    assert set(ARCH_NAMES) == set(ARCHITECTURES) and list(ARCH_NAMES) == sorted(ARCH_NAMES)


@pytest.mark.parametrize("args, wanted", [
    (["extract", "surrogate", "--budget", "10", "--student", "resnet18"], "--student resnet18: unknown architecture"),
    (["extract", "baseline", "--budget", "10", "--pool", "imagenet"], "--pool imagenet: unknown query source"),
    (["extract", "codfe", "--budget", "10", "--student", "cnn"], "choose one of: cnn3, cnn4, conv2"),
    (["extract", "gradient-matching", "--budget", "10", "--pool", "digits:colour=1"], "valid options"),
])
def test_a_wrong_student_or_pool_is_one_line_before_the_victim_is_loaded(tmp_path, capsys, monkeypatch, args,
                                                                         wanted):
    import stealkit.victims

    monkeypatch.setattr(stealkit.victims, "standard_victim", lambda *a, **k: pytest.fail("victim was resolved"))
    rc = main([*args, "--victim", "standard:digits-conv2", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and wanted in err, err
