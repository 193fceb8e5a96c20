"""Issue 51 item 3: caps a few attackers cannot fill.

Addresses are grouped for the per-address cap (an IPv6 client owns its /64); a full total cap evicts the oldest
connection without complete headers instead of refusing the newcomer; body reads are bounded apart from, and
below, the in-flight bound, with slots kept for keys that read none. States and counts only, no durations."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from stealkit.serve.app import create_app
from stealkit.serve.conn import ConnLimits, _State, address_group, admit
from stealkit.serve.limits import BodyReads
from tests.test_serve_sockets import GUARD_S, answer_or_nothing, connect
from tests.test_serve_support import live_server, make_victim, write_keys

HONEST = "honest-Zx81QpLw6RtV3mNb7Yc4Lk"
HOSTILE = [f"hostile{i}-Qw3eR5tY7uI9oP1aS2dF6g" for i in range(4)]
KEYS = [{"key": HONEST, "name": "honest"}] + [{"key": k, "name": f"hostile{i}"} for i, k in enumerate(HOSTILE)]
X = {"inputs": np.zeros((1, 1, 8, 8)).tolist()}


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


# -- address groups ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "group"), [
    ("203.0.113.7", "203.0.113.7"),
    ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
    ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
    ("::ffff:203.0.113.7", "203.0.113.7"),  # an IPv4 client on a dual-stack socket
    ("fe80::1%eth0", "fe80::/64"),
    ("unix-socket", "unix-socket"),
])
def test_addresses_are_grouped(host, group):
    assert address_group(host) == group


def _open(state: _State, limits: ConnLimits, host: str, name: str) -> tuple[bool, Any]:
    """What the protocol does when a connection opens (waiting for its headers once admitted)."""
    ok, victim = admit(address_group(host), False, limits, state)
    if victim is not None:
        state.admitted -= 1
        state.per_host[victim[0]] -= 1
    if ok:
        state.admitted += 1
        state.per_host[address_group(host)] = state.per_host.get(address_group(host), 0) + 1
        state.waiting[(address_group(host), name)] = None
    return ok, victim


def test_an_ipv6_client_holds_one_share_for_its_whole_64():
    state, limits = _State(), ConnLimits(per_address=2, max_connections=100)
    assert _open(state, limits, "2001:db8::1", "a")[0] and _open(state, limits, "2001:db8::2", "b")[0]
    assert not _open(state, limits, "2001:db8::ffff:1", "c")[0]  # another address of the same /64
    assert _open(state, limits, "2001:db8:0:1::1", "d")[0]  # the next /64 is another client


def test_a_full_cap_evicts_the_oldest_connection_without_headers():
    state, limits = _State(), ConnLimits(per_address=10, max_connections=3)
    for i in range(3):
        assert _open(state, limits, f"10.0.0.{i}", f"half-open-{i}") == (True, None)
    ok, victim = _open(state, limits, "10.0.0.9", "newcomer")
    assert ok and victim == ("10.0.0.0", "half-open-0")  # the oldest one goes, the newcomer is served
    state.waiting.clear()  # now every open connection is inside a request: nothing can be evicted
    assert _open(state, limits, "10.0.0.10", "late") == (False, None)


# -- live: the total cap and the per-address cap -----------------------------------------------------------


@pytest.fixture(scope="module")
def server(victim: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("caps")
    keys = write_keys(tmp / "keys.toml", KEYS)
    with live_server(victim, keys, tmp / "db.sqlite", extra=(
            "--header-timeout", "60", "--max-connections", "8", "--max-connections-per-address", "4")) as url:
        yield url


@pytest.mark.slow
def test_half_open_connections_filling_the_cap_do_not_keep_a_tenant_out(server):
    """Eight half-open connections from two addresses fill the cap (no deadline falls during the test): the
    tenant's request evicts the oldest, and is answered."""
    held = [connect(server, source) for source in ("127.0.0.2",) * 4 + ("127.0.0.3",) * 4]
    try:
        for s in held:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # headers never finished
        r = httpx.post(server + "/v1/predict", json=X, headers={"Authorization": f"Bearer {HONEST}"},
                       timeout=GUARD_S)
        assert r.status_code == 200
        # the oldest half-open connection was evicted: its finished request gets no answer; the newest does
        assert answer_or_nothing(held[0], b"Host: x\r\n\r\n") is None
        assert answer_or_nothing(held[-1], b"Host: x\r\n\r\n") == b"200"
    finally:
        for s in held:
            s.close()


# -- body reads ------------------------------------------------------------------------------------------------


def test_body_reads_keep_slots_for_keys_that_read_none():
    reads = BodyReads(8)  # 2 kept for keys reading no body
    assert reads.reserve == 2
    taken = sum(reads.try_acquire(k) for k in ("a", "b") for _ in range(8))
    assert taken == 7  # two trickling keys: bound - reserve between them, and one kept slot for b's first
    assert reads.try_acquire("c")  # a newcomer uses the other kept slot
    assert not reads.try_acquire("d")  # full
    reads.release("c")
    assert not reads.try_acquire("a")  # a key already reading stays out of the kept slot
    assert reads.try_acquire("d")


def _scope(key: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/predict", "raw_path": b"/v1/predict",
            "query_string": b"", "root_path": "", "client": ("127.0.0.9", 5000), "server": ("testserver", 80),
            "state": {}, "headers": [(b"authorization", f"Bearer {key}".encode()),
                                     (b"content-type", b"application/json"), (b"content-length", b"6000")]}


def test_four_keys_trickling_bodies_leave_a_fifth_served(victim, tmp_path):
    """Four keys each send as many requests as their share allows (16 of the 64 in flight) and never send
    their bodies: a fifth key is still answered."""
    import json

    app = create_app(victim, write_keys(tmp_path / "keys.toml", KEYS), tmp_path / "db.sqlite", max_inflight=64)
    statuses: dict[str, list[int]] = {}

    async def one(key: str, body: bytes | None, release: asyncio.Event) -> None:
        async def receive() -> dict:
            if body is not None:
                return {"type": "http.request", "body": body, "more_body": False}
            await release.wait()  # the trickled body never comes; the client leaves at the end of the test
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                statuses.setdefault(key, []).append(message["status"])

        scope = _scope(key)
        if body is not None:
            scope["headers"][-1] = (b"content-length", str(len(body)).encode())
        with contextlib.suppress(Exception):
            await app(scope, receive, send)

    async def run() -> None:
        release = asyncio.Event()
        hostile = [asyncio.ensure_future(one(k, None, release)) for k in HOSTILE for _ in range(16)]
        for _ in range(50):  # let every hostile request reach its body read (or its refusal)
            await asyncio.sleep(0)
        await one(HONEST, json.dumps(X).encode(), release)
        release.set()
        await asyncio.gather(*hostile)

    asyncio.run(run())
    assert statuses[HONEST] == [200]
    assert app.state.body_reads._total == 0  # every slot given back
