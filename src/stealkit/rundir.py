"""Run directories: ``config.json``, ``records.jsonl``, ``summary.json`` and ``report.html``.

Every file except the append-only records is written atomically. ``config.json`` stores the command, its
settings, the seed, the package version, the git commit when known, and the time.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.fsutil import atomic_write_json, atomic_write_text, to_jsonable


def git_commit() -> str | None:
    """The commit of the source tree stealkit runs from, if it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    """Where a result was made: versions, commit, torch's intra-op threads, the machine's load when it began, and
    the device (with the GPU's name) that the command resolved (:func:`stealkit.device.device_info`)."""
    import torch

    from stealkit.device import device_info

    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:  # not every platform has a load average
        load = None
    return {
        "stealkit_version": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "load_average": load,
        "cpus": os.cpu_count(),
        **device_info(),
    }


#: significant digits kept in summaries and records: float32 results carry about 7, so 6 loses nothing measured
#: and drops the float32 noise (``0.6555555462837219`` -> ``0.655556``)
SIGNIFICANT_DIGITS = 6


def rounded(obj: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """Every float in a JSON-ready structure rounded to ``digits`` significant digits."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


#: run directories this process created (so a command that fails before writing anything leaves none behind)
_CREATED: list[Path] = []
#: every run directory this process wrote a config to (what ``--track`` logs when the command has finished)
OPENED: list[Path] = []


def discard_unfinished_runs() -> list[Path]:
    """Remove the run directories this process created that hold nothing but ``config.json``; returns them.

    A command that fails before its first record, checkpoint or summary leaves no run directory behind; one that
    failed later keeps what it wrote (a data-free run resumes from it).
    """
    removed = []
    while _CREATED:
        path = _CREATED.pop()
        try:
            if path.is_dir() and {p.name for p in path.iterdir()} <= {"config.json"}:
                for p in path.iterdir():
                    p.unlink()
                path.rmdir()
                removed.append(path)
        except OSError:
            continue
    return removed


class RunDir:
    """A directory holding one run's config, records, summary and report."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def create(self, *, command: str, config: dict[str, Any], seed: int | None) -> RunDir:
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"--out {self.path} exists and is not a directory; choose another path")
        if not self.path.exists():
            _CREATED.append(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the run directory --out {self.path} ({exc.strerror}); choose a "
                             "writable path") from None
        if not os.access(self.path, os.W_OK):
            raise InputError(f"the run directory --out {self.path} is not writable; choose a writable path")
        OPENED.append(self.path)
        atomic_write_json(
            self.path / "config.json",
            {"command": command, "seed": seed, "config": config, "created": time.time(), **environment()},
        )
        return self

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def report_path(self) -> Path:
        return self.path / "report.html"

    def append_record(self, record: dict[str, Any]) -> None:
        """Append one JSON line (flushed and synced); readers skip a torn last line."""
        self.path.mkdir(parents=True, exist_ok=True)
        line = json.dumps(rounded(to_jsonable(record))) + "\n"
        with open(self.records_path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def records(self) -> list[dict[str, Any]]:
        if not self.records_path.exists():
            return []
        out = []
        for line in self.records_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash
        return out

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, rounded(to_jsonable(summary)))

    def write_report(self, html: str) -> None:
        atomic_write_text(self.report_path, html)

    def load_config(self) -> dict[str, Any]:
        return self._load(self.config_path)

    def load_summary(self) -> dict[str, Any]:
        return self._load(self.summary_path)

    def _load(self, path: Path) -> dict[str, Any]:
        if not path.exists():
            raise InputError(f"{path} does not exist; is {self.path} a stealkit run directory?")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path} is not valid JSON ({exc}); the run may have been interrupted") from None
