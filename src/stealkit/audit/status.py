"""The audit's status line while its parts run: every ``STEALKIT_PROGRESS_INTERVAL`` seconds (default 30; 0
turns it off), the parts done, each running part's name, progress and time, and the whole audit's ETA.

A part reports through a callback, never by printing: :func:`reporting` listens to the progress bars its runner
opens (:func:`stealkit.progress.listening`: the victim's queries against the part's budget, the student's training
steps and epochs, a data-free attacker's iterations) and keeps the latest count of each in ``parts/<id>.progress``,
a small JSON file written atomically at most every second. The part may run in this process or in a worker
process (``--jobs``): :class:`AuditClock`, a thread of the audit's own process, reads those files and writes one
line to the audit's log, so the workers' progress reaches it without a pipe of its own.

The ETA scales the time so far by the share of the plan done: each part weighs its planned seconds (the plan's
``est. time``; its queries where the plan has no time), a finished part counts whole, a running one by its current
bar (``n`` of ``total``). The gates' extension rungs count as planned until the audit ends, so the ETA is an upper
bound there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stealkit.audit.parts import Part

#: the audit's status line's default interval in seconds (STEALKIT_PROGRESS_INTERVAL overrides it; 0: off)
DEFAULT_SECONDS = 30.0
#: the most often a part rewrites its progress file
WRITE_SECONDS = 1.0
SUFFIX = ".progress"


def interval() -> float:
    """Seconds between the audit's status lines; 0: none."""
    from stealkit.progress import interval as env_interval

    return env_interval(DEFAULT_SECONDS)


class PartReporter:
    """The callback a running part's bars report to: the latest :class:`~stealkit.progress.Tick` of each bar,
    kept in ``path`` (at most every ``every`` seconds)."""

    def __init__(self, path: Path, every: float) -> None:
        self.path, self.every = path, every
        self.started = time.time()
        self.bars: dict[str, dict[str, Any]] = {}
        self.last = 0.0
        self.write()

    def __call__(self, tick: Any) -> None:
        self.bars.pop(tick.desc, None)  # the newest bar last: the part's current phase
        self.bars[tick.desc] = {"words": tick.words(), "n": tick.n, "total": tick.total}
        if time.monotonic() - self.last >= self.every:
            self.write()

    def write(self) -> None:
        from stealkit.fsutil import atomic_write_json

        self.last = time.monotonic()
        atomic_write_json(self.path, {"started": self.started, "bars": list(self.bars.values())})


@contextmanager
def reporting(parts_dir: Path, part_id: str) -> Iterator[None]:
    """While the block runs a part, keep its progress in ``parts_dir/<part_id>.progress`` (nothing when the
    status line is off); the file is removed when the part ends."""
    every = interval()
    if every <= 0:
        yield
        return
    from stealkit.progress import listening

    path = parts_dir / f"{part_id}{SUFFIX}"
    reporter = PartReporter(path, min(WRITE_SECONDS, every / 2))
    try:
        with listening(reporter):
            yield
    finally:
        path.unlink(missing_ok=True)


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _fraction(bars: Sequence[dict[str, Any]]) -> float:
    """How far a running part is: its newest bar with a total (0 before any)."""
    for bar in reversed(bars):
        if bar.get("total"):
            return min(1.0, max(0.0, float(bar["n"]) / float(bar["total"])))
    return 0.0


class AuditClock:
    """The status line's thread: every ``every`` seconds, the parts of ``parts`` done (their ``parts/<id>.json``),
    those running (their fresh ``parts/<id>.progress``) and the ETA, to ``echo``."""

    def __init__(self, parts: Sequence[Part], parts_dir: Path, echo: Callable[[str], None],
                 every: float | None = None) -> None:
        from stealkit.audit.kinds import part_id
        from stealkit.progress import quiet

        self.every = (0.0 if quiet() else interval()) if every is None else every
        self.parts_dir, self.echo = parts_dir, echo
        self.weights = {part_id(p): (p.estimate_s or float(p.budget) or 1.0) for p in parts}
        self.todo = [i for i in self.weights if not (parts_dir / f"{i}.json").exists()]
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self) -> str | None:
        """The status line now (``None`` when no part of the plan is left)."""
        if not self.todo:
            return None
        now = time.time()
        done = [i for i in self.todo if (self.parts_dir / f"{i}.json").exists()]
        running = []
        share = sum(self.weights[i] for i in done)
        for i in self.todo:
            if i in done:
                continue
            try:
                path = self.parts_dir / f"{i}{SUFFIX}"
                if path.stat().st_mtime < self.started - 1:  # left by an audit stopped earlier
                    continue
                state = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            bars = state.get("bars") or []
            share += self.weights[i] * _fraction(bars)
            doing = ", ".join(b["words"] for b in bars) or "starting"
            running.append(f"{i} ({doing}; {_clock(now - float(state.get('started', now)))})")
        elapsed = now - self.started
        total = sum(self.weights[i] for i in self.todo)
        f = share / total if total else 0.0
        eta = f"ETA {_clock(elapsed * (1 - f) / f)}" if f > 0 else "ETA unknown yet"
        what = "running " + "; ".join(running) if running else "between parts"
        return (f"audit: {len(done)}/{len(self.todo)} parts done, {what}; elapsed {_clock(elapsed)}, {eta} "
                f"({100 * f:.0f} % of the plan's time)")

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            text = self.line()
            if text:
                self.echo(text)

    def __enter__(self) -> AuditClock:
        if self.every > 0 and self.todo:  # off under --quiet, or with STEALKIT_PROGRESS_INTERVAL=0
            self._thread = threading.Thread(target=self._loop, name="audit-status", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
