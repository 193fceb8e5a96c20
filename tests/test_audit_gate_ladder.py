"""A ``--fail-if`` gate that decides or says why not (issue 49): where the ladder leaves a gate open, the audit
extends it to the gate's decisive rung (N - 1 for ``q90<N``, N for ``q90>N``) within the pool and
``--max-queries``, one rung at a time, resumable; else exit 3 with one line that says where the ladder stops and
why. Tiny audits on the standard digits victim (an 8-unit MLP student, one epoch: it never reaches 90 %)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stealkit.audit.gates import extension_rungs, next_rungs
from stealkit.audit.parts import Part
from stealkit.cli import main
from tests.audit_kit import part_id, run_audit_command
from tests.test_audit import NO_EXTRAS, NO_EXTRAS_KW, ROOT, TINY, TINY_KW, VICTIM

#: a tiny audit of one answer kind, label (two cells: the attacker with data like the victim's, and unrelated)
BASE = ["-q", "audit", "--victim", VICTIM, "--answers", "label", *TINY, *NO_EXTRAS]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # standard victims are cached in runs/victims


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def _point(answers: str, budget: int, fidelity: float | None) -> dict[str, Any]:
    part = Part(answers, "like", "pool", budget)
    return {"part": part.as_dict(), "id": part_id(part), "total_queries": budget, "fidelity": fidelity}


def test_extension_rungs_double_to_the_decisive_rung_within_the_pool() -> None:
    assert extension_rungs([50], [999], None) == [100, 200, 400, 800, 999]
    assert extension_rungs([50], [999], 449) == [100, 200, 400, 449]  # the pool's 449 images: no rung above
    assert extension_rungs([50, 449], [999], 449) == []  # the pool's size is already a rung: nothing to add
    assert extension_rungs([50, 2000], [999], None) == [100, 200, 400, 800, 999]  # the gap below 2,000
    assert extension_rungs([50, 999], [999], None) == []  # the decisive rung is on the ladder
    assert extension_rungs([50], [99, 300], None) == [99, 100, 200, 300]  # each gate's decisive rung


def test_only_rungs_that_can_decide_an_open_gate_run() -> None:
    extension = [Part(a, "like", "pool", b) for b in (100, 200, 999) for a in ("label", "probs")]
    low = [_point("label", 50, 0.3), _point("probs", 50, 0.4)]
    ids = [part_id(p) for p in next_rungs(extension, low, ["q90<1000"])]
    assert ids == ["extract-label-like-100", "extract-probs-like-100"]  # both open: the next rung of each
    assert [part_id(p) for p in next_rungs(extension, low, ["probs:q90<1000"])] == ["extract-probs-like-100"]
    reached = [*low, _point("probs", 100, 0.95)]  # probs reach 90 % with 100 < 1,000: the gate fails, decided
    assert next_rungs(extension, reached, ["q90<1000"]) == []
    # q90>N: reached within N passes for that cell; the other cell is still open
    assert [part_id(p) for p in next_rungs(extension, reached, ["q90>999"])] == ["extract-label-like-100"]
    done = [*low, _point("label", 100, 0.3), _point("label", 200, 0.3), _point("label", 999, 0.5)]
    assert [part_id(p) for p in next_rungs(extension, done, ["label:q90<1000"])] == []  # measured at 999: pass
    assert next_rungs(extension, [_point("label", 50, None)], ["q90<1000"]) == []  # unmeasured: no rung helps


def test_plan_shows_the_extension_within_the_pool_and_the_cap(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--budgets", "50", "--fail-if", "q90<1000", "--plan", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "extension rungs for --fail-if" in text
    for b in (100, 200, 400, 449):  # doubling, then the digits pool's 449 images (below the decisive 999)
        assert f"+ extract-label-like-{b} " in text
    assert "extract-label-unrelated-100" not in text  # only the gated cells: the attacker with data like yours
    assert re.search(r"^total +1,249 ", text, re.M)  # 2 x 50 + 100 + 200 + 400 + 449: the most it can spend
    assert "stops at 449, below 999 (the query source pool holds 449 images" in text
    assert main([*BASE, "--budgets", "50", "--fail-if", "q90<1000", "--max-queries", "400", "--plan",
                 "--out", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "+ extract-label-like-200 " in text and "extract-label-like-400" not in text  # 100 + 200 + 100 <= 400
    assert "stops at 200, below 999 (--max-queries 400 leaves 0 queries, not the next rung's 400" in text
    assert main([*BASE, "--budgets", "50", "--fail-if", "q90<50", "--plan", "--out", str(tmp_path / "c")]) == 0
    assert "+ extract-label-like-49 " in capsys.readouterr().out  # the rung that decides q90<50 lies below 50


def test_a_gate_above_the_ladder_is_decided_by_the_extension(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a"
    # not 0 by default: the ladder stops at 20, unreached; rungs 40, 80 and 99 decide q90<100 as measured
    code = main([*BASE, "--budgets", "20", "--fail-if", "q90<100", "--out", str(out)])
    err = capsys.readouterr().err
    summary = _summary(out)
    ran = summary["extension"]["ran"]
    assert ran == ["extract-label-like-40", "extract-label-like-80", "extract-label-like-99"]
    parts = {r["id"]: r for r in summary["parts"]}
    fid = {b: parts[f"extract-label-like-{b}"]["fidelity"] for b in (20, 40, 80, 99)}
    reached = [b for b, f in fid.items() if f >= 0.9]
    assert code == (1 if reached else 0), (fid, err)  # what was measured decides, nothing else
    assert ("passed (measured)" in err) == (code == 0)
    for b in (40, 80, 99):  # each rung's queries come from its ledger
        assert parts[f"extract-label-like-{b}"]["total_queries"] == b
    assert summary["queries"] == sum(r["total_queries"] for r in summary["parts"]) == 2 * 20 + 40 + 80 + 99
    assert "fidelity @99" in summary["headline"][0]


@pytest.mark.slow
def test_q90_above_n_fails_when_the_extension_does_not_reach_it(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*BASE, "--budgets", "20", "--fail-if", "q90>60", "--out", str(tmp_path / "a")])
    summary = _summary(tmp_path / "a")
    fid = {r["part"]["budget"]: r["fidelity"] for r in summary["parts"] if r["part"]["attacker"] == "like"}
    assert sorted(fid) == [20, 40, 60]
    assert code == (0 if max(fid.values()) >= 0.9 else 1), fid  # 60 queries, unreached: Q90 > 60, it fails
    assert "--fail-if q90>60" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cap_too_small_for_the_decisive_rung_exits_3_with_the_reason(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a"
    assert main([*BASE, "--budgets", "20", "--fail-if", "q90<1000", "--max-queries", "160", "--out", str(out)]) == 3
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("--fail-if")]
    assert lines == ["--fail-if q90<1000: cannot decide: label answers: not reached within 80 queries; the ladder "
                     "stops at 80, below 999 (--max-queries 160 leaves 0 queries, not the next rung's 160; raise "
                     "--max-queries)"]
    summary = _summary(out)
    assert summary["extension"]["ran"] == ["extract-label-like-40", "extract-label-like-80"]
    assert summary["queries"] == sum(r["total_queries"] for r in summary["parts"]) == 160  # the cap, exactly


@pytest.mark.slow
def test_a_stopped_extension_resumes_without_paying_a_finished_rung_twice(tmp_path: Path) -> None:
    out = tmp_path / "a"
    kw: dict[str, Any] = {"victim": VICTIM, "out": str(out), "answers": "label", "budgets": "20",
                          "settings": TINY_KW, **NO_EXTRAS_KW, "fail_if": ["q90<100"]}

    class Stop(Exception):
        pass

    def stop_after_first_rung(part: Part, _result: dict[str, Any]) -> None:
        if part.budget == 40:
            raise Stop

    with pytest.raises(Stop):
        run_audit_command(on_part=stop_after_first_rung, **kw)
    first = out / "parts" / "extract-label-like-40.json"
    stamp, paid = first.stat().st_mtime_ns, json.loads(first.read_text())["total_queries"]
    assert paid == 40 and not (out / "summary.json").exists()
    seen: list[str] = []
    run_audit_command(on_part=lambda part, _r: seen.append(part_id(part)), **kw)
    assert seen == ["extract-label-like-80", "extract-label-like-99"]  # the finished rung is read back
    assert first.stat().st_mtime_ns == stamp
    summary = _summary(out)
    records = [json.loads(line)["id"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(records) == sorted(r["id"] for r in summary["parts"])  # each part recorded (paid) once
    assert summary["queries"] == 2 * 20 + 40 + 80 + 99


@pytest.mark.slow
def test_a_gate_the_ladder_decides_adds_no_rung(tmp_path: Path) -> None:
    out = tmp_path / "a"
    assert run_audit_command(victim=VICTIM, out=str(out), answers="label", budgets="20", settings=TINY_KW,
                             **NO_EXTRAS_KW, fail_if=["q90<10"]) == []
    summary = _summary(out)  # not reached within 20 >= 9: decided by the ladder; the planned rung 9 never ran
    assert summary["extension"] == {"planned": ["extract-label-like-9"], "ran": [], "stops": {}}
    assert summary["queries"] == 40


def test_the_spread_over_seeds_compares_the_rungs_every_seed_has() -> None:
    from stealkit.audit.copies import seed_spread

    def at(seed: int, budget: int, fidelity: float) -> dict[str, Any]:
        return {**_point("label", budget, fidelity), "part": {**Part("label", "like", "pool", budget).as_dict(),
                                                              "seed_offset": seed}}

    # the audit's seed has an extension rung (100, reached); the repeat has the ladder's 50 only
    rows = seed_spread([at(0, 50, 0.5), at(0, 100, 0.95), at(1, 50, 0.6)])
    assert rows[0]["Q90 per seed"] == "–, –" and rows[0]["Q90 median"] == "not reached within 50"


def test_a_gate_on_an_answer_kind_not_audited_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--fail-if", "probs:q90<100", "--plan", "--out", str(tmp_path / "a")]) == 2
    assert "--fail-if probs:q90<100: probs answers are not audited (--answers label)" in capsys.readouterr().err
    assert main([*BASE, "--fail-if", "q90<1", "--plan", "--out", str(tmp_path / "a")]) == 2  # fewer than 1: none
    assert main([*BASE, "--fail-if", "q90>=5", "--plan", "--out", str(tmp_path / "a")]) == 2


@pytest.mark.slow
def test_over_http_the_extension_is_decided_and_reconciled_with_the_server(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_serve_support import live_server, make_victim, write_keys

    key = "gate-key-Qw81ZpLx6RtV3mNb7Yc4"
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": key, "name": "gate", "mode": "probs", "budget": 5000}])
    out = tmp_path / "a"
    with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
        code = main(["-q", "audit", "--victim", url, "--key", key, "--dataset", "digits", "--answers", "label",
                     "--budgets", "20", *TINY, "--transfer-images", "0", "--decision-images", "0",
                     "--datafree-budget", "0", "--fail-if", "q90<60", "--out", str(out)])
    summary = _summary(out)
    fid = {r["part"]["budget"]: r["fidelity"] for r in summary["parts"] if r["part"]["attacker"] == "like"}
    assert summary["extension"]["ran"] == ["extract-label-like-40", "extract-label-like-59"][:len(fid) - 1]
    assert code == (1 if max(fid.values()) >= 0.9 else 0), (fid, capsys.readouterr().err)  # measured over HTTP
    rec = summary["reconciliation"]
    assert rec["equal"] is True  # the server counted the extension's queries as the ledgers did
    assert rec["server"]["predict"] == summary["queries"] + summary["evaluation"]["queries"]["predict"]
    assert summary["queries"] == 2 * 20 + sum(b for b in fid if b > 20)
