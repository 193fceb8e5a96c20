"""Issue 51 item 6: the failed-key throttle is shared by the workers and survives a restart, with an expiry.

Two :class:`SharedAuthThrottle` objects on one SQLite file stand for two workers (or a worker and its restart);
the wall clock is the test's."""

from __future__ import annotations

import sqlite3

from stealkit.serve.authshare import KNOWN_TTL_S, SharedAuthThrottle
from stealkit.serve.limits import AuthThrottle

GUESSER, TENANT_ADDRESS = "203.0.113.9", "198.51.100.7"


def test_failures_on_one_worker_throttle_the_others_and_a_restart(tmp_path):
    now = [1_000_000.0]
    db = tmp_path / "db.sqlite"
    one, two = (SharedAuthThrottle(db, rate=1.0, burst=20.0, clock=lambda: now[0]) for _ in range(2))
    for _ in range(20):  # the whole allowance, spent on one worker
        assert one.blocked_for(GUESSER) == 0
        one.failed(GUESSER)
    one.flush()
    assert one.blocked_for(GUESSER) > 0
    assert two.blocked_for(GUESSER) > 0  # the other worker has seen no failure, and still throttles it
    assert SharedAuthThrottle(db, clock=lambda: now[0]).blocked_for(GUESSER) > 0  # nor does a restart forget it
    assert two.blocked_for("203.0.113.10") == 0  # another address is not touched
    local = AuthThrottle(rate=1.0, burst=20.0)  # what a worker's memory alone knows
    assert local.blocked_for(GUESSER) == 0


def test_a_known_tenant_stays_admitted_across_workers_and_restarts(tmp_path):
    now = [1_000_000.0]
    db = tmp_path / "db.sqlite"
    one = SharedAuthThrottle(db, clock=lambda: now[0])
    one.remember(TENANT_ADDRESS, "alice")
    one.flush()
    later = SharedAuthThrottle(db, clock=lambda: now[0])  # another worker, or the server after a restart
    assert later.known(TENANT_ADDRESS, "alice") and not later.known(TENANT_ADDRESS, "mallory")
    now[0] += KNOWN_TTL_S + 1
    assert not later.known(TENANT_ADDRESS, "alice")  # expired


def test_rows_expire_once_the_bucket_has_refilled(tmp_path):
    now = [1_000_000.0]
    db = tmp_path / "db.sqlite"
    throttle = SharedAuthThrottle(db, rate=1.0, burst=20.0, clock=lambda: now[0])
    for _ in range(25):
        throttle.failed(GUESSER)
    throttle.flush()
    restarted = SharedAuthThrottle(db, rate=1.0, burst=20.0, clock=lambda: now[0])
    assert restarted.blocked_for(GUESSER) > 0
    now[0] += 30  # 20 tokens back at 1 per second, and then some
    assert restarted.blocked_for(GUESSER) == 0
    restarted.failed("203.0.113.77")  # the next write deletes what has expired
    restarted.flush()
    rows = sqlite3.connect(db).execute("SELECT client FROM auth_failures").fetchall()
    assert rows == [("203.0.113.77",)]
