"""Issue 18, item 3: SIGKILL of the ``--workers N`` supervisor takes its workers with it, and a restart on the
same port comes up with counters equal to the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from stealkit.serve.store import Store
from tests.test_serve_support import free_port, make_victim, start_server, stop_server, write_keys

KEY = "super-Zx81QpLw6RtV3mNb7Yc4"
AUTH = {"Authorization": f"Bearer {KEY}"}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not count)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def worker_pids(url: str, n: int) -> set[int]:
    pids: set[int] = set()
    for _ in range(50 * n):
        pids.add(httpx.get(url + "/healthz", timeout=5).json()["pid"])
        if len(pids) == n:
            break
    return pids


@pytest.mark.slow
def test_supervisor_sigkill_takes_the_workers_and_the_restart_comes_up(tmp_path: Path):
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "tenant", "mode": "probs", "budget": 1000}])
    db, port = tmp_path / "db.sqlite", free_port()
    proc, url = start_server(victim, keys, db, workers=2, port=port)
    try:
        workers = worker_pids(url, 2)
        assert len(workers) == 2 and proc.pid not in workers
        for _ in range(5):
            r = httpx.post(url + "/v1/predict", json={"inputs": np.zeros((2, 1, 8, 8)).tolist()}, headers=AUTH)
            assert r.status_code == 200
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor only, not its process group
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        gone_after = 30 - (deadline - time.monotonic())
        assert not any(alive(p) for p in workers), "workers outlived their supervisor"
        print(f"workers {sorted(workers)} exited {gone_after:.1f} s after the supervisor was killed")
    finally:
        stop_server(proc)
        for p in workers:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    proc, url = start_server(victim, keys, db, workers=2, port=port)  # same port: no "Address already in use"
    try:
        info = httpx.get(url + "/v1/info", headers=AUTH).json()
        audit = Store(db).audit()["tenant"]
        assert audit["consistent"] and info["queries_used"]["predict"] == audit["log_predict"] == 10
        print(f"restarted on port {port}: queries_used {info['queries_used']}, audit {audit}")
    finally:
        stop_server(proc)


PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(600)
"""
CHILD = """
import os, time
parent = os.getppid()
from stealkit.serve.lifeline import exit_with_parent
exit_with_parent(parent, poll_s=0.1)
print("armed", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_worker_exits_when_its_parent_is_killed():
    """The mechanism alone (fast): a process under :func:`exit_with_parent` outlives a SIGKILLed parent by
    well under a second."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "armed"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.stdout.close()
        if alive(child):
            os.kill(child, signal.SIGKILL)
