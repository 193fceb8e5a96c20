"""``stealkit defences`` takes any victim the other commands take (issue 50): a model directory, a TorchScript file
(with ``--input-shape`` where its metadata lacks it), with ``--dataset`` or the owner's ``--test-data`` and
``--pool``; a standard victim as before; an HTTP victim refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from stealkit.cli import main
from tests import test_own_data

digits_victim = test_own_data.digits_victim  # module-scoped: a digits mlp2 victim, pool.npz and test.npz

TINY = ["--budget", "30", "--seeds", "0", "--epochs", "1", "--student", "mlp2", "--defence", "none", "--defence",
        "label", "--defence", "round:decimals=1"]


def _plain_torchscript(root, path):
    """The victim as a TorchScript file without stealkit's metadata: no input shape, no data set."""
    from stealkit.models import load_model

    model = load_model(root / "victim")[0].eval()
    torch.jit.save(torch.jit.trace(model, torch.zeros(1, 1, 8, 8)), str(path))
    return path


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_a_model_directory_and_its_torchscript_file_give_the_same_table(digits_victim, tmp_path):
    """The victim as a stealkit model directory (its data set read from model.json) and as a TorchScript file
    without metadata (``--input-shape``, ``--dataset``): the same served accuracies, the same extraction figures
    at the same seeds, the same PRADA statistic."""
    root = digits_victim
    ts = _plain_torchscript(root, tmp_path / "victim.pt")
    assert main(["-q", "defences", "--victim", str(root / "victim"), *TINY, "--out", str(tmp_path / "dir")]) == 0
    assert main(["-q", "defences", "--victim", str(ts), "--input-shape", "1,8,8", "--dataset", "digits", *TINY,
                 "--out", str(tmp_path / "ts")]) == 0
    a, b = _summary(tmp_path / "dir"), _summary(tmp_path / "ts")
    assert [r["defence"] for r in a["rows"]] == ["none", "label", "round:decimals=1"]
    for ra, rb in zip(a["rows"], b["rows"], strict=True):
        assert ra["served_accuracy"] == pytest.approx(rb["served_accuracy"], abs=1e-4)
        assert ra["queries"] == rb["queries"] == 30
        assert ra["extraction_accuracy_mean"] == pytest.approx(rb["extraction_accuracy_mean"], abs=1e-4)
        assert ra["fidelity_mean"] == pytest.approx(rb["fidelity_mean"], abs=1e-4)
    assert a["victim_accuracy"] == pytest.approx(b["victim_accuracy"], abs=1e-6)
    assert a["prada"]["statistic"] == pytest.approx(b["prada"]["statistic"], abs=1e-4)
    assert b["victim"] == f"{ts}?input_shape=1,8,8"


def test_a_file_victim_on_the_owners_own_pool_and_test_data(digits_victim, tmp_path):
    """No data set at all: the TorchScript file, the owner's pool and labelled test split. Every accuracy is the
    one on the owner's items; the data's digests are in the summary."""
    root = digits_victim
    ts = _plain_torchscript(root, tmp_path / "victim.pt")
    out = tmp_path / "own"
    assert main(["-q", "defences", "--victim", str(ts), "--input-shape", "1,8,8", "--test-data",
                 str(root / "test.npz"), "--pool", str(root / "pool.npz"), *TINY, "--out", str(out)]) == 0
    summary = _summary(out)
    owner = test_own_data._victim_accuracy(root)
    assert summary["victim_accuracy"] == pytest.approx(owner, abs=1e-6)
    none = next(r for r in summary["rows"] if r["defence"] == "none")
    assert none["served_accuracy"] == pytest.approx(owner, abs=1e-4) and none["queries"] == 30
    assert summary["own_data"]["test_data"]["size"] == 150 and summary["own_data"]["pool"]["size"] == 105
    config = json.loads((out / "config.json").read_text())["config"]["study"]
    assert config["test_data"] == str(root / "test.npz") and config["dataset"] is None


@pytest.mark.parametrize("argv, words", [
    (["--victim", "http://127.0.0.1:9/"], "is a remote victim; the study puts each defence on the victim's own"),
    (["--victim", "v2+http://127.0.0.1:9/v2/models/m"], "is a remote victim"),
    (["--victim", "digits-conv2", "--input-shape", "1,8,8"], "--input-shape only apply to an ONNX or TorchScript"),
    (["--victim", "no/such/model.pt"], "no such file or directory"),
])
def test_what_the_study_cannot_take_is_one_line_and_nothing_is_written(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert main(["-q", "defences", *argv, *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_file_victim_without_data_says_what_to_pass(digits_victim, tmp_path, capsys):
    ts = _plain_torchscript(digits_victim, tmp_path / "victim.pt")
    assert main(["-q", "defences", "--victim", str(ts), "--input-shape", "1,8,8", *TINY, "--out",
                 str(tmp_path / "out")]) == 2
    assert "--dataset" in capsys.readouterr().err and not (tmp_path / "out").exists()
