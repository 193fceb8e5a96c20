"""Files are written whole or not at all: write to a temporary file beside the target, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_UMASK_LOCK = threading.Lock()


def default_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0o666 less the process umask."""
    with _UMASK_LOCK:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; on success it replaces ``target`` atomically.

    The file gets ``mode``, by default what any file the user writes gets (the umask applies), so a report or
    summary copied to a shared folder stays readable; pass ``0o600`` for secrets.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.fchmod(fd, default_file_mode() if mode is None else mode)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, enums, paths, tensors and numpy values into plain JSON types."""
    import dataclasses
    import enum

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy arrays/scalars and torch tensors
        return obj.tolist()
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    return obj


def atomic_write_json(target: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(target, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
