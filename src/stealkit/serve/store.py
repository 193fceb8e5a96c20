"""The server's durable state: SQLite in WAL mode holding keys (by stable id), budget counters and the query log.

A query's life is a reservation that is settled once (:meth:`Store.reserve`, then :meth:`Store.settle` or
:meth:`Store.refund`):

1. **reserve** before any model work: ``BEGIN IMMEDIATE`` (the database's write lock), the key's counters are
   read into a :class:`~stealkit.oracle.QueryLedger`, which charges ``n`` or refuses (the one budget rule),
   the new counters are written and a ``reserved`` log row appended, ``COMMIT``;
2. **settle** after the answer is computed, encoded *and handed to the client's connection*: the row becomes
   ``answered`` with its output digest (and, with an idempotency key, the encoded answer is kept for replays);
3. **refund** if the answer cannot be produced or delivered: the counters go back and the row becomes
   ``refunded`` with the reason.

Invariant (checked by :meth:`Store.audit`): for every key and kind, the counter equals the sum of ``n`` over
that key's rows that are not ``refunded``. The log is append-only except for that one settling update (a
trigger enforces it). A crash leaves ``reserved`` rows for requests that were in flight: none of them was
settled, so :meth:`Store.recover` refunds them at the next start (an answer sent in the instant before the
crash is then free to the client: the error falls on the server's side, never the client's).

WAL with ``synchronous=NORMAL`` keeps every committed transaction across a killed process (SIGKILL); only an
operating-system crash or power loss can lose the last commits. The file is created readable by its owner only.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.oracle.ledger import QueryLedger, budget_left
from stealkit.serve.keys import KeyConfig

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key_id TEXT PRIMARY KEY,
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
    key_id TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    n INTEGER NOT NULL,
    mode TEXT NOT NULL,
    input_digest TEXT NOT NULL,
    output_digest TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'answered',
    request_id TEXT,
    note TEXT,
    fingerprint TEXT,
    seq INTEGER
);
CREATE INDEX IF NOT EXISTS query_log_key ON query_log (key_id);
CREATE TABLE IF NOT EXISTS answers (
    key_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    time REAL NOT NULL,
    media_type TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (key_id, request_id)
);
"""
# created after migrating older files (their columns are renamed/added first), one statement each
TRIGGERS = (
    "CREATE INDEX IF NOT EXISTS query_log_request ON query_log (key_id, request_id)",
    "CREATE INDEX IF NOT EXISTS query_log_seq ON query_log (key_id, seq)",
    "CREATE TRIGGER IF NOT EXISTS query_log_settle_once BEFORE UPDATE ON query_log "
    "WHEN OLD.status != 'reserved' OR NEW.status NOT IN ('answered', 'refunded') OR NEW.n != OLD.n "
    "OR NEW.key_id != OLD.key_id OR NEW.kind != OLD.kind OR NEW.time != OLD.time "
    "OR NEW.input_digest != OLD.input_digest OR NEW.request_id IS NOT OLD.request_id OR NEW.seq IS NOT OLD.seq "
    "BEGIN SELECT RAISE(ABORT, 'query_log is append-only (a reservation is settled once)'); END",
    "CREATE TRIGGER IF NOT EXISTS query_log_append_only_delete BEFORE DELETE ON query_log "
    "BEGIN SELECT RAISE(ABORT, 'query_log is append-only'); END",
)
LOG_COLUMNS = ("id", "key_id", "time", "kind", "n", "mode", "input_digest", "output_digest", "status",
               "request_id", "note", "fingerprint", "seq")
#: how long an answer kept for idempotent replays is stored
ANSWER_RETENTION_S = 24 * 3600.0
_USED = {"predict": "predict_used", "explain": "explain_used"}
_COUNTERS = "SELECT predict_used, explain_used, budget, explain_budget, flagged FROM keys WHERE key_id=?"


@dataclass(frozen=True)
class Usage:
    """A key's counters and what is left (``None``: unlimited), as the budget rule computes it."""

    predict: int
    explain: int
    budget: int | None
    explain_budget: int | None
    flagged: bool

    @property
    def left(self) -> int | None:
        """Queries of any kind still allowed."""
        return self.remaining("predict")

    @property
    def explain_left(self) -> int | None:
        """Explanation queries still allowed (the smaller of the total and the explanation budget)."""
        return self.remaining("explain")

    def remaining(self, kind: str) -> int | None:
        return budget_left(self.as_dict(), self.budget, {"explain": self.explain_budget}, kind)

    def ledger(self) -> QueryLedger:
        """A ledger holding these counters and budgets (it decides whether a charge fits)."""
        ledger = QueryLedger(budget=self.budget,
                             budgets={} if self.explain_budget is None else {"explain": self.explain_budget})
        ledger.load_state_dict({"counts": self.as_dict()})
        return ledger

    def as_dict(self) -> dict[str, int]:
        return {"predict": self.predict, "explain": self.explain}


@dataclass(frozen=True)
class Reservation:
    """A charge taken before the model work: the log row to settle and the usage after the charge."""

    row_id: int
    usage: Usage


@dataclass(frozen=True)
class Replay:
    """An answer already delivered for this idempotency key: returned again, not charged again."""

    media_type: str
    headers: str
    body: bytes


class InFlight(Exception):
    """A request with this idempotency key is being answered right now."""


class IdempotencyMismatch(InputError):
    """An idempotency key already used for a request that differs in something that shapes the answer."""


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``conn`` (opened with ``isolation_level=None``) holding the database's write lock:
    ``BEGIN IMMEDIATE``, then ``COMMIT``, or ``ROLLBACK`` if the body raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Store:
    """Thread-safe access to the SQLite file: one connection per thread, every write under ``BEGIN IMMEDIATE``."""

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"--db {self.path} is not a file; give a path like runs/serve/queries.sqlite")
        if not self.path.parent.exists():
            raise InputError(f"the directory of --db {self.path} does not exist; create it first")
        if not self.path.exists():
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        self.timeout = timeout
        self._local = threading.local()
        try:
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            with self._write() as c:
                _migrate(c)
            conn.executescript(SCHEMA)
            with self._write() as c:
                _create_triggers(c)
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

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One write transaction holding the database's write lock; rolled back if the body raises."""
        return write_transaction(self._conn())

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- keys ------------------------------------------------------------------------------------------
    def sync_keys(self, keys: Iterable[KeyConfig]) -> None:
        """Insert new keys and update names/budgets of known ones; counters are never reset. A key that an
        older database knew by the hash of its secret takes over that row (and its log) under its id."""
        with self._write() as conn:
            for k in keys:
                if k.legacy_id and conn.execute("SELECT 1 FROM keys WHERE key_id=?", (k.key_id,)).fetchone() is None \
                        and conn.execute("UPDATE keys SET key_id=? WHERE key_id=?", (k.key_id, k.legacy_id)).rowcount:
                    conn.execute("DROP TRIGGER IF EXISTS query_log_settle_once")  # re-created below
                    conn.execute("UPDATE query_log SET key_id=? WHERE key_id=?", (k.key_id, k.legacy_id))
                conn.execute(
                    "INSERT INTO keys (key_id, name, budget, explain_budget, created) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(key_id) DO UPDATE SET name=excluded.name, budget=excluded.budget, "
                    "explain_budget=excluded.explain_budget",
                    (k.key_id, k.name, k.budget, k.explain_budget, time.time()),
                )
            _create_triggers(conn)

    def usage(self, key_id: str) -> Usage:
        row = self._conn().execute(_COUNTERS, (key_id,)).fetchone()
        if row is None:
            raise KeyError(key_id)
        return Usage(*row[:4], flagged=bool(row[4]))

    def set_flagged(self, key_id: str, flagged: bool = True) -> None:
        with self._write() as conn:
            conn.execute("UPDATE keys SET flagged=? WHERE key_id=?", (int(flagged), key_id))

    def all_usage(self) -> dict[str, Usage]:
        """``{key_id: usage}`` for every key (for /metrics)."""
        rows = self._conn().execute(
            "SELECT key_id, predict_used, explain_used, budget, explain_budget, flagged FROM keys").fetchall()
        return {r[0]: Usage(*r[1:5], flagged=bool(r[5])) for r in rows}

    # -- charging --------------------------------------------------------------------------------------
    def reserve(self, key_id: str, kind: str, n: int, *, mode: str, input_digest: str,
                request_id: str | None = None, fingerprint: str | None = None) -> Reservation | Replay:
        """Charge ``n`` before the work, or raise :class:`~stealkit.errors.BudgetExhausted` having changed
        nothing. With a ``request_id`` already answered, returns its :class:`Replay` and charges nothing; one
        still being answered raises :class:`InFlight`; one first used for a request with another ``fingerprint``
        (a digest of everything that shapes the answer), or another kind, cost or images, raises
        :class:`IdempotencyMismatch`."""
        with self._write() as conn:
            if request_id is not None:
                kept = _prior(conn, key_id, request_id, (kind, n, input_digest), fingerprint)
                if kept is not None:
                    return kept
            row = conn.execute(_COUNTERS, (key_id,)).fetchone()
            if row is None:
                raise KeyError(key_id)
            ledger = Usage(*row[:4], flagged=bool(row[4])).ledger()
            ledger.charge(kind, n)  # the budget rule: raises BudgetExhausted, and the transaction rolls back
            counts = ledger.as_dict()
            conn.execute("UPDATE keys SET predict_used=?, explain_used=? WHERE key_id=?",
                         (counts["predict"], counts["explain"], key_id))
            cur = conn.execute(
                "INSERT INTO query_log (key_id, time, kind, n, mode, input_digest, output_digest, status, "
                "request_id, fingerprint, seq) VALUES (?, ?, ?, ?, ?, ?, '', 'reserved', ?, ?, "
                "(SELECT COALESCE(MAX(seq), 0) + 1 FROM query_log WHERE key_id=?))",
                (key_id, time.time(), kind, n, mode, input_digest, request_id, fingerprint, key_id))
            return Reservation(int(cur.lastrowid or 0), Usage(counts["predict"], counts["explain"], row[2], row[3],
                                                              bool(row[4])))

    def has_answer(self, key_id: str, request_id: str) -> bool:
        """Whether an answer is kept for this key's ``request_id`` (a retry that may be replayed: it is let past
        the budget and rate checks made before the body is read; the body must then match, see :meth:`replay`)."""
        return self._conn().execute("SELECT 1 FROM answers WHERE key_id=? AND request_id=?",
                                    (key_id, request_id)).fetchone() is not None

    def replay(self, key_id: str, kind: str, n: int, *, input_digest: str, request_id: str,
               fingerprint: str | None) -> Replay | None:
        """The kept answer of an identical earlier request with this ``request_id``, charging nothing (``None``
        if there is none); raises as :meth:`reserve` does for a different request or one still being answered.
        Asked before any budget or rate check: a paid answer is replayed whatever the budget or rate left."""
        return _prior(self._conn(), key_id, request_id, (kind, n, input_digest), fingerprint)

    def settle(self, reservation: Reservation, output_digest: str, *, answer: Replay | None = None) -> None:
        """Mark a reservation answered (called once the answer is handed to the connection); with ``answer``
        the encoded answer is kept for replays of the same idempotency key."""
        with self._write() as conn:
            cur = conn.execute("UPDATE query_log SET status='answered', output_digest=? WHERE id=? AND "
                               "status='reserved' RETURNING key_id, request_id", (output_digest, reservation.row_id))
            key_id, request_id = cur.fetchone()
            if answer is not None and request_id is not None:
                now = time.time()
                conn.execute("DELETE FROM answers WHERE time < ?", (now - ANSWER_RETENTION_S,))
                conn.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?)",
                             (key_id, request_id, now, answer.media_type, answer.headers, answer.body))

    def refund(self, reservation: Reservation | int, reason: str) -> None:
        """Undo a reservation whose answer could not be produced or delivered; the row keeps the ``reason``."""
        row_id = reservation if isinstance(reservation, int) else reservation.row_id
        with self._write() as conn:
            self._refund(conn, row_id, reason)

    def _refund(self, conn: sqlite3.Connection, row_id: int, reason: str) -> None:
        row = conn.execute("UPDATE query_log SET status='refunded', note=? WHERE id=? AND status='reserved' "
                           "RETURNING key_id, kind, n", (reason[:300], row_id)).fetchone()
        if row is not None:
            col = _USED[row[1]]
            conn.execute(f"UPDATE keys SET {col} = {col} - ? WHERE key_id=?", (row[2], row[0]))  # noqa: S608

    def recover(self) -> int:
        """Refund every reservation left by a crash (call before any worker starts); returns how many.

        Such a request was never settled: it was not delivered, or delivered in the instant before the crash."""
        with self._write() as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM query_log WHERE status='reserved'")]
            for row_id in ids:
                self._refund(conn, row_id, "in flight when the server stopped; never settled")
        return len(ids)

    def charge(self, key_id: str, kind: str, n: int, *, mode: str, input_digest: str, output_digest: str) -> Usage:
        """Reserve and settle at once (an answer already in hand); returns the usage after the charge."""
        res = self.reserve(key_id, kind, n, mode=mode, input_digest=input_digest)
        assert isinstance(res, Reservation)
        self.settle(res, output_digest)
        return res.usage

    # -- auditing --------------------------------------------------------------------------------------
    def log_rows(self, key_id: str | None = None, *, limit: int | None = None, before: int | None = None,
                 before_seq: int | None = None) -> list[dict[str, Any]]:
        """Log rows (oldest first), of one key if given; ``limit`` and ``before`` (a row id) or ``before_seq``
        (the key's own sequence number, ``seq``: 1, 2, ... per key, which says nothing of other keys' volume)
        page back from the newest."""
        where, args = [], []
        if key_id is not None:
            where.append("key_id=?")
            args.append(key_id)
        if before is not None:
            where.append("id<?")
            args.append(before)
        if before_seq is not None:
            where.append("seq<?")
            args.append(before_seq)
        sql = f"SELECT {', '.join(LOG_COLUMNS)} FROM query_log"  # noqa: S608 - fixed column names
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit is not None else "")
        rows = [dict(zip(LOG_COLUMNS, r, strict=True)) for r in self._conn().execute(sql, args)]
        return rows[::-1]

    def audit(self) -> dict[str, dict[str, Any]]:
        """Per key: counters, the log's sums over rows not refunded, and whether they agree (they always should)."""
        conn = self._conn()
        out: dict[str, dict[str, Any]] = {}
        for key_id, pu, eu in conn.execute("SELECT key_id, predict_used, explain_used FROM keys").fetchall():
            sums = dict(conn.execute(
                "SELECT kind, COALESCE(SUM(n), 0) FROM query_log WHERE key_id=? AND status != 'refunded' "
                "GROUP BY kind", (key_id,)).fetchall())
            lp, le = int(sums.get("predict", 0)), int(sums.get("explain", 0))
            out[key_id] = {"predict_used": pu, "explain_used": eu, "log_predict": lp, "log_explain": le,
                           "consistent": pu == lp and eu == le}
        return out


def _prior(conn: sqlite3.Connection, key_id: str, request_id: str, request: tuple[str, int, str],
           fingerprint: str | None) -> Replay | None:
    """The kept answer for ``request_id`` if an identical request (``(kind, n, input_digest)`` and
    ``fingerprint``) was answered; raises :class:`IdempotencyMismatch` for a different one and :class:`InFlight`
    for one still being answered; ``None`` if the key is new (or its answer was not kept)."""
    prior = conn.execute("SELECT status, kind, n, input_digest, fingerprint FROM query_log WHERE "
                         "key_id=? AND request_id=? AND status != 'refunded' ORDER BY id DESC LIMIT 1",
                         (key_id, request_id)).fetchone()
    if prior is None:
        return None
    if tuple(prior[1:4]) != request or prior[4] != fingerprint:
        raise IdempotencyMismatch(
            f"Idempotency-Key {request_id[:40]!r} was first used for a different request (its route, "
            "protocol, mode, options, images or response format differ); a key is replayed only for "
            "the identical request: use a new key for each distinct request")
    if prior[0] == "reserved":
        raise InFlight(request_id)
    kept = conn.execute("SELECT media_type, headers, body FROM answers WHERE key_id=? AND request_id=?",
                        (key_id, request_id)).fetchone()
    return None if kept is None else Replay(kept[0], kept[1], bytes(kept[2]))


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - fixed table names


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a database written by an older stealkit to this schema (keys by id, settled reservations)."""
    if "key_hash" in _columns(conn, "keys"):
        conn.execute("ALTER TABLE keys RENAME COLUMN key_hash TO key_id")
    log_cols = _columns(conn, "query_log")
    if log_cols:
        conn.execute("DROP TRIGGER IF EXISTS query_log_append_only_update")  # replaced by query_log_settle_once
        if "key_hash" in log_cols:
            conn.execute("DROP INDEX IF EXISTS query_log_key")
            conn.execute("ALTER TABLE query_log RENAME COLUMN key_hash TO key_id")
        for col, decl in (("status", "TEXT NOT NULL DEFAULT 'answered'"), ("request_id", "TEXT"), ("note", "TEXT"),
                          ("fingerprint", "TEXT"), ("seq", "INTEGER")):
            if col not in log_cols:
                conn.execute(f"ALTER TABLE query_log ADD COLUMN {col} {decl}")
        if "seq" not in log_cols:  # number each key's existing rows 1, 2, ... (the trigger is re-created after)
            conn.execute("DROP TRIGGER IF EXISTS query_log_settle_once")
            conn.execute("UPDATE query_log SET seq = numbered.seq FROM (SELECT id, ROW_NUMBER() OVER "
                         "(PARTITION BY key_id ORDER BY id) AS seq FROM query_log) AS numbered "
                         "WHERE query_log.id = numbered.id")


def _create_triggers(conn: sqlite3.Connection) -> None:
    for stmt in TRIGGERS:
        conn.execute(stmt)
