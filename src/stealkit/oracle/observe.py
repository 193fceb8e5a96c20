"""Watching the queries an oracle answers, without charging, changing or repeating them.

An observer is called with every answered batch of ``predict`` queries, in the order they were answered:
``fn(oracle, x, answer)`` with the validated images ``x [B, C, H, W]`` and the answer in the oracle's mode, after
the ledger has charged them. ``stealkit audit`` uses it to run PRADA (:mod:`stealkit.serve.detection`) over each
attack's own stream of queries, as a server watching that client would, without a query of its own. Observers
are process-wide (an attack may open its victim deep inside a command) and active only inside
:func:`observing`; with none active, :func:`notify` costs one check.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

Observer = Callable[[Any, torch.Tensor, torch.Tensor], None]

_observers: list[Observer] = []
_lock = threading.Lock()


@contextmanager
def observing(fn: Observer) -> Iterator[Observer]:
    """Call ``fn(oracle, x, answer)`` after every ``predict`` batch any oracle answers inside the block."""
    with _lock:
        _observers.append(fn)
    try:
        yield fn
    finally:
        with _lock:
            _observers.remove(fn)


def notify(oracle: Any, x: torch.Tensor, answer: torch.Tensor) -> None:
    """Tell the active observers that ``oracle`` answered ``x`` with ``answer`` (called by the oracles)."""
    if not _observers:
        return
    with _lock:
        active = tuple(_observers)
    for fn in active:
        fn(oracle, x, answer)
