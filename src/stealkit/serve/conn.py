"""Connection guards for ``stealkit serve``: what a connection may hold before it has sent a whole request.

uvicorn (0.54, h11) bounds the header size (``h11_max_incomplete_event_size``) and closes idle keep-alive
connections (``timeout_keep_alive``), but it has no deadline for a request's headers and no cap on
connections: a client that opens a connection and never finishes its headers holds a file descriptor
forever, and 20,000 of them fill the descriptor table (every ``accept()`` then fails with EMFILE and asyncio
logs a traceback per try). Its ``limit_concurrency`` answers 503 only once headers have arrived and counts the
half-open connections, so it would refuse honest tenants, not the attacker. :class:`GuardedH11Protocol` (the
``http`` protocol class ``stealkit serve`` hands uvicorn) adds, per worker:

- a **header deadline**: a connection that has not sent complete request headers ``header_timeout`` seconds
  after it opened (or after its previous response) is closed;
- a **drain deadline**: a request answered before its body was read (a 401/402/404/429, a ``GET`` that declared
  a body) must finish sending that body within ``header_timeout`` seconds of the answer, a deadline that data
  does not reset, else the connection is closed (uvicorn would otherwise discard such bytes with no timer left:
  its keep-alive timer stops at the first byte); the body read by a route has ``--body-timeout`` (app.py);
- a **per-address cap**: at most ``per_address`` open connections from one address group (an IPv4 address, an
  IPv6 /64: :func:`address_group`; a configured trusted proxy is exempt: it multiplexes many clients);
- a **total cap**: at most ``max_connections`` open connections, kept below the process's descriptor limit (raised
  to its hard limit at start-up), so ``accept()`` never runs out of descriptors. When it is full, a newcomer
  **evicts** the oldest connection that has not sent complete request headers (a half-open one, or an idle
  keep-alive one), so connections that send nothing cannot keep out those that do; a newcomer is refused only
  when every open connection is inside a request (:func:`admit`);

A connection over a cap is accepted and aborted at once (RST; the descriptor is freed in the same loop turn):
it costs the server an ``accept`` and a ``close``. Nothing is logged per connection: :class:`RepeatFilter`
folds repeated log lines (uvicorn's "Invalid HTTP request", asyncio's accept errors) into one line per
``window`` seconds with a count, so an attacker cannot grow the log.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

ENV = "STEALKIT_SERVE_CONFIG"
#: descriptors kept free for the database, the model, logs and the thread pool's SQLite connections
FD_RESERVE = 512

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnLimits:
    """Per-worker connection limits (seconds and counts)."""

    header_timeout: float = 10.0
    per_address: int = 64
    max_connections: int = 4096
    trusted: tuple[str, ...] = ()

    def exempt(self, host: str) -> bool:
        """Whether ``host`` is a trusted proxy (exempt from the per-address cap)."""
        return trusted_match(host, self.trusted)


def trusted_match(host: str, trusted: tuple[str, ...]) -> bool:
    """Whether ``host`` lies in one of the ``trusted`` addresses or networks (``"*"``: any)."""
    if not trusted or not host:
        return False
    if "*" in trusted:
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host in trusted
    for t in trusted:
        with contextlib.suppress(ValueError):
            if addr in ipaddress.ip_network(t, strict=False):
                return True
    return False


def descriptor_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; returns the limit now in force."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def effective_limits(requested: ConnLimits) -> ConnLimits:
    """``requested`` with ``max_connections`` lowered below the descriptor limit (less :data:`FD_RESERVE`)."""
    cap = max(16, descriptor_limit() - FD_RESERVE)
    if requested.max_connections <= cap:
        return requested
    log.warning("max connections lowered from %d to %d (open-file limit)", requested.max_connections, cap)
    return ConnLimits(requested.header_timeout, requested.per_address, cap, requested.trusted)


def address_group(host: str) -> str:
    """The group the per-address cap counts ``host`` in: an IPv4 address alone (an IPv4-mapped IPv6 address as
    its IPv4 address), an IPv6 address with its whole /64 (one subscriber's prefix: any client owns 2**64
    addresses of it), anything else as it is."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass
class _State:
    limits: ConnLimits | None = None
    per_host: dict[str, int] = field(default_factory=dict)  # per address group
    admitted: int = 0
    refused: int = 0
    timed_out: int = 0
    evicted: int = 0
    #: admitted connections without complete request headers, oldest first (the ones a full cap evicts)
    waiting: dict[Any, None] = field(default_factory=dict)


_STATE = _State()


def current() -> ConnLimits:
    if _STATE.limits is None:
        raw = json.loads(os.environ.get(ENV, "{}")).get("conn") or {}
        _STATE.limits = effective_limits(ConnLimits(**{k: tuple(v) if k == "trusted" else v
                                                       for k, v in raw.items()}))
    return _STATE.limits


def admit(group: str, exempt: bool, limits: ConnLimits, state: _State = _STATE) -> tuple[bool, Any]:
    """Whether a new connection from address ``group`` is admitted, and the connection it evicts (or ``None``):
    over its group's cap it is refused; when the total cap is full, the oldest connection that has not sent
    complete request headers is evicted for it (refused only when every open connection has)."""
    if state.per_host.get(group, 0) >= limits.per_address and not exempt:
        return False, None
    if state.admitted < limits.max_connections:
        return True, None
    if state.waiting:
        victim = next(iter(state.waiting))
        del state.waiting[victim]
        return True, victim
    return False, None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and connection caps (see the module docstring). A refused
    connection never builds uvicorn's per-connection state (its h11 parser and flow control)."""

    _guard_host: str = ""
    _guard_counted: bool = False
    _guard_built: bool = False
    _header_timer: Any = None
    _drain_timer: Any = None

    def __init__(self, config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> None:  # noqa: ANN401
        self._deferred = (config, server_state, app_state, _loop)  # H11Protocol.__init__ runs once admitted

    def connection_made(self, transport: Any) -> None:  # noqa: ANN401
        limits = current()
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple | list) and peer else ""
        group = address_group(host)
        ok, victim = admit(group, limits.exempt(host), limits)
        if not ok:
            _STATE.refused += 1
            transport.abort()  # frees the descriptor now; connection_lost follows
            return
        if victim is not None:
            _STATE.evicted += 1
            victim.evict()
        super().__init__(*self._deferred)
        super().connection_made(transport)
        self._guard_host, self._guard_counted, self._guard_built = group, True, True
        _STATE.per_host[group] = _STATE.per_host.get(group, 0) + 1
        _STATE.admitted += 1
        self._arm_header_timer()

    def evict(self) -> None:
        """Closed to make room for a newcomer (the total cap is full and this one has no complete headers); it
        leaves the counts now, not when its close is processed."""
        self._cancel_header_timer()
        self._uncount()
        if not self.transport.is_closing():
            self.transport.abort()

    def _uncount(self) -> None:
        if not self._guard_counted:
            return
        self._guard_counted = False
        _STATE.admitted -= 1
        left = _STATE.per_host.get(self._guard_host, 1) - 1
        if left > 0:
            _STATE.per_host[self._guard_host] = left
        else:
            _STATE.per_host.pop(self._guard_host, None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._guard_built:
            return  # refused: nothing was built
        self._guard_built = False
        self._cancel_header_timer()
        self._cancel_drain_timer()
        self._uncount()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._drain_timer is not None and self.conn.their_state is not h11.SEND_BODY:
            self._cancel_drain_timer()  # the body answered early has ended (in time)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm_header_timer()  # and the next request's headers have their deadline
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()  # the request's headers are in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # the next request's headers have the same deadline
        elif self.conn.their_state is h11.SEND_BODY and self._drain_timer is None:
            # answered before its body was read (401/402/404/429, GET with a body): the rest of the body must
            # arrive within one deadline that data does not reset, else the connection is cut
            self._drain_timer = self.loop.call_later(current().header_timeout, self._drain_deadline)

    def _cancel_drain_timer(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None

    def _drain_deadline(self) -> None:
        self._drain_timer = None
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            _STATE.timed_out += 1
            self.transport.abort()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(current().header_timeout, self._header_deadline)
        _STATE.waiting[self] = None  # newest last: evicted after every older one

    def _cancel_header_timer(self) -> None:
        _STATE.waiting.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        _STATE.waiting.pop(self, None)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            _STATE.timed_out += 1
            self.transport.abort()


class RepeatFilter(logging.Filter):
    """Lets a log line through once per ``window`` seconds per (logger, message template); the next one that
    passes says how many were folded into it."""

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        last, folded = self._seen.get(key, (-float("inf"), 0))
        if now - last < self.window:
            self._seen[key] = (last, folded + 1)
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if folded:
            record.msg = f"{record.msg} [{folded} more like this in the last {self.window:g} s]"
            record.exc_info, record.exc_text = None, None  # one traceback per window at most
        return True


def return_freed_memory(threshold: int = 256 * 1024) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more from its own mapping, returned to the
    operating system when freed (glibc raises this threshold as large blocks are freed, up to 32 MB, after which
    freed request bodies stay in the heap and the worker's RSS never comes down). Returns whether it was set."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_mmap_threshold = -3
        return bool(libc.mallopt(m_mmap_threshold, threshold))
    except (OSError, AttributeError):  # not glibc
        return False


_last_trim = [0.0]


def trim_memory(min_interval: float = 1.0) -> bool:
    """Hand the allocator's free pages back to the operating system (glibc ``malloc_trim``), at most once per
    ``min_interval`` seconds: request bodies are received in many blocks below the mapping threshold, spread
    over the thread pool's arenas, which glibc otherwise keeps. Returns whether it ran."""
    now = time.monotonic()
    if now - _last_trim[0] < min_interval:
        return False
    _last_trim[0] = now
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
        return True
    except (OSError, AttributeError):  # not glibc
        return False


def fold_repeated_logs(window: float = 60.0) -> None:
    """Install :class:`RepeatFilter` on the loggers an attacker can make speak per connection or per request."""
    for name in ("uvicorn.error", "asyncio", "stealkit.serve.app", "stealkit.serve.service"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter(window))
