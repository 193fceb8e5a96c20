from __future__ import annotations

import json

import click
import pytest

from stealkit.cli import cli, main


def all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out.extend(all_commands(cmd, (*prefix, name)))
        else:
            out.append((*prefix, name))
    return out


@pytest.mark.parametrize("path", all_commands(cli), ids=lambda p: " ".join(p) or "stealkit")
def test_every_command_has_help(path, capsys):
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage:" in out and len(out) > 100


def test_core_commands_present():
    names = {" ".join(p) for p in all_commands(cli)}
    assert {"train", "extract", "extract baseline", "report", "demo"} <= names


def test_user_error_is_one_line_not_a_traceback(tmp_path, capsys):
    code = main(["extract", "baseline", "--victim", str(tmp_path / "missing"), "--budget", "10",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "Traceback" not in err


def test_unknown_dataset(tmp_path, capsys):
    code = main(["train", "--dataset", "imagenet", "--out", str(tmp_path / "m")])
    assert code == 2 and "imagenet" in capsys.readouterr().err


def test_bad_option_value(capsys):
    assert main(["extract", "baseline", "--mode", "scores", "--victim", "x", "--budget", "1", "--out", "y"]) == 2


def test_end_to_end_train_extract_report(tmp_path, capsys):
    victim = tmp_path / "victim"
    assert main(["train", "--dataset", "digits", "--arch", "mlp2", "--epochs", "15", "--batch-size", "64",
                 "--out", str(victim)]) == 0
    for name in ("model.safetensors", "model.json", "metrics.json", "config.json", "summary.json", "report.html"):
        assert (victim / name).exists(), name
    acc = json.loads((victim / "metrics.json").read_text())["test_accuracy"]
    assert acc > 0.85

    run = tmp_path / "steal"
    assert main(["extract", "baseline", "--victim", str(victim), "--mode", "probs", "--budget", "150",
                 "--checkpoints", "50,150", "--student", "mlp2", "--epochs", "30", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["queries"] == {"predict": 150, "explain": 0}
    assert [p["queries"] for p in summary["curve"]] == [50, 150]
    assert summary["victim_accuracy"] == pytest.approx(acc, abs=1e-6)
    assert summary["accuracy"] > 0.6 and summary["fidelity"] > 0.6
    assert (run / "student" / "model.safetensors").exists()
    assert len((run / "records.jsonl").read_text().splitlines()) == 2
    html = (run / "report.html").read_text()
    assert "data:image/png;base64," in html and "Accuracy against queries" in html

    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").exists()
    assert not list(run.glob(".*.tmp"))


def test_unspent_budget_and_chance_level_are_said_where_the_user_looks(tmp_path, caplog):
    """A budget the pool can't fill, and a copy at chance, are one warning line each and a note on the page."""
    from stealkit.extract.common import ExtractionResult, Victim, extraction_notes
    from stealkit.oracle import QueryLedger

    class Oracle:
        ledger = QueryLedger(budget=500)

    victim = Victim(oracle=Oracle(), input_shape=(1, 8, 8), num_classes=10, dataset="digits")  # type: ignore[arg-type]
    result = ExtractionResult(method="dfme", student=None, accuracy=0.1, fidelity=0.1,  # type: ignore[arg-type]
                              victim_accuracy=0.97, queries={"predict": 449, "explain": 0}, curve=[])
    notes = extraction_notes(result, victim)
    assert len(notes) == 2 and "51 of the 500-query budget were not spent" in notes[0]
    assert "chance level" in notes[1] and "2M queries" in notes[1]
    fine = ExtractionResult(method="baseline", student=None, accuracy=0.9, fidelity=0.9,  # type: ignore[arg-type]
                            victim_accuracy=0.97, queries={"predict": 500, "explain": 0}, curve=[])
    assert extraction_notes(fine, victim) == []


def test_command_lists_never_cut_a_help_at_et_al():
    """click's default short help stops at the first period: 'dast  DaST (Zhou et al.' -- ours does not."""
    from click.testing import CliRunner

    from stealkit.cli import _short_help, cli

    assert _short_help("DaST (Zhou et al. 2020): a generator. More text.") == "DaST (Zhou et al. 2020): a generator."
    for group in (["--help"], ["extract", "--help"], ["study", "--help"], ["attack", "--help"]):
        out = CliRunner().invoke(cli, group).output
        assert "et al.\n" not in out and "Li et al.\n" not in out, out
