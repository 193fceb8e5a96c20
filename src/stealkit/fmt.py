"""Figures as a person reads them on the terminal: ledgers as ``1,000 predict / 0 explain``, rates and
accuracies rounded to what they mean, ``n/a`` for a figure that was not measured (never a Python repr)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def queries(counts: Mapping[str, Any] | int | None) -> str:
    """A ledger's counts by kind, e.g. ``{"predict": 1000, "explain": 0}`` -> ``1,000 predict / 0 explain``; a
    plain count -> ``1,000``; ``None`` -> ``n/a``."""
    if counts is None:
        return "n/a"
    if isinstance(counts, Mapping):
        return " / ".join(f"{int(n):,} {kind}" for kind, n in counts.items()) or "0"
    return f"{int(counts):,}"


def figure(value: Any, digits: int = 4) -> str:
    """A measured figure to ``digits`` decimals (an integer as is, with thousands separators); ``None`` or a
    missing figure -> ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return str(value)


def record(rec: Mapping[str, Any], digits: int = 4) -> str:
    """A flat record as ``key value, key value`` (nested ledgers via :func:`queries`, figures via
    :func:`figure`; ``None`` entries left out)."""
    parts = []
    for k, v in rec.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            text = queries(v) if all(isinstance(x, int) for x in v.values()) else record(v, digits)
        elif isinstance(v, (list, tuple)):
            text = ", ".join(figure(x, digits) for x in v)
        else:
            text = figure(v, digits)
        parts.append(f"{k.replace('_', ' ')} {text}")
    return ", ".join(parts)
