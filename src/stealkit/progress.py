"""Progress bars that stay out of the way: off with --quiet (STEALKIT_QUIET=1) or when stderr is no terminal."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def quiet() -> bool:
    return os.environ.get("STEALKIT_QUIET", "") not in ("", "0")


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar, disabled under --quiet; ``disable=None`` also hides it when stderr is not a terminal."""
    kwargs.setdefault("disable", True if quiet() else None)
    kwargs.setdefault("leave", False)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)


def ledger_progress(ledger: Any, desc: str = "victim queries") -> tqdm:
    """A bar of queries used against the ledger's budget, advanced on every charge."""
    bar = progress(total=ledger.budget, desc=desc, unit="q", leave=False)
    bar.update(ledger.total)
    ledger.on_charge.append(lambda kind, n: bar.update(n))
    return bar
