"""The query ledger: the one place where queries are counted and a budget is enforced.

Policy (documented contract): a request that would take the count past the budget is **refused whole**:
nothing is answered and nothing is charged, and :class:`~stealkit.errors.BudgetExhausted` says how many
queries remain. Attacks size their last batch with :meth:`QueryLedger.remaining` so no budget is wasted.
One image answered is one query; each kind (``predict``, ``explain``) is counted separately, and a budget
may apply to the total over all kinds, to one kind, or both.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from stealkit.errors import BudgetExhausted, InputError


class QueryKind(StrEnum):
    """What a query asked for: a prediction (membership query) or an explanation (gradient query)."""

    PREDICT = "predict"
    EXPLAIN = "explain"


@dataclass(frozen=True)
class QueryRecord:
    """One answered request: its kind, how many images, when, and a digest of the inputs."""

    kind: str
    n: int
    time: float
    digest: str = ""


@dataclass
class QueryLedger:
    """Counts answered images by kind and enforces budgets atomically (thread-safe).

    ``budget`` caps the total over all kinds; ``budgets`` caps single kinds (e.g. ``{"explain": 100}``).
    ``None`` means unlimited. With ``log=True`` every answered request is kept in :attr:`records`,
    and with ``log_path`` also appended to a JSON-lines file.
    """

    budget: int | None = None
    budgets: dict[str, int] = field(default_factory=dict)
    log: bool = False
    log_path: Path | None = None
    counts: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in QueryKind})
    records: list[QueryRecord] = field(default_factory=list)
    #: called as ``fn(kind, n)`` after every charge (progress bars, live metrics); not part of the state
    on_charge: list[Callable[[str, int], None]] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 0):
            raise InputError(f"budget must be a non-negative integer or None, got {self.budget!r}")
        for kind, b in self.budgets.items():
            _check_kind(kind)
            if not isinstance(b, int) or b < 0:
                raise InputError(f"budget for {kind!r} must be a non-negative integer, got {b!r}")
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def remaining(self, kind: str | QueryKind | None = None) -> int | None:
        """Queries that can still be answered (for ``kind``, or overall); ``None`` if unlimited."""
        with self._lock:
            return self._remaining(_kind(kind) if kind is not None else None)

    def _remaining(self, kind: str | None) -> int | None:
        return budget_left(self.counts, self.budget, self.budgets, kind)

    def cap_budget(self, other_left: int, *, pending: int = 0) -> None:
        """Lower the total budget so that at most ``other_left`` more queries follow the ``pending`` ones
        already charged here (a remote ledger reported less left than this one thinks); never raises it."""
        with self._lock:
            cap = self.total - pending + max(0, int(other_left))
            if self.budget is None or cap < self.budget:
                self.budget = max(0, cap)

    def as_dict(self) -> dict[str, int]:
        """The counts by kind, e.g. ``{"predict": 1000, "explain": 0}`` (the ``queries`` of summary.json)."""
        with self._lock:
            return dict(self.counts)

    # -- charging --------------------------------------------------------------------------------
    def charge(self, kind: str | QueryKind, n: int, *, digest: str = "") -> None:
        """Charge ``n`` images of ``kind`` or raise :class:`BudgetExhausted` having charged nothing."""
        k = _kind(kind)
        if n < 0:
            raise InputError(f"cannot charge a negative number of queries ({n})")
        with self._lock:
            left = self._remaining(k)
            if left is not None and n > left:
                raise BudgetExhausted(
                    f"query budget exhausted: this request needs {n} {k} queries but only {left} remain "
                    f"(used {self.counts}). Raise --budget or send a smaller batch.",
                    requested=n,
                    remaining=left,
                    kind=k,
                )
            self.counts[k] = self.counts.get(k, 0) + n
            if self.log or self.log_path is not None:
                rec = QueryRecord(kind=k, n=n, time=time.time(), digest=digest)
                if self.log:
                    self.records.append(rec)
                if self.log_path is not None:
                    with open(self.log_path, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(rec.__dict__) + "\n")
        for fn in self.on_charge:
            fn(k, n)

    def refund(self, kind: str | QueryKind, n: int) -> None:
        """Undo a charge whose answer could not be produced (an internal failure, never a user's)."""
        k = _kind(kind)
        with self._lock:
            self.counts[k] = max(0, self.counts.get(k, 0) - n)

    @contextlib.contextmanager
    def reserve(self, kind: str | QueryKind, n: int, *, digest: str = "") -> Iterator[None]:
        """Charge ``n`` up front; refund if the body raises (so a failed answer costs nothing)."""
        self.charge(kind, n, digest=digest)
        try:
            yield
        except BaseException:
            self.refund(kind, n)
            raise

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"budget": self.budget, "budgets": dict(self.budgets), "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counts from a checkpoint so a resumed run does not spend a query twice."""
        with self._lock:
            self.counts = {k.value: 0 for k in QueryKind} | {str(k): int(v) for k, v in state["counts"].items()}


def budget_left(counts: Mapping[str, int], budget: int | None, budgets: Mapping[str, int | None],
                kind: str | None = None) -> int | None:
    """The budget rule: queries still allowed (for ``kind``, or overall) given the counts by kind, the total
    ``budget`` and per-kind ``budgets`` (``None``: unlimited). Every ledger and the server's store use it."""
    left: list[int] = []
    if budget is not None:
        left.append(budget - sum(counts.values()))
    if kind is not None and budgets.get(kind) is not None:
        left.append(int(budgets[kind]) - counts.get(kind, 0))  # type: ignore[arg-type]
    return max(0, min(left)) if left else None


def digest_tensor(x: Any, *, length: int = 16, dtype: str | None = None) -> str:
    """The first ``length`` hex digits of the SHA-256 of an array's (C-contiguous) bytes.

    Query logs and the serve store use the default 16; the answer journal (:mod:`stealkit.extract.journal`) uses
    32 digits of the float32 bytes (``dtype="float32"``: a tensor is cast first, so a float64 batch and its float32
    copy digest alike), the digests its files have always held.
    """
    import numpy as np

    if hasattr(x, "detach"):
        t = x.detach().cpu()
        if dtype is not None:
            import torch

            t = t.to(getattr(torch, dtype))
        arr = t.numpy()
    else:
        arr = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:length]


def _kind(kind: str | QueryKind) -> str:
    return _check_kind(kind.value if isinstance(kind, QueryKind) else kind)


def _check_kind(kind: str) -> str:
    valid = [k.value for k in QueryKind]
    if kind not in valid:
        raise InputError(f"unknown query kind {kind!r}; expected one of {valid}")
    return kind
