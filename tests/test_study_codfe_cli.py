"""``stealkit study codfe`` on a tiny budget: four runs, ledger-exact query counts, paper numbers beside ours."""

from __future__ import annotations

import json

import pytest

from stealkit.cli import main


@pytest.mark.slow
def test_study_codfe_tiny(tmp_path, capsys):
    out = tmp_path / "codfe"
    assert main(["study", "codfe", "--datasets", "digits", "--budget", "2000", "--noise-set", "500",
                 "--replay", "1000", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "config.json").read_text())["config"]["study"]["codfe_overrides"]["replay_capacity"] == 1000
    assert [r["variant"] for r in summary["rows"]] == ["CoDFe-P", "DaST-P", "CoDFe-L", "DaST-L"]
    for row in summary["rows"]:
        assert 0 < row["queries"] <= 2000
        assert row["paper_queries_to_max"] > 0
    assert "Table 3" in (out / "report.html").read_text()
    assert "report:" in capsys.readouterr().out


def test_study_codfe_rejects_unknown_dataset(tmp_path, capsys):
    assert main(["study", "codfe", "--datasets", "cifar10", "--out", str(tmp_path / "x")]) == 2
    assert "unknown data sets" in capsys.readouterr().err
