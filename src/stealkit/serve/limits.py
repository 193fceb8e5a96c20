"""Rate limits and scheduling: token buckets per key, failed-authentication throttling per client address,
requests and body reads in flight per key, and a fair scheduler that shares the model between keys."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


def _now() -> float:
    """The buckets' clock (monotonic seconds); one place, so tests can hold it still."""
    return time.monotonic()


class TokenBucket:
    """``rate`` tokens per second, burst of ``burst`` (default one second's worth); a large request may
    overdraw it once."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(rate, 1.0)
        self.tokens = self.burst
        self.last = _now()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = _now()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def take(self, n: float = 1.0) -> float:
        """Take ``n`` tokens; returns 0 on success or the seconds to wait before retrying."""
        with self._lock:
            self._refill()
            if self.rate <= 0:
                return math.inf
            need = min(n, self.burst)
            if self.tokens >= need:
                self.tokens -= n
                return 0.0
            return (need - self.tokens) / self.rate

    def wait(self) -> float:
        """Seconds until one token is available (0 if one is), taking nothing."""
        with self._lock:
            self._refill()
            return 0.0 if self.tokens >= 1 else (1 - self.tokens) / max(self.rate, 1e-9)


class AuthThrottle:
    """Failed authentications per client address: a burst of ``burst`` failures, then ``rate`` per second.

    While an address is over its allowance, a request from it is refused (429) unless it carries a key that
    already authenticated from that address before (at most ``known_per_client`` remembered per address): a
    guesser sharing an address (NAT, office) does not lock out the tenants already working there, and a guess,
    right or wrong, gets the same 429, so guessing cannot go faster than ``rate`` keys per second."""

    def __init__(self, rate: float = 1.0, burst: float = 20.0, max_clients: int = 10_000,
                 known_per_client: int = 64) -> None:
        self.rate, self.burst, self.max_clients = rate, burst, max_clients
        self.known_per_client = known_per_client
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._known: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, client: str, key_id: str) -> None:
        """``key_id`` authenticated from ``client``: it stays admitted there while the address is throttled."""
        with self._lock:
            known = self._known.get(client)
            if known is None:
                known = self._known[client] = OrderedDict()
                while len(self._known) > self.max_clients:
                    self._known.popitem(last=False)
            self._known.move_to_end(client)
            known[key_id] = None
            known.move_to_end(key_id)
            while len(known) > self.known_per_client:
                known.popitem(last=False)

    def known(self, client: str, key_id: str) -> bool:
        with self._lock:
            return key_id in self._known.get(client, ())

    def _bucket(self, client: str) -> TokenBucket:
        with self._lock:
            bucket = self._buckets.get(client)
            if bucket is None:
                bucket = self._buckets[client] = TokenBucket(self.rate, self.burst)
                while len(self._buckets) > self.max_clients:
                    self._buckets.popitem(last=False)
            self._buckets.move_to_end(client)
            return bucket

    def blocked_for(self, client: str) -> float:
        """Seconds this address must wait before it may try a key again (0: it may now)."""
        return self._bucket(client).wait()

    def failed(self, client: str) -> None:
        self._bucket(client).take(1.0)


class KeyQuota:
    """At most ``per_key`` requests of one key in flight at once, so one tenant cannot fill the server's whole
    in-flight bound (every other tenant would then be answered 503)."""

    def __init__(self, per_key: int) -> None:
        self.per_key = max(1, int(per_key))
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, key: str) -> bool:
        with self._lock:
            if self._held.get(key, 0) >= self.per_key:
                return False
            self._held[key] = self._held.get(key, 0) + 1
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]


class BodyReads:
    """At most ``bound`` request bodies read at once (below the in-flight bound, so bodies that trickle never
    fill it), of which the last ``reserve`` go only to keys that are reading none: keys that trickle bodies
    hold at most ``bound - reserve`` between them (plus one each), and a key with no body in flight finds a
    slot while fewer than ``reserve`` such keys arrive at once."""

    def __init__(self, bound: int, reserve: int | None = None) -> None:
        self.bound = max(1, int(bound))
        self.reserve = min(self.bound - 1, max(1, self.bound // 4) if reserve is None else int(reserve))
        self._held: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def try_acquire(self, key: str) -> bool:
        with self._lock:
            room = self.bound if not self._held.get(key) else self.bound - self.reserve
            if self._total >= room:
                return False
            self._held[key] = self._held.get(key, 0) + 1
            self._total += 1
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._held[key] -= 1
            self._total -= 1
            if not self._held[key]:
                del self._held[key]


class FairScheduler:
    """Grants ``slots`` concurrent model computations, round-robin across keys, at most ``per_key`` to one key.

    A key that floods the server with slow requests queues behind itself: another key's request takes the
    next free slot (and there is always one a single key cannot hold when ``per_key < slots``). Runs on the
    event loop; the computation itself then runs in the thread pool.
    """

    def __init__(self, slots: int, per_key: int | None = None) -> None:
        self.slots = max(1, int(slots))
        self.per_key = max(1, min(self.slots, per_key if per_key is not None else self.slots - 1))
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._served: dict[str, int] = {}  # key -> when it was last granted a slot (a counter)
        self._clock = 0
        self._total = 0

    def _dispatch(self) -> None:
        while self._total < self.slots:
            eligible = [k for k, q in self._waiting.items() if q and self._running.get(k, 0) < self.per_key]
            if not eligible:
                return
            key = min(eligible, key=lambda k: self._served.get(k, -1))  # the longest unserved key first
            queue = self._waiting[key]
            fut = queue.popleft()
            if not queue:
                del self._waiting[key]
            if fut.done():  # cancelled while waiting
                continue
            self._clock += 1
            self._served[key] = self._clock
            if len(self._served) > 10_000:  # forget the longest-idle keys
                for old in sorted(self._served, key=self._served.__getitem__)[:5_000]:
                    del self._served[old]
            fut.set_result(None)
            self._running[key] = self._running.get(key, 0) + 1
            self._total += 1

    def _release(self, key: str) -> None:
        self._running[key] -= 1
        if not self._running[key]:
            del self._running[key]
        self._total -= 1
        self._dispatch()

    async def acquire(self, key: str) -> None:
        """Wait for one computation slot for ``key`` (cancelling the wait gives up its place in the queue)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(fut)
        self._dispatch()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release(key)
            else:  # its place in the queue is given up now, not when the queue reaches it
                queue = self._waiting.get(key)
                if queue is not None:
                    with contextlib.suppress(ValueError):
                        queue.remove(fut)
                    if not queue:
                        del self._waiting[key]
            raise

    def release(self, key: str) -> None:
        """Give back a slot :meth:`acquire` granted."""
        self._release(key)

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Hold one computation slot for ``key`` for the duration of the block."""
        await self.acquire(key)
        try:
            yield
        finally:
            self._release(key)
