"""Workers die with their supervisor: a SIGKILLed ``stealkit serve --workers N`` leaves no orphan serving old keys
on the port (which would also make a restart fail with "Address already in use").

Two mechanisms, because either alone has a gap: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``,
immediate, but tied to the parent *thread* that forked us), and a watchdog thread that notices the parent is
gone (``os.getppid()`` changes when a process is re-parented) within :data:`POLL_S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def _exit_now(parent: int) -> None:
    log.warning("supervisor %d is gone; worker %d exits", parent, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown; the watchdog hard-exits if that hangs
    threading.Timer(10.0, os._exit, args=(1,)).start()


def exit_with_parent(parent: int, poll_s: float = POLL_S) -> threading.Thread | None:
    """Make this process exit when ``parent`` (its supervisor) dies. Returns the watchdog thread, or ``None``
    if the parent is already gone (then this process is already exiting)."""
    if os.getppid() != parent:
        _exit_now(parent)
        return None
    _parent_death_signal(signal.SIGTERM)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll_s):
            if os.getppid() != parent:
                _exit_now(parent)
                return

    thread = threading.Thread(target=watch, name="stealkit-lifeline", daemon=True)
    thread.start()
    return thread
