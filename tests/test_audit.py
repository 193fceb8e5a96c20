"""``stealkit audit``: the plan before any query, the ledger under --max-queries, resume without paying twice, the
report (at a tiny size on the standard digits victim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stealkit.cli import main
from stealkit.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
VICTIM = "standard:digits-conv2"
#: a tiny recipe: an 8-unit MLP student, one epoch, no minimum of steps
TINY = ["--recipe=--student=mlp2", "--recipe=--student-arg=hidden=8", "--recipe=--epochs=1",
        "--recipe=--set=min_steps=0"]
ARGS = ["audit", "--victim", VICTIM, "--answers", "label,probs", "--budgets", "20,40", *TINY]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # standard victims are cached in runs/victims


def _parts(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "parts").glob("*.json")}


def test_plan_prints_parts_and_total_and_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a"
    assert main(["-q", *ARGS, "--plan", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "extract-label-like-20" in text and "extract-probs-unrelated-40" in text
    assert "total" in text and "240" in text  # 2 answer kinds x 2 attackers x (20 + 40)
    assert not out.exists()  # nothing written, nothing queried


def test_plan_drops_rungs_to_fit_and_refuses_a_budget_too_small(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", *ARGS, "--max-queries", "100", "--plan", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "-40 " not in text and "rung 40 dropped" in text
    assert main(["-q", *ARGS, "--max-queries", "50", "--plan", "--out", str(tmp_path / "b")]) == 2
    assert "too small for any part" in capsys.readouterr().err


def test_bad_answer_kind_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "audit", "--victim", VICTIM, "--answers", "logits", "--out", str(tmp_path / "a")]) == 2
    assert "--answers" in capsys.readouterr().err


def test_audit_resumes_without_paying_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stealkit.commands.audit import run_audit_command
    from stealkit.victims import standard_victim

    victim = str(standard_victim("digits-conv2").path)
    kwargs: dict[str, Any] = {"victim": victim, "answers": "label,probs", "budgets": "20,40",
                              "recipe": [a.split("=", 1)[1] for a in TINY]}

    # an uninterrupted audit
    whole = tmp_path / "whole"
    run_audit_command(out=str(whole), **kwargs)
    summary = json.loads((whole / "summary.json").read_text())
    total = summary["queries"]
    assert total == sum(r["total_queries"] for r in summary["parts"]) == 240 <= summary["max_queries"]
    assert (whole / "report.html").exists() and "Q90" in (whole / "report.html").read_text()

    # the same audit stopped by the hook after its first part, then run again
    class Stop(Exception):
        pass

    def stop(part: Any, result: dict[str, Any]) -> None:
        raise Stop(part.id)

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        run_audit_command(out=str(cut), on_part=stop, **kwargs)
    first = _parts(cut)
    assert list(first) == ["extract-label-like-20"] and not (cut / "summary.json").exists()
    stamp = (cut / "parts" / "extract-label-like-20.json").stat().st_mtime_ns
    spent_after_cut = first["extract-label-like-20"]["total_queries"]

    calls: list[str] = []
    run_audit_command(out=str(cut), on_part=lambda p, r: calls.append(p.id), **kwargs)
    assert "extract-label-like-20" not in calls and len(calls) == 7  # the finished part is not run again
    assert (cut / "parts" / "extract-label-like-20.json").stat().st_mtime_ns == stamp
    resumed = json.loads((cut / "summary.json").read_text())
    spent_in_resume = sum(r["total_queries"] for r in resumed["parts"] if r["id"] in calls)
    assert spent_after_cut + spent_in_resume == resumed["queries"] == total
    assert [r["fidelity"] for r in resumed["parts"]] == [r["fidelity"] for r in summary["parts"]]

    # another plan in the same folder is refused
    with pytest.raises(InputError, match="another plan"):
        run_audit_command(out=str(cut), **{**kwargs, "budgets": "20"})


def test_headline_q90_is_the_fewest_measured_queries_that_reached_it() -> None:
    from stealkit.commands.audit import headline

    def point(b: int, f: float) -> dict[str, Any]:
        return {"part": {"answers": "label", "attacker": "like", "budget": b}, "total_queries": b, "fidelity": f}

    (row,) = headline([point(200, 0.96), point(50, 0.8), point(100, 0.91)])
    assert row["Q90"] == 100 and row["Q95"] == 200
    (row,) = headline([point(50, 0.8), point(100, 0.85)])
    assert row["Q90"] == "not reached within 100"


def test_a_float32_fidelity_at_the_threshold_reaches_it() -> None:
    from stealkit.commands.audit import headline

    point = {"part": {"answers": "topk", "attacker": "like", "budget": 100}, "total_queries": 100,
             "fidelity": 0.8999999761581421}  # 405/450 in float32
    assert headline([point])[0]["Q90"] == 100


def test_defences_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d"
    assert main(["-q", "audit", "--victim", VICTIM, "--answers", "probs", "--budgets", "20", *TINY,
                 "--defence", "round:decimals=1", "--defence", "label", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["defence"]: r for r in summary["headline"]}
    assert set(rows) == {"none", "round:decimals=1", "label"}
    assert rows["label"]["served accuracy"] == pytest.approx(summary["victim_accuracy"], abs=1e-6)  # top-1 kept
    assert summary["queries"] == 80 == sum(r["total_queries"] for r in summary["parts"])
    assert "through the defence label" in (out / "report.html").read_text()
    assert "defence" in capsys.readouterr().out


def test_defence_of_a_remote_victim_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "audit", "--victim", "http://127.0.0.1:9", "--key", "k", "--defence", "label",
                 "--out", str(tmp_path / "r")]) == 2
    assert "remote victim" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_fail_if_gates_on_q90() -> None:
    from stealkit.commands.audit import failed_gates, parse_fail_if

    rows = [{"answers": "label", "attacker": "like", "Q90": 100, "Q95": "not reached within 200"},
            {"answers": "probs", "attacker": "like", "Q90": 50, "Q95": 100},
            {"answers": "label", "attacker": "unrelated", "Q90": 20, "Q95": 20}]
    assert parse_fail_if("label:q95<5000") == ("label", 95, 5000)
    assert failed_gates(rows, ["q90<60"]) == ["--fail-if q90<60: probs answers reach 90 % fidelity with 50 queries"]
    assert failed_gates(rows, ["label:q90<100", "q95<100"]) == []  # the unrelated attacker is not gated
    with pytest.raises(InputError, match="--fail-if"):
        parse_fail_if("q80<5")


def test_fail_if_exits_one_after_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "g"
    args = ["-q", "audit", "--victim", VICTIM, "--answers", "label", "--budgets", "20", *TINY, "--out", str(out)]
    assert main([*args, "--fail-if", "q90<10"]) == 0  # nothing reaches 90 % below 10 queries
    assert main([*args, "--fail-if", "q90<10", "--fail-if", "bad"]) == 2
    assert "--fail-if" in capsys.readouterr().err
    import stealkit.commands.audit as audit

    monkeypatch.setattr(audit, "failed_gates", lambda rows, gates: [f"--fail-if {g}: tripped" for g in gates])
    assert main([*args, "--fail-if", "q90<10"]) == 1  # resumed: every part done, no query; the gate trips
    assert "--fail-if q90<10: tripped" in capsys.readouterr().err
    assert (out / "report.html").exists()
