"""The failed-key throttle shared by every worker and kept across restarts, in the server's SQLite file.

:class:`~stealkit.serve.limits.AuthThrottle` lives in one worker's memory: with two workers a guesser gets two
allowances, and a restart forgets both the guesser and the tenants known at its address. :class:`SharedAuthThrottle`
keeps each address's failure bucket (tokens, last update, on the wall clock) and the keys that authenticated from
it in two tables of the ``--db`` file. Rows expire: a bucket that has refilled completely, or a known key not seen
for :data:`KNOWN_TTL_S`, is deleted by the next write.

Reads (is this address throttled? is this key known there?) are one primary-key lookup each (WAL readers never
wait for writers). Writes (a failure, a newly known key) go to one background thread, so the event loop never
waits for the database's write lock; the worker's own in-memory throttle is updated at once, so a burst of
guesses against one worker is throttled before its writes land.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stealkit.serve.limits import AuthThrottle
from stealkit.serve.store import write_transaction

#: seconds a key that authenticated from an address stays admitted there while the address is throttled
KNOWN_TTL_S = 7 * 24 * 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS auth_failures (client TEXT PRIMARY KEY, tokens REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS auth_failures_updated ON auth_failures (updated);
CREATE TABLE IF NOT EXISTS auth_known (client TEXT NOT NULL, key_id TEXT NOT NULL, updated REAL NOT NULL,
                                       PRIMARY KEY (client, key_id));
CREATE INDEX IF NOT EXISTS auth_known_updated ON auth_known (updated);
"""


class SharedAuthThrottle(AuthThrottle):
    """An :class:`AuthThrottle` whose state is also kept in the SQLite file at ``db`` (see the module docstring);
    ``clock``: wall-clock seconds (tests move it)."""

    def __init__(self, db: str | Path, rate: float = 1.0, burst: float = 20.0, *,
                 clock: Callable[[], float] = time.time, timeout: float = 30.0) -> None:
        super().__init__(rate=rate, burst=burst)
        self.db, self.clock, self.timeout = Path(db), clock, timeout
        self._local = threading.local()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stealkit-authshare")
        self._conn().executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.db, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def _shared_tokens(self, client: str, now: float) -> float:
        row = self._conn().execute("SELECT tokens, updated FROM auth_failures WHERE client = ?", (client,)).fetchone()
        if row is None:
            return self.burst
        return min(self.burst, row[0] + max(0.0, now - row[1]) * self.rate)

    def blocked_for(self, client: str) -> float:
        local = super().blocked_for(client)
        try:
            tokens = self._shared_tokens(client, self.clock())
        except sqlite3.Error:  # the database is busy or gone: the worker's own throttle still holds
            return local
        shared = 0.0 if tokens >= 1 else (1 - tokens) / max(self.rate, 1e-9)
        return max(local, shared)

    def failed(self, client: str) -> None:
        super().failed(client)
        self._writer.submit(self._record_failure, client, self.clock())

    def _record_failure(self, client: str, now: float) -> None:
        with contextlib.suppress(sqlite3.Error), self._transaction() as conn:
            tokens = self._shared_tokens(client, now) - 1
            conn.execute("INSERT INTO auth_failures (client, tokens, updated) VALUES (?, ?, ?) ON CONFLICT (client) "
                         "DO UPDATE SET tokens = excluded.tokens, updated = excluded.updated", (client, tokens, now))
            full = self.burst / max(self.rate, 1e-9)  # a bucket untouched this long has refilled: forget it
            conn.execute("DELETE FROM auth_failures WHERE updated < ?", (now - full - 1,))

    def remember(self, client: str, key_id: str) -> None:
        fresh = not super().known(client, key_id)
        super().remember(client, key_id)
        if fresh:  # one write per worker, address and key (and again after the worker forgets it)
            self._writer.submit(self._record_known, client, key_id, self.clock())

    def _record_known(self, client: str, key_id: str, now: float) -> None:
        with contextlib.suppress(sqlite3.Error), self._transaction() as conn:
            conn.execute("INSERT INTO auth_known (client, key_id, updated) VALUES (?, ?, ?) ON CONFLICT "
                         "(client, key_id) DO UPDATE SET updated = excluded.updated", (client, key_id, now))
            conn.execute("DELETE FROM auth_known WHERE updated < ?", (now - KNOWN_TTL_S,))

    def known(self, client: str, key_id: str) -> bool:
        if super().known(client, key_id):
            return True
        try:
            row = self._conn().execute("SELECT updated FROM auth_known WHERE client = ? AND key_id = ?",
                                       (client, key_id)).fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row[0] >= self.clock() - KNOWN_TTL_S

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self._conn())

    def flush(self) -> None:
        """Wait until every write submitted so far has landed (tests, shutdown)."""
        self._writer.submit(lambda: None).result()
