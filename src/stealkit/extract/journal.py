"""The answer journal of a data-free run: every victim answer since the last checkpoint, replayed on resume.

Between checkpoints every victim answer is appended to ``journal-<iteration>.bin`` (a JSON header per record
plus raw bytes). A resumed run restores the checkpoint (:mod:`stealkit.extract.datafree.checkpoint`), then serves the
journalled answers instead of querying the victim again (their inputs are checked by digest) and charges them
to the ledger, so it ends with the same student and the same ledger counts as an uninterrupted run and never
spends a query twice. The journal is flushed after each record: it survives a killed process, not a power cut.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stealkit.oracle import Oracle
from stealkit.oracle.ledger import QueryKind, QueryLedger, digest_tensor

log = logging.getLogger(__name__)

# A record's input digest: 32 hex digits of the batch's float32 bytes, as every journal written so far holds.
# A change here makes old journals diverge at their first record (the run then re-queries and says so).
DIGEST_LENGTH = 32
DIGEST_DTYPE = "float32"


def _write_record(fh: Any, dig: str, answer: torch.Tensor) -> None:
    arr = np.ascontiguousarray(answer.detach().cpu().numpy())
    header = json.dumps({"digest": dig, "dtype": arr.dtype.str, "shape": list(arr.shape)}).encode()
    fh.write(struct.pack("<II", len(header), arr.nbytes) + header + arr.tobytes())
    fh.flush()


def read_journal(path: Path) -> list[tuple[str, torch.Tensor, int, int]]:
    """The complete records of a journal as (digest, answer, start, end offsets); a torn last one is dropped."""
    records: list[tuple[str, torch.Tensor, int, int]] = []
    if not path.exists():
        return records
    data = path.read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        hlen, nbytes = struct.unpack("<II", data[pos : pos + 8])
        end = pos + 8 + hlen + nbytes
        if end > len(data):
            break
        try:
            header = json.loads(data[pos + 8 : pos + 8 + hlen])
            dtype = np.dtype(header["dtype"])
            if dtype.kind not in "iuf":
                raise ValueError(f"unexpected dtype {dtype}")
            arr = np.frombuffer(data[pos + 8 + hlen : end], dtype=dtype).reshape(header["shape"]).copy()
        except (ValueError, KeyError, json.JSONDecodeError):
            break
        records.append((str(header["digest"]), torch.from_numpy(arr), pos, end))
        pos = end
    return records


class JournalOracle:
    """Wraps an oracle: appends every answer to a journal and, after a resume, replays journalled answers.

    Replayed answers are charged to the ledger (they were paid for before the interruption and the restored
    ledger predates them) but never sent to the victim. Satisfies the :class:`~stealkit.oracle.Oracle`
    protocol, so the attacks cannot tell it from the oracle it wraps.
    """

    def __init__(self, oracle: Oracle) -> None:
        self.inner = oracle
        self.num_classes = oracle.num_classes
        self.input_shape = oracle.input_shape
        self.mode = oracle.mode
        self.replayed = 0
        self.live = 0
        self._pending: list[tuple[str, torch.Tensor, int, int]] = []
        self._fh: Any = None

    @property
    def ledger(self) -> QueryLedger:
        return self.inner.ledger

    def __getattr__(self, name: str) -> Any:
        """Everything else is the wrapped oracle's (its top-k, temperature, device)."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def open(self, journal: Path, *, replay: bool) -> None:
        """Start writing ``journal``; with ``replay``, first serve the complete records it already holds."""
        self.close()
        self._pending = read_journal(journal) if replay else []
        if not journal.exists():
            journal.write_bytes(b"")
        self._fh = open(journal, "r+b")  # noqa: SIM115 - kept open for the run
        self._truncate(self._pending[-1][3] if self._pending else 0)

    def _truncate(self, end: int) -> None:
        self._fh.truncate(end)  # drop a torn or unusable tail before appending after it
        self._fh.seek(end)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def query(self, x: torch.Tensor) -> torch.Tensor:
        dig = digest_tensor(x, length=DIGEST_LENGTH, dtype=DIGEST_DTYPE) if self._fh is not None else ""
        if self._pending:
            want, answer, start, _ = self._pending[0]
            if want == dig:
                self._pending.pop(0)
                self.ledger.charge(QueryKind.PREDICT, int(x.shape[0]))
                self.replayed += int(x.shape[0])
                return answer.clone()
            log.warning("resumed run diverged from its journal (%d answers unused); querying the victim",
                        len(self._pending))
            self._truncate(start)
            self._pending = []
        answer = self.inner.query(x)
        self.live += int(x.shape[0])
        if self._fh is not None:
            _write_record(self._fh, dig, answer)
        return answer
