"""The server's durable state: SQLite in WAL mode holding keys (hashed), budget counters and the query log.

Invariant (checked by :meth:`Store.audit`): for every key and kind, the counter equals the sum of ``n`` over
that key's log rows. It holds across threads, worker processes and crashes because a charge is one
transaction: ``BEGIN IMMEDIATE`` (takes the database's write lock), a conditional ``UPDATE`` that adds ``n``
only if the budget allows it, the ``INSERT`` of the log row, ``COMMIT``. The server computes the answer first
and charges it just before sending it, so an answer is never sent without its log row, and a request that is
refused or fails costs nothing. A crash between the commit and the send leaves a logged, charged answer the
client never received (the log records what was served, not what was delivered).

WAL with ``synchronous=NORMAL`` keeps every committed transaction across a killed process (SIGKILL); only an
operating-system crash or power loss can lose the last commits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.errors import BudgetExhausted, InputError
from stealkit.serve.keys import KeyConfig

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    budget INTEGER,
    explain_budget INTEGER,
    predict_used INTEGER NOT NULL DEFAULT 0,
    explain_used INTEGER NOT NULL DEFAULT 0,
    flagged INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS query_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key_hash TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    n INTEGER NOT NULL,
    mode TEXT NOT NULL,
    input_digest TEXT NOT NULL,
    output_digest TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS query_log_key ON query_log (key_hash);
CREATE TRIGGER IF NOT EXISTS query_log_append_only_update BEFORE UPDATE ON query_log
BEGIN SELECT RAISE(ABORT, 'query_log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS query_log_append_only_delete BEFORE DELETE ON query_log
BEGIN SELECT RAISE(ABORT, 'query_log is append-only'); END;
"""

_USED = {"predict": "predict_used", "explain": "explain_used"}


@dataclass(frozen=True)
class Usage:
    """A key's counters and what is left (``None``: unlimited)."""

    predict: int
    explain: int
    left: int | None
    explain_left: int | None
    flagged: bool

    def as_dict(self) -> dict[str, int]:
        return {"predict": self.predict, "explain": self.explain}


class Store:
    """Thread-safe access to the SQLite file: one connection per thread, every write under ``BEGIN IMMEDIATE``."""

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"--db {self.path} is not a file; give a path like runs/serve/queries.sqlite")
        if not self.path.parent.exists():
            raise InputError(f"the directory of --db {self.path} does not exist; create it first")
        self.timeout = timeout
        self._local = threading.local()
        try:
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"--db {self.path} is not a usable SQLite database: {exc}") from None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- keys ------------------------------------------------------------------------------------------
    def sync_keys(self, keys: Iterable[KeyConfig]) -> None:
        """Insert new keys and update names/budgets of known ones; counters are never reset."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for k in keys:
                conn.execute(
                    "INSERT INTO keys (key_hash, name, budget, explain_budget, created) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(key_hash) DO UPDATE SET name=excluded.name, budget=excluded.budget, "
                    "explain_budget=excluded.explain_budget",
                    (k.key_hash, k.name, k.budget, k.explain_budget, time.time()),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def usage(self, key_hash: str) -> Usage:
        row = self._conn().execute(
            "SELECT predict_used, explain_used, budget, explain_budget, flagged FROM keys WHERE key_hash=?",
            (key_hash,),
        ).fetchone()
        if row is None:
            raise KeyError(key_hash)
        return _usage(row)

    def set_flagged(self, key_hash: str, flagged: bool = True) -> None:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE keys SET flagged=? WHERE key_hash=?", (int(flagged), key_hash))
        conn.execute("COMMIT")

    def all_usage(self) -> dict[str, tuple[str, Usage]]:
        """``{key_hash: (name, usage)}`` for every key (for /metrics)."""
        rows = self._conn().execute(
            "SELECT key_hash, name, predict_used, explain_used, budget, explain_budget, flagged FROM keys"
        ).fetchall()
        return {r[0]: (r[1], _usage(r[2:])) for r in rows}

    # -- charging --------------------------------------------------------------------------------------
    def charge(self, key_hash: str, kind: str, n: int, *, mode: str, input_digest: str,
               output_digest: str) -> Usage:
        """Atomically add ``n`` to the key's ``kind`` counter and append the log row, or raise
        :class:`BudgetExhausted` having changed nothing. Returns the usage after the charge."""
        col = _USED[kind]
        extra = " AND (explain_budget IS NULL OR explain_used + :n <= explain_budget)" if kind == "explain" else ""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                f"UPDATE keys SET {col} = {col} + :n WHERE key_hash = :h "  # noqa: S608 - col from a fixed map
                f"AND (budget IS NULL OR predict_used + explain_used + :n <= budget){extra}",
                {"n": n, "h": key_hash},
            )
            if cur.rowcount != 1:
                row = conn.execute(
                    "SELECT predict_used, explain_used, budget, explain_budget, flagged FROM keys WHERE key_hash=?",
                    (key_hash,),
                ).fetchone()
                conn.execute("ROLLBACK")
                usage = _usage(row)
                left = usage.explain_left if kind == "explain" and usage.explain_left is not None else usage.left
                if kind == "explain" and usage.left is not None and usage.explain_left is not None:
                    left = min(usage.left, usage.explain_left)
                raise BudgetExhausted(
                    f"query budget exhausted: this request needs {n} {kind} queries but only {left} remain; "
                    "send a smaller batch or ask for a larger budget",
                    requested=n, remaining=int(left or 0), kind=kind,
                )
            conn.execute(
                "INSERT INTO query_log (key_hash, time, kind, n, mode, input_digest, output_digest) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key_hash, time.time(), kind, n, mode, input_digest, output_digest),
            )
            row = conn.execute(
                "SELECT predict_used, explain_used, budget, explain_budget, flagged FROM keys WHERE key_hash=?",
                (key_hash,),
            ).fetchone()
            conn.execute("COMMIT")
        except BudgetExhausted:
            raise
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return _usage(row)

    # -- auditing --------------------------------------------------------------------------------------
    def log_rows(self, key_hash: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, key_hash, time, kind, n, mode, input_digest, output_digest FROM query_log"
        args: tuple[Any, ...] = ()
        if key_hash is not None:
            sql += " WHERE key_hash=?"
            args = (key_hash,)
        cols = ("id", "key_hash", "time", "kind", "n", "mode", "input_digest", "output_digest")
        return [dict(zip(cols, r, strict=True)) for r in self._conn().execute(sql + " ORDER BY id", args)]

    def audit(self) -> dict[str, dict[str, Any]]:
        """Per key: counters, the log's sums and whether they agree (they always should)."""
        conn = self._conn()
        out: dict[str, dict[str, Any]] = {}
        for h, name, pu, eu in conn.execute("SELECT key_hash, name, predict_used, explain_used FROM keys"):
            sums = dict(conn.execute(
                "SELECT kind, COALESCE(SUM(n), 0) FROM query_log WHERE key_hash=? GROUP BY kind", (h,)
            ).fetchall())
            lp, le = int(sums.get("predict", 0)), int(sums.get("explain", 0))
            out[name] = {"predict_used": pu, "explain_used": eu, "log_predict": lp, "log_explain": le,
                         "consistent": pu == lp and eu == le}
        return out


def _usage(row: Any) -> Usage:
    pu, eu, budget, ebudget, flagged = row
    left = None if budget is None else max(0, budget - pu - eu)
    eleft = None if ebudget is None else max(0, ebudget - eu)
    return Usage(predict=int(pu), explain=int(eu), left=left, explain_left=eleft, flagged=bool(flagged))
