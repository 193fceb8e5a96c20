"""Work whose client has left: stopped at its next check, and never charged.

The app runs a request's parse and its computation in the thread pool under a cancel event (:func:`scope`);
when the client disconnects, the event is set and the work raises :class:`Cancelled` at its next
:func:`check`: the JSON reader checks between values and between the windows of its vectorised passes
(:mod:`stealkit.serve.jsonscan`), the model at every forward pass (:class:`stealkit.serve.service.Interruptible`:
a SmoothGrad of 65,536 samples is 65,536 checks). A computation stopped so is refunded; a parse stopped so was
never charged. Importing this module is cheap (no torch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
_CURRENT: ContextVar[threading.Event | None] = ContextVar("stealkit_serve_cancel", default=None)


class Cancelled(Exception):  # noqa: N818 - what happened, not an error of the caller
    """The client of the request this work served has disconnected."""


def check() -> None:
    """Raise :class:`Cancelled` if the work running in this thread was cancelled."""
    event = _CURRENT.get()
    if event is not None and event.is_set():
        raise Cancelled("the client disconnected; the work was stopped")


def scope(event: threading.Event, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with ``event`` as its cancel event (what :func:`check` looks at), in the calling thread."""
    token = _CURRENT.set(event)
    try:
        return fn(*args)
    finally:
        _CURRENT.reset(token)
