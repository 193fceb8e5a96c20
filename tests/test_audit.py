"""``stealkit audit``: the plan before any query, the ledger under --max-queries, resume without paying twice, the
report (at a tiny size on the standard digits victim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stealkit.cli import main
from stealkit.errors import InputError
from tests.audit_kit import part_id

ROOT = Path(__file__).resolve().parents[1]
VICTIM = "standard:digits-conv2"
#: a tiny recipe: an 8-unit MLP student, one epoch, no minimum of steps
TINY = ["--set", "student=mlp2", "--set", "student.hidden=8", "--set", "epochs=1", "--set", "min_steps=0"]
#: the same, as run_audit_command's settings
TINY_KW = {"student": "mlp2", "student.hidden": 8, "epochs": 1, "min_steps": 0}
#: the extraction ladder only: no transfer, decision, data-free or explanation part, one seed, no default defence
#: cells
NO_MORE = ["--gradmatch-budgets", "0", "--exact-budget", "0", "--seeds", "1"]
NO_MORE_KW: dict[str, Any] = {"gradmatch_budgets": "0", "exact_budget": 0, "seeds": 1}
NO_EXTRAS = ["--transfer-images", "0", "--decision-images", "0", "--datafree-budget", "0", "--defence", "none",
             *NO_MORE]
NO_EXTRAS_KW: dict[str, Any] = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 0,
                                "defences": ["none"], **NO_MORE_KW}
ARGS = ["audit", "--victim", VICTIM, "--answers", "label,probs", "--budgets", "20,40", *TINY, *NO_EXTRAS]


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
    from stealkit.victims import standard_victim
    from tests.audit_kit import run_audit_command

    victim = str(standard_victim("digits-conv2").path)
    kwargs: dict[str, Any] = {"victim": victim, "answers": "label,probs", "budgets": "20,40",
                              "settings": TINY_KW, **NO_EXTRAS_KW}

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
        raise Stop(part_id(part))

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        run_audit_command(out=str(cut), on_part=stop, **kwargs)
    first = _parts(cut)
    assert list(first) == ["extract-label-like-20"] and not (cut / "summary.json").exists()
    stamp = (cut / "parts" / "extract-label-like-20.json").stat().st_mtime_ns
    spent_after_cut = first["extract-label-like-20"]["total_queries"]

    calls: list[str] = []
    run_audit_command(out=str(cut), on_part=lambda p, r: calls.append(part_id(p)), **kwargs)
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
    from stealkit.audit.copies import headline

    def point(b: int, f: float) -> dict[str, Any]:
        return {"part": {"answers": "label", "attacker": "like", "budget": b}, "total_queries": b, "fidelity": f}

    (row,) = headline([point(200, 0.96), point(50, 0.8), point(100, 0.91)])
    assert row["Q90"] == 100 and row["Q95"] == 200
    (row,) = headline([point(50, 0.8), point(100, 0.85)])
    assert row["Q90"] == "not reached within 100"


def test_a_float32_fidelity_at_the_threshold_reaches_it() -> None:
    from stealkit.audit.copies import headline

    point = {"part": {"answers": "topk", "attacker": "like", "budget": 100}, "total_queries": 100,
             "fidelity": 0.8999999761581421}  # 405/450 in float32
    assert headline([point])[0]["Q90"] == 100


def test_defences_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d"
    assert main(["-q", "audit", "--victim", VICTIM, "--answers", "probs", "--budgets", "20", *TINY, *NO_EXTRAS,
                 "--defence", "round:decimals=1", "--defence", "label", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["defence"]: r for r in summary["headline"] if r["answers"] == "probs"}
    assert set(rows) == {"none", "round:decimals=1", "label"}
    assert rows["label"]["served accuracy"] == pytest.approx(summary["victim_accuracy"], abs=1e-6)  # top-1 kept
    # each defence attacked twice: the probability recipe, and the label recipe on the argmax of what is served
    argmax = {r["defence"] for r in summary["headline"] if r["answers"] == "label"}
    assert argmax == {"round:decimals=1", "label"}
    assert summary["queries"] == 120 == sum(r["total_queries"] for r in summary["parts"])
    assert "through the defence label" in (out / "report.html").read_text()
    assert "defence" in capsys.readouterr().out


def test_defence_of_a_remote_victim_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "audit", "--victim", "http://127.0.0.1:9", "--key", "k", "--defence", "label",
                 "--out", str(tmp_path / "r")]) == 2
    assert "remote victim" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _cell(answers: str, attacker: str, *points: tuple[int, float | None]) -> list[dict[str, Any]]:
    return [{"part": {"kind": "extract", "answers": answers, "attacker": attacker, "budget": b, "defence": ""},
             "total_queries": b, "fidelity": f} for b, f in points]


def test_fail_if_decides_or_says_it_cannot() -> None:
    from stealkit.audit.options import parse_fail_if
    from stealkit.audit.report import EXIT_FAIL, EXIT_PASS, EXIT_UNDECIDED, decide_gates, exit_code

    results = [*_cell("label", "like", (50, 0.8), (100, 0.91), (200, 0.96)), *_cell("probs", "like", (50, 0.92)),
               *_cell("label", "unrelated", (20, 0.99))]
    assert parse_fail_if("label:q95<5000") == ("label", 95, 5000)

    def status(*gates: str) -> list[str]:
        return [g.status for g in decide_gates(results, gates)]

    assert status("q90<60") == ["fail"]  # probabilities reach 90 % with 50 queries
    (g,) = decide_gates(results, ["q90<60"])
    assert g.line == "--fail-if q90<60: probs answers reach 90 % fidelity with 50 queries"
    # a gate is decided by one rung, N - 1 for q90<N: not reached with 50, reached with 100, so Q90 lies in 51..100
    assert status("label:q90<51", "label:q90<101", "label:q95<101") == ["pass", "fail", "pass"]
    (g,) = decide_gates(results, ["label:q90<100"])  # 99 was not measured: an attacker may need only 60
    assert g.status == "undecided" and "no rung at 99 measured" in g.line and "add a rung of 99" in g.line
    assert status("label:q90<20") == ["pass"]  # the unrelated attacker (20 queries) is not gated
    # probabilities never reached 95 % and their ladder stops at 50: below the gate's 999, so undecided
    (g,) = decide_gates(results, ["probs:q95<1000"], {"probs": "the query source pool holds 50 images"})
    assert g.status == "undecided" and g.line == ("--fail-if probs:q95<1000: cannot decide: probs answers: not "
                                                  "reached within 50 queries; the ladder stops at 50, below 999 "
                                                  "(the query source pool holds 50 images)")
    assert status("probs:q95<51") == ["pass"]  # not reached within 50: Q95 is 51 or more
    # q90>N: reached within N passes, not reached at N or beyond fails, a gap around N is undecided
    assert status("label:q90>100", "label:q95>100", "label:q90>99", "probs:q95>50") == [
        "pass", "fail", "undecided", "fail"]
    assert status("topk:q90<10") == ["undecided"]  # no such cell was audited
    remote = _cell("label", "like", (50, None), (100, None))  # a remote victim: fidelity not measured
    assert [g.status for g in decide_gates(remote, ["q90<10"])] == ["undecided"]
    assert exit_code(decide_gates(results, ["label:q90<51"])) == EXIT_PASS
    assert exit_code(decide_gates(results, ["label:q90<51", "probs:q95<1000"])) == EXIT_UNDECIDED
    assert exit_code(decide_gates(results, ["probs:q95<1000", "q90<60"])) == EXIT_FAIL
    with pytest.raises(InputError, match="--fail-if"):
        parse_fail_if("q80<5")


def test_fail_if_exit_codes_after_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "g"
    args = ["-q", "audit", "--victim", VICTIM, "--answers", "label", "--budgets", "20", *TINY, *NO_EXTRAS,
            "--out", str(out)]
    assert main([*args, "--fail-if", "q90<10"]) == 0  # measured: nothing reaches 90 % within 20 >= 10 queries
    assert "passed (measured)" in capsys.readouterr().err
    assert main([*args, "--fail-if", "q90<10", "--fail-if", "bad"]) == 2
    assert "--fail-if" in capsys.readouterr().err
    # resumed; unreached at 20, the ladder extends to the pool's 449 images, below the decisive 999: undecided
    assert main([*args, "--fail-if", "q90<1000"]) == 3
    err = capsys.readouterr().err
    assert "cannot decide" in err and "the ladder stops at 449, below 999 (the query source pool holds 449" in err
    import stealkit.audit.gates as gates
    from stealkit.audit.gates import Gate

    monkeypatch.setattr(gates, "decide_gates", lambda results, specs, *_a: [Gate(g, "fail", f"--fail-if {g}: tripped")
                                                                            for g in specs])
    assert main([*args, "--fail-if", "q90<10"]) == 1  # resumed: every part done, no query; the gate trips
    assert "--fail-if q90<10: tripped" in capsys.readouterr().err
    assert (out / "report.html").exists()


#: small parts beyond the ladder: PGD on 10 images, HopSkipJump on 2 images at 20 queries each, no data-free part
SMALL_ATTACKS: dict[str, Any] = {"transfer_images": 10, "decision_images": 2, "decision_queries": 20,
                                 "datafree_budget": 0, **NO_MORE_KW}


def test_plan_shows_the_attack_and_data_free_parts_and_fits_them(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base = ["-q", "audit", "--victim", VICTIM, "--answers", "label", "--budgets", "20,40", *TINY, *NO_MORE]
    assert main([*base, "--quick", "--plan", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    # --quick: PGD on 100 images (2 x 100 queries at most), HopSkipJump 5 images x (200 + 1), data-free 2,000
    assert "transfer-pgd-100" in text and "200" in text
    assert "hopskipjump-without-copy-5x200" in text and "hopskipjump-with-copy-5x200" in text and "1,005" in text
    assert "datafree-label-2000" in text
    assert "total" in text and f"{2 * 60 + 200 + 2 * 1005 + 2000:,}" in text
    # a cap that holds the ladder and the attacks but leaves the data-free part 400 < 500 queries: left out
    cap = 2 * 60 + 200 + 2 * 1005 + 400
    assert main([*base, "--quick", "--max-queries", str(cap), "--plan", "--out", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "datafree-label" not in text and "data-free attacker left out" in text
    # the data-free part gets what is left, up to its cap
    assert main([*base, "--quick", "--max-queries", str(cap + 300), "--plan", "--out", str(tmp_path / "c")]) == 0
    assert "datafree-label-700 " in capsys.readouterr().out
    # too small for the attacks: the top rung goes first, then the decision parts, then the transfer part
    assert main([*base, "--quick", "--max-queries", "300", "--plan", "--out", str(tmp_path / "d")]) == 0
    text = capsys.readouterr().out
    assert "rung 40 dropped" in text and "decision attack left out" in text and "transfer-pgd-100" in text
    assert "hopskipjump" not in text.split("note:")[0]


@pytest.mark.slow
def test_what_the_stolen_copy_enables(tmp_path: Path) -> None:
    """PGD from the best copy and HopSkipJump without and with it, run as the attack commands under the part's
    budget: every figure read back from those commands' own summaries, every query from their ledgers."""
    from stealkit.audit.copies import best_copy
    from stealkit.evade.gradient_based.transfer import CODFE_PGD
    from stealkit.victims import standard_victim
    from tests.audit_kit import run_audit_command

    victim = str(standard_victim("digits-conv2").path)
    out = tmp_path / "e"
    run_audit_command(victim=victim, answers="label", budgets="20,40", settings=TINY_KW,
                      out=str(out), **SMALL_ATTACKS)
    summary = json.loads((out / "summary.json").read_text())
    parts = {r["id"]: r for r in summary["parts"]}
    extracted = [r for r in summary["parts"] if r["part"]["kind"] == "extract"]
    best = max(extracted, key=lambda r: (r["fidelity"], -r["total_queries"]))
    assert best_copy(summary["parts"], out / "parts").id == best["id"]
    assert (out / "parts" / best["id"] / "student" / "model.json").exists()  # the copy, saved as extract saves it

    transfer = parts["transfer-pgd-10"]
    own = json.loads((out / "parts" / "transfer-pgd-10" / "summary.json").read_text())
    assert transfer["copy"] == best["id"] and transfer["asr"] == own["asr"]
    assert own["attack"]["eps"] == CODFE_PGD["eps"] == 0.25 and own["attack"]["method"] == "pgd"
    assert transfer["total_queries"] == sum(own["victim_queries"].values()) == 10 + transfer["attempts"] <= 20

    without = parts["hopskipjump-without-copy-2x20"]
    with_copy = parts["hopskipjump-with-copy-2x20"]
    for r in (without, with_copy):
        assert 2 < r["total_queries"] <= 2 * 21  # 2 clean queries, then at most 20 per image
        own = json.loads((out / "parts" / r["id"] / "summary.json").read_text())
        assert r["median_l2"] == own["median_norm_successful"]
    assert "--substitute" in with_copy["command"] and "--substitute" not in without["command"]
    assert without["attempts"] == with_copy["attempts"]  # the same test images

    rows = {r["attack"]: r for r in summary["enables"]}
    assert rows["HopSkipJump with the copy"]["median L2"] == with_copy["median_l2"]
    assert summary["queries"] == sum(r["total_queries"] for r in summary["parts"]) <= summary["planned_queries"]
    html = (out / "report.html").read_text()
    assert "What the stolen copy enables" in html and "PGD at the paper" in html


@pytest.mark.slow
def test_data_free_attacker_is_a_row_of_the_extraction_table(tmp_path: Path) -> None:
    """The default data-free recipe (stealkit extract codfe, labelonly-v3) at the budget the plan leaves it, on
    label answers: its copy is a row beside the other attackers', its queries the ledger's."""
    from stealkit.victims import standard_victim
    from tests.audit_kit import run_audit_command

    victim = str(standard_victim("digits-conv2").path)
    out = tmp_path / "f"
    run_audit_command(victim=victim, answers="label", budgets="20", settings=TINY_KW,
                      out=str(out), max_queries=540, transfer_images=0, decision_images=0, datafree_budget=2000,
                      **NO_MORE_KW)
    summary = json.loads((out / "summary.json").read_text())
    (free,) = [r for r in summary["parts"] if r["part"]["kind"] == "datafree"]
    assert free["id"] == "datafree-label-500"  # 540 - 2 x 20: what the plan leaves, under the cap of 2,000
    own = json.loads((out / "parts" / free["id"] / "summary.json").read_text())
    config = json.loads((out / "parts" / free["id"] / "config.json").read_text())
    assert config["command"] == "extract codfe" and config["config"]["recipe"] == "labelonly-v3"
    assert free["total_queries"] == sum(own["queries"].values()) <= 500
    assert free["fidelity"] == own["fidelity"] is not None
    (row,) = [r for r in summary["headline"] if r["attacker"] == "data-free"]
    assert row["answers"] == "label" and row["fidelity @500"] == free["fidelity"]
    assert summary["queries"] <= 540
    assert "no data at all" in (out / "report.html").read_text()


def test_unknown_victim_and_too_small_a_budget_are_one_line_each(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "audit", "--victim", "standard:nope", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown standard victim" in err and len(err.splitlines()) == 1
    assert main(["-q", "audit", "--victim", VICTIM, "--max-queries", "10", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "too small for any part" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_plan_refuses_what_the_run_would_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--plan checks the query sources and the data set as the run reads them: one line, exit 2, nothing written."""
    for flag, value in (("--pool", "nosuchsource"), ("--unrelated", "nosuchsource"), ("--dataset", "nosuchset")):
        out = tmp_path / value
        assert main(["-q", *ARGS, flag, value, "--plan", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and value in err[0], err
        assert not out.exists()


def test_a_pool_smaller_than_a_rung_runs_at_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The digits attacker split holds 449 images: a rung of 1,000 for its attacker runs at 449 (one query is one
    distinct image), and the plan says so; the unrelated attacker's synthetic source keeps the rung."""
    args = ["-q", "audit", "--victim", VICTIM, "--answers", "label", "--budgets", "100,1000", *TINY, *NO_EXTRAS]
    assert main([*args, "--plan", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "extract-label-like-449 " in text and "extract-label-like-1000" not in text
    assert "extract-label-unrelated-1000 " in text
    assert "the query source pool holds 449 images" in text


def test_the_old_recipe_spelling_warns_and_means_the_same_settings(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from stealkit.audit.options import recipe_from_args

    old = ["--student=mlp2", "--student-arg=hidden=8", "--epochs=1", "--set=min_steps=0"]
    assert recipe_from_args(old) == TINY_KW
    out = tmp_path / "r"
    assert main(["-q", "audit", "--victim", VICTIM, "--answers", "label", "--budgets", "20",
                 *(f"--recipe={a}" for a in old), *NO_EXTRAS, "--plan", "--out", str(out)]) == 0
    assert "--recipe is deprecated" in capsys.readouterr().err
    with pytest.raises(InputError, match="the audit sets it"):
        from stealkit.audit.options import AuditOptions

        AuditOptions(victim="-", out="-", recipe={"mode": "label"}).check()
