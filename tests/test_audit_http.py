"""``stealkit audit`` over HTTP as a real client of ``stealkit serve``: its ledgers equal the server's count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stealkit.cli import main
from tests.audit_kit import part_id
from tests.test_serve_support import live_server, make_victim, write_keys

pytestmark = pytest.mark.slow

KEY = "audit-key-Zx81QpLw6RtV3mNb7Yc4"
TINY = ["--set", "student=mlp2", "--set", "student.hidden=8", "--set", "epochs=1", "--set", "min_steps=0"]
#: the same, as run_audit_command's settings
TINY_KW = {"student": "mlp2", "student.hidden": 8, "epochs": 1, "min_steps": 0}


def test_audit_over_http_reconciles_with_the_servers_charges(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "audit", "mode": "probs", "budget": 5000}])
    with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
        out = tmp_path / "a"
        assert main(["-q", "audit", "--victim", url, "--key", KEY, "--dataset", "digits", "--answers", "label",
                     "--budgets", "20", *TINY, "--transfer-images", "10", "--decision-images", "0",
                     "--decision-queries", "10", "--datafree-budget", "0", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rec = summary["reconciliation"]
    evaluation = summary["evaluation"]["queries"]["predict"]
    assert evaluation == 450  # the victim's labels of digits' 450 test images, bought once
    assert rec["equal"] is True and rec["server"]["predict"] == summary["queries"] + evaluation
    assert summary["queries"] > 40
    # fidelity is measured over HTTP (against the labels bought), never shown as "not reached" unmeasured
    extracted = [r for r in summary["parts"] if r["part"]["kind"] == "extract"]
    assert extracted and all(r["fidelity"] is not None for r in extracted)
    assert summary["victim_accuracy"] == summary["evaluation"]["victim_accuracy"]
    assert all(isinstance(r["Q90"], int) or r["Q90"].startswith("not reached within") for r in summary["headline"])
    text = capsys.readouterr().out
    assert "equal" in text and "evaluation: the test split labels" in text
    assert "Queries reconciled with the server" in (out / "report.html").read_text()


def test_probs_from_a_label_only_key_is_one_line_before_any_query(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = make_victim(tmp_path / "victim")
    label_key = "label-key-Zx81QpLw6RtV3mNb7Yc4"
    keys = write_keys(tmp_path / "keys.toml", [{"key": label_key, "name": "labels", "mode": "label"}])
    with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
        code = main(["-q", "audit", "--victim", url, "--key", label_key, "--dataset", "digits", "--answers", "probs",
                     "--budgets", "20", *TINY, "--transfer-images", "0", "--decision-images", "0",
                     "--datafree-budget", "0", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--answers probs" in err[0], err
    assert not (tmp_path / "p").exists()  # refused before the plan: nothing written, nothing queried


def test_a_server_that_stops_mid_audit_is_one_line_and_the_finished_parts_stay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import contextlib

    from stealkit.audit import execute as audit
    from stealkit.cli import main as cli_main

    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "audit", "mode": "probs", "budget": 5000}])
    stack = contextlib.ExitStack()
    url = stack.enter_context(live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log"))
    real = audit.run_part
    calls = []

    def stop_after_first(part, *a, **kw):  # the server goes away once the first part has finished
        if calls:
            stack.close()
        calls.append(part_id(part))
        return real(part, *a, **kw)

    out = tmp_path / "s"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(audit, "run_part", stop_after_first)
        code = cli_main(["-q", "audit", "--victim", url, "--key", KEY, "--dataset", "digits", "--answers", "label",
                         "--budgets", "20", *TINY, "--transfer-images", "0", "--decision-images", "0",
                         "--datafree-budget", "0", "--out", str(out)])
    stack.close()
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert code != 0 and len(err) == 1 and "error" in err[0], err
    assert [p.name for p in (out / "parts").glob("*.json")] == ["extract-label-like-20.json"]
    assert not (out / "summary.json").exists()


def test_audit_over_v2_reconciles_with_the_v2_servers_own_count(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``stealkit serve --protocol v2`` in a subprocess, the audit a v2 client (``v2+http://`` and ``--model``):
    the key's queries_used in the v2 model metadata over the audit equals the audit's ledgers."""
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "audit", "mode": "probs", "budget": 5000}])
    with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log",
                     extra=("--protocol", "v2", "--model-name", "digits")) as url:
        out = tmp_path / "v2"
        assert main(["-q", "audit", "--victim", "v2+" + url, "--model", "digits", "--key", KEY, "--dataset",
                     "digits", "--answers", "label,probs", "--budgets", "20", *TINY, "--transfer-images", "10",
                     "--decision-images", "0", "--decision-queries", "10", "--datafree-budget", "0",
                     "--out", str(out)]) == 0
        import httpx

        used = httpx.get(url + "/v1/charges", params={"limit": 1},
                         headers={"authorization": f"Bearer {KEY}"}).json()["queries_used"]
    summary = json.loads((out / "summary.json").read_text())
    rec = summary["reconciliation"]
    assert rec["source"].startswith("GET /v2/models/NAME:"), rec
    evaluation = summary["evaluation"]["queries"]["predict"]
    assert rec["equal"] is True and rec["server"]["predict"] == rec["audit"]["predict"] == summary["queries"] + evaluation
    assert used["predict"] == summary["queries"] + evaluation  # a fresh key: /v1/charges agrees with the v2 count
    assert "equal" in capsys.readouterr().out
    assert "queries_used of this key" in (out / "report.html").read_text()
