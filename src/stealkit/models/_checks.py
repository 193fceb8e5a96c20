"""Validation of architecture keyword arguments; each failure is an :class:`InputError` naming the fix."""

from __future__ import annotations

import math

from stealkit.errors import InputError


def positive_int(arch: str, name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{arch}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def positive_float(arch: str, name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InputError(f"{arch}: {name} must be a positive finite number (e.g. 0.25 or 1), got {value!r}")
    return float(value)


def boolean(arch: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{arch}: {name} must be true or false, got {value!r}")
    return value
