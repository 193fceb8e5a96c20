"""An audit SIGKILLed in the middle of a part and started again (issue 39's "Must show": resume).

The audit runs in a subprocess against ``stealkit serve`` (so the server counts every query, also those of the
killed attempt), is killed with SIGKILL once the third part's queries have reached the server and before that
part has finished, then the same command runs again. The ledgers' total is the planned total exactly; the two
finished parts are read back, not run again; the killed part, run again from its start, is given back the
answers its killed attempt had paid for (its answer journal) rather than asking the server again; so the
server's own count over the audit is the planned total too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.audit_kit import kill_when
from tests.test_serve_support import ROOT, live_server, make_victim, write_keys

pytestmark = pytest.mark.slow

KEY = "resume-key-Zx81QpLw6RtV3mNb7Yc4"
FIRST_TWO = ["extract-label-like-20", "extract-label-unrelated-20"]
#: the evaluation queries: the victim's labels of digits' 450 test images, bought once before the parts
EVALUATION = 450


def used(url: str) -> int:
    r = httpx.get(url + "/v1/charges", params={"limit": 1}, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    return int(r.json()["queries_used"]["predict"])


def audit(url: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    # the probability parts train the default recipe's 3,000 steps (a few seconds): time to be killed midway
    cmd = [sys.executable, "-m", "stealkit.cli", "-q", "audit", "--victim", url, "--key", KEY, "--dataset",
           "digits", "--answers", "label,probs", "--budgets", "20", "--set", "student=mlp2",
           "--set", "student.hidden=8", "--transfer-images", "0", "--decision-images", "0",
           "--datafree-budget", "0", "--out", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


def test_an_audit_killed_mid_part_and_restarted_spends_the_planned_total(tmp_path: Path) -> None:
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "audit", "mode": "probs", "budget": 5000}])
    out, log = tmp_path / "audit", tmp_path / "audit.log"
    with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
        start = used(url)
        proc = audit(url, out, log)

        def third_part_midway() -> bool:  # answered by the server but not finished
            done = sorted(p.stem for p in (out / "parts").glob("*.json")) if (out / "parts").exists() else []
            journal = out / "parts" / "extract-probs-like-20.answers"
            kept = journal.exists() and journal.stat().st_size > 0
            if done == FIRST_TWO and used(url) - start > EVALUATION + 40 and kept:  # answered and kept by the client: an
                return True  # answer the server counted but the client had not yet kept would be asked again
            assert len(done) <= 2, f"the third part finished before it could be killed: {done}"
            return False

        kill_when(proc, third_part_midway, log)
        assert proc.returncode == -signal.SIGKILL
        done = sorted(p.stem for p in (out / "parts").glob("*.json"))
        assert done == FIRST_TWO and not (out / "summary.json").exists()  # killed mid-part, not between parts
        stamps = {p: (out / "parts" / f"{p}.json").stat().st_mtime_ns for p in FIRST_TWO}
        ledgers_before_kill = sum(json.loads((out / "parts" / f"{p}.json").read_text())["total_queries"]
                                  for p in FIRST_TWO)
        stopped = used(url) - start - EVALUATION - ledgers_before_kill  # spent by the killed part before the kill
        assert ledgers_before_kill == 40 and 0 < stopped <= 20
        assert (out / "parts" / "extract-probs-like-20.answers").stat().st_size > 0, "the killed part kept no answer"

        first_lines = log.read_text()
        again = audit(url, out, log)
        assert again.wait() == 0, log.read_text()[-3000:]
        server = used(url) - start
    second = log.read_text()[len(first_lines):]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queries"] == summary["planned_queries"] == 80  # the ledgers' total is the planned total
    assert {p: (out / "parts" / f"{p}.json").stat().st_mtime_ns for p in FIRST_TWO} == stamps  # not run again
    assert second.count("(done: resumed)") == 2 and "[1/4]" not in second and "[2/4]" not in second
    assert "[3/4] extract-probs-like-20" in second and "[4/4] extract-probs-unrelated-20" in second
    records = [json.loads(line)["id"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(records) == sorted(r["id"] for r in summary["parts"])  # each part recorded once
    rerun = next(r for r in summary["parts"] if r["id"] == "extract-probs-like-20")
    assert rerun["replayed"] == stopped and rerun["total_queries"] == 20  # its answers came back from the journal
    rec = summary["reconciliation"]
    assert server - EVALUATION == summary["queries"] == 80  # the server answered each planned query once
    assert summary["evaluation"]["queries"] == {"predict": EVALUATION, "explain": 0}  # bought once, not twice
    assert rec["equal"] is True and rec["stopped"] is None and rec["replayed"] == stopped
    print(f"\n--- killed attempt ---\n{first_lines}--- restart ---\n{second}"
          f"server {server} = ledgers {summary['queries']} (the killed part's {stopped} answers replayed)")
