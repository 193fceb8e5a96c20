"""Progress of long commands, on stderr only (never in a JSON output or a report).

* on a terminal (stderr is a tty): a tqdm bar with the count, rate and ETA;
* anywhere else (a log file, CI, a pipe): one plain status line at a steady interval
  (``STEALKIT_PROGRESS_INTERVAL`` seconds, default 10), e.g.
  ``train: 1,200/8,000 step (15%), 45.2 step/s, elapsed 0:27, ETA 2:30, epoch 3/20, loss 0.4123``,
  and one closing line for a phase that printed any;
* with ``--quiet`` (``STEALKIT_QUIET=1``): nothing.

Extraction commands keep a bar of the victim's queries against the budget (:func:`ledger_progress`); an
accuracy measured on the way (:func:`measured`, called by :class:`stealkit.metrics.Evaluator`) is shown on it.

A caller that reports progress its own way (the audit's status line) listens to every bar opened meanwhile
(:func:`listening`): each update hands it a :class:`Tick`, whether or not the bar prints (``--quiet``, a worker).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

#: seconds between two status lines off a terminal
INTERVAL_ENV = "STEALKIT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0


def quiet() -> bool:
    return os.environ.get("STEALKIT_QUIET", "") not in ("", "0")


def interval(default: float = DEFAULT_INTERVAL) -> float:
    """Seconds between status lines (``STEALKIT_PROGRESS_INTERVAL``; ``default`` where it is unset or not a
    number)."""
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, default)))
    except ValueError:
        return default


@dataclass(frozen=True)
class Tick:
    """One bar's count as a listener gets it: ``desc`` (e.g. ``train``, ``victim queries``), ``n`` of ``total``
    ``unit`` (``total`` ``None``: unknown), and the figures shown after it (``epoch 3/20``)."""

    desc: str
    n: float
    total: float | None
    unit: str
    postfix: dict[str, str] = field(default_factory=dict)

    def words(self) -> str:
        count = f"{_count(self.n)}/{_count(self.total)}" if self.total else _count(self.n)
        extra = ", ".join(f"{k} {v}".strip() for k, v in self.postfix.items())
        return f"{self.desc} {count} {self.unit}" + (f" ({extra})" if extra else "")


#: a listener of bars' progress (:func:`listening`)
Listener = Callable[[Tick], None]
_LISTENERS: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Hand ``listener`` a :class:`Tick` at every update of every bar opened inside the block."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def _on_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _clock(seconds: float) -> str:
    return tqdm.format_interval(max(0.0, seconds))


def _count(n: float) -> str:
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.1f}"


class StatusLines:
    """The part of tqdm's interface the commands use, written as one plain line per interval (for logs)."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", initial: float = 0, every: float | None = None, **_ignored: Any) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = self.initial = initial
        self.every = interval() if every is None else every
        self.start = self.last = time.monotonic()
        self.postfix: dict[str, str] = {}
        self.lines = 0
        self.closed = False
        self.listeners: list[Listener] = list(_LISTENERS)

    # the tqdm interface
    def update(self, n: float = 1) -> None:
        self.n += n
        if self.listeners:
            tick = Tick(self.desc, self.n, self.total, self.unit, dict(self.postfix))
            for listener in self.listeners:
                listener(tick)
        self._maybe_print()

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        self.postfix.update({str(k): str(v) for k, v in {**(ordered_dict or {}), **kwargs}.items()})

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = {"": s}

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        self._maybe_print()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.lines:  # a phase long enough to have reported ends with one line saying so
            self._print(final=True)

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> StatusLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    # the line
    def _maybe_print(self) -> None:
        now = time.monotonic()
        if not self.closed and now - self.last >= self.every:
            self.last = now
            self._print()

    def line(self, final: bool = False) -> str:
        elapsed = time.monotonic() - self.start
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        if final:
            parts = [f"{head}done, {_count(self.n)} {self.unit} in {_clock(elapsed)}"]
        elif self.total:
            pct = 100 * self.n / self.total
            parts = [f"{head}{_count(self.n)}/{_count(self.total)} {self.unit} ({pct:.0f}%)"]
        else:
            parts = [f"{head}{_count(self.n)} {self.unit}"]
        parts.append(f"{rate:.3g} {self.unit}/s")
        if not final:
            parts.append(f"elapsed {_clock(elapsed)}")
            if self.total and rate > 0:
                parts.append(f"ETA {_clock((self.total - self.n) / rate)}")
        parts += [f"{k} {v}".strip() for k, v in self.postfix.items()]
        return ", ".join(parts)

    def _print(self, final: bool = False) -> None:
        self.lines += 1
        stream = sys.stderr
        stream.write(self.line(final) + "\n")
        stream.flush()


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> Any:
    """A progress indicator (tqdm's interface: ``update``, ``set_postfix``, ``close``, iteration): a tqdm bar on
    a terminal, :class:`StatusLines` elsewhere, a silent pass-through under ``--quiet``. While someone is
    :func:`listening`, always :class:`StatusLines` (silent on a terminal or under ``--quiet``: the listener
    reports)."""
    if _LISTENERS:
        silent = quiet() or kwargs.get("disable") is True or _on_terminal()
        kwargs.pop("disable", None)
        bar: Any = StatusLines(iterable, **{**kwargs, **({"every": math.inf} if silent else {})})
        _OPEN[:] = [*_live(_OPEN), bar]
        return bar
    if quiet() or kwargs.get("disable") is True:
        kwargs["disable"] = True
        return tqdm(iterable, **kwargs)
    kwargs.pop("disable", None)
    if not _on_terminal():
        bar = StatusLines(iterable, **kwargs)
    else:
        kwargs.setdefault("leave", False)
        if _columns() > 0:
            kwargs.setdefault("dynamic_ncols", True)
        else:  # a terminal that reports no size (some pseudo-terminals): tqdm would draw nothing
            kwargs.setdefault("ncols", 120)
            kwargs.setdefault("nrows", 24)
        kwargs.setdefault("file", sys.stderr)
        bar = tqdm(iterable, **kwargs)
    _OPEN[:] = [*_live(_OPEN), bar]
    return bar


#: bars shown now, newest last, and those of them counting victim queries (what :func:`measured` annotates)
_OPEN: list[Any] = []
_LEDGER_BARS: list[Any] = []


def _live(bars: list[Any]) -> list[Any]:
    return [b for b in bars if not getattr(b, "closed", False) and not getattr(b, "disable", False)]


def ledger_progress(ledger: Any, desc: str = "victim queries") -> Any:
    """A bar of queries used against the ledger's budget, advanced on every charge."""
    bar = progress(total=ledger.budget, desc=desc, unit="q")
    bar.update(ledger.total)
    ledger.on_charge.append(lambda kind, n: bar.update(n))
    _LEDGER_BARS[:] = [*_live(_LEDGER_BARS), bar]
    return bar


def expect(total: int) -> None:
    """The newest query bar's total, where the ledger has no budget but the command knows its plan."""
    if _LEDGER_BARS:
        bar = _LEDGER_BARS[-1]
        bar.total = total
        if hasattr(bar, "refresh"):
            bar.refresh()


def measured(**figures: float | None) -> None:
    """Show figures just measured (e.g. ``accuracy=0.91``) on the newest query bar and the newest bar (the
    student's training, say)."""
    shown = {("acc" if k == "accuracy" else k): f"{v:.3f}" for k, v in figures.items() if v is not None}
    if not shown:
        return
    for bar in {id(b): b for b in (_live(_LEDGER_BARS)[-1:] + _live(_OPEN)[-1:])}.values():
        note(bar, **shown)


def note(bar: Any, **values: Any) -> None:
    """Add (or update) ``key value`` entries after a bar's count, keeping the others."""
    if isinstance(bar, StatusLines):
        bar.set_postfix(values)
    elif not getattr(bar, "disable", False):
        bar.set_postfix({**_postfix(bar), **{k: str(v) for k, v in values.items()}})


def _postfix(bar: Any) -> dict[str, str]:
    """A tqdm bar's postfix as a dict (tqdm keeps it as one string ``k=v, k=v``)."""
    text = getattr(bar, "postfix", None) or ""
    return dict(part.split("=", 1) for part in text.split(", ") if "=" in part)
