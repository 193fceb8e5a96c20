"""Strict readers for the fields of the keys file: each returns a value of exactly the declared type and range,
or raises one :class:`InputError` line naming the entry, the field, what it got and what it takes.

TOML has real booleans, integers and floats, so ``explain = "false"`` (a string) is an error, never a truthy
value; numbers must be finite and inside the range the server can honour.
"""

from __future__ import annotations

import math
import string
from typing import Any

from stealkit.errors import InputError

#: the least estimated entropy of an API key (or the metrics key), in bits
MIN_KEY_BITS = 96
MIN_KEY_LENGTH = 16
KEY_HINT = "use a long random string, e.g. python -c \"import secrets; print(secrets.token_urlsafe(24))\""


def _got(value: Any) -> str:
    kind = {bool: "a bool", str: "a string", int: "an integer", float: "a number", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:40] + '...' if len(text) > 40 else text}"


def boolean(value: Any, where: str) -> bool:
    """A TOML bool (``true``/``false``); strings and numbers are refused."""
    if not isinstance(value, bool):
        raise InputError(f"{where} must be true or false (a TOML bool, no quotes), got {_got(value)}")
    return value


def integer(value: Any, where: str, lo: int, hi: int) -> int:
    """A TOML integer in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"{where} must be an integer in [{lo}, {hi}], got {_got(value)}")
    return value


def number(value: Any, where: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite TOML number (integer or float) in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise InputError(f"{where} must be a finite number in {left}{lo:g}, {hi:g}], got {_got(value)}")
    return float(value)


def text(value: Any, where: str, *, max_len: int = 64, pattern_chars: str | None = None) -> str:
    """A non-empty TOML string of at most ``max_len`` characters (from ``pattern_chars`` if given)."""
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise InputError(f"{where} must be a non-empty string of at most {max_len} characters, got {_got(value)}")
    if pattern_chars is not None and any(c not in pattern_chars for c in value):
        raise InputError(f"{where} may hold only letters, digits, '-', '_' and '.', got {value!r}")
    return value


NAME_CHARS = string.ascii_letters + string.digits + "-_."


def key_bits(secret: str) -> float:
    """A conservative entropy estimate: length times log2 of the character classes used, capped by the
    number of distinct characters (so ``"aaaa...a"`` or ``"abababab..."`` score low)."""
    pool = sum(size for chars, size in ((string.ascii_lowercase, 26), (string.ascii_uppercase, 26),
                                       (string.digits, 10)) if any(c in chars for c in secret))
    if any(c not in string.ascii_letters + string.digits for c in secret):
        pool += 32
    distinct = len(set(secret))
    return len(secret) * math.log2(max(2, min(pool, distinct * 2)))


def secret(value: Any, where: str) -> str:
    """An API key: a string of at least :data:`MIN_KEY_LENGTH` characters and :data:`MIN_KEY_BITS` bits."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where} must be a non-empty string (the secret clients send), got {_got(value)}")
    if value != value.strip() or any(c.isspace() or not c.isprintable() for c in value):
        raise InputError(f"{where} must not contain spaces or control characters; {KEY_HINT}")
    if not value.isascii():  # an HTTP header carries bytes a server reads as Latin-1: such a key never matches
        raise InputError(f"{where} must be ASCII (an Authorization header cannot carry other characters); {KEY_HINT}")
    bits = key_bits(value)
    if len(value) < MIN_KEY_LENGTH or bits < MIN_KEY_BITS:
        raise InputError(f"{where} is too easy to guess ({len(value)} characters, about {bits:.0f} bits; "
                         f"at least {MIN_KEY_LENGTH} characters and {MIN_KEY_BITS} bits are required): {KEY_HINT}")
    return value


def string_list(value: Any, where: str) -> tuple[Any, ...]:
    """An array (of strings or tables, e.g. defence specs); a bare string is refused, not split into letters."""
    if not isinstance(value, list) or not all(isinstance(v, str | dict) for v in value):
        raise InputError(f"{where} must be an array like [\"round:decimals=3\"], got {_got(value)}")
    return tuple(value)
