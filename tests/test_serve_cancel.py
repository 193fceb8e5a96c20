"""Issue 51 item 1: no parse inside a compute slot, and work whose client has left stops (nothing charged).

The app is driven in process: through ``TestClient`` for two tenants at once, or as a raw ASGI app whose client
disconnects at a chosen moment (its ``receive`` answers ``http.disconnect``). The slow parse or computation is
made slow by the test itself (it waits for an event), so no test asserts a duration: each asserts what ran,
what was charged and what was logged."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.oracle.base import MAX_SMOOTHGRAD_SAMPLES
from stealkit.serve import cancel, jsonscan, payloads
from stealkit.serve.app import create_app
from tests.test_serve_support import write_keys

TENANT = "tenant-Zx81QpLw6RtV3mNb7Yc4Lk"
QUIET = "quiet-Qw3eR5tY7uI9oP1aS2dF6g"
KEYS = [{"key": TENANT, "name": "tenant", "mode": "probs", "explain": True},
        {"key": QUIET, "name": "quiet", "mode": "probs"}]
GUARD_S = 20.0  # how long a blocked step waits for the test before going on: only so that a failing test ends


@pytest.fixture()
def app(victim: Path, tmp_path: Path) -> Any:
    keys = write_keys(tmp_path / "keys.toml", KEYS)
    return create_app(victim, keys, tmp_path / "db.sqlite", compute_slots=1)


def body(n: int = 1, **extra: object) -> bytes:
    return json.dumps({"inputs": np.full((n, 1, 8, 8), 0.5).tolist(), **extra}).encode()


def rows(app: Any, key_id: str) -> list[tuple[str, str]]:
    return [(r["status"], r["note"] or "") for r in app.state.service.store.log_rows(key_id)]


def drive(app: Any, data: bytes, leave: Any, path: str = "/v1/predict", before: Any = None) -> list[dict]:
    """One request to the ASGI app whose client disconnects once ``leave()`` is true (polled); ``before``: a
    coroutine function run first in the app's loop. Returns the messages the app sent."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.9", 5000), "server": ("testserver", 80), "state": {},
             "headers": [(b"authorization", f"Bearer {TENANT}".encode()), (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())]}
    sent: list[dict] = []

    async def run() -> None:
        messages = [{"type": "http.request", "body": data, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            end = time.monotonic() + GUARD_S
            while not leave() and time.monotonic() < end:
                await asyncio.sleep(0.005)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        if before is not None:
            await before()
        await app(scope, receive, send)

    asyncio.run(run())
    return sent


def test_a_parse_holds_no_compute_slot(app, monkeypatch):
    """One compute slot; a tenant's parse is stuck: the quiet tenant is still answered meanwhile."""
    real, started, release, released = payloads.decode_json, threading.Event(), threading.Event(), []

    def stuck_once(*args: Any, **kwargs: Any) -> Any:
        if not started.is_set():
            started.set()
            released.append(release.wait(GUARD_S))  # False: nobody released it (the quiet tenant never came)
        return real(*args, **kwargs)

    monkeypatch.setattr(payloads, "decode_json", stuck_once)
    with TestClient(app) as client:
        answers: dict[str, int] = {}
        first = threading.Thread(target=lambda: answers.__setitem__("tenant", client.post(
            "/v1/predict", content=body(), headers={"Authorization": f"Bearer {TENANT}"}).status_code))
        first.start()
        assert started.wait(GUARD_S)
        quiet = client.post("/v1/predict", content=body(), headers={"Authorization": f"Bearer {QUIET}"})
        release.set()
        first.join(GUARD_S * 2)
    assert quiet.status_code == 200 and answers == {"tenant": 200}
    assert released == [True]  # the quiet tenant was answered while the parse was still stuck


def test_a_client_that_leaves_during_the_parse_stops_it(app, monkeypatch):
    real, started, stopped = payloads.decode_json, threading.Event(), []

    def long_parse(*args: Any, **kwargs: Any) -> Any:
        started.set()
        end = time.monotonic() + GUARD_S
        while time.monotonic() < end:  # a parse that checks for cancellation as jsonscan does
            try:
                cancel.check()
            except cancel.Cancelled:
                stopped.append(True)
                raise
            time.sleep(0.005)
        return real(*args, **kwargs)

    monkeypatch.setattr(payloads, "decode_json", long_parse)
    sent = drive(app, body(), started.is_set)
    assert stopped == [True]
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    assert rows(app, "tenant") == []  # never reserved, never charged


def test_a_client_that_leaves_while_queued_is_never_computed(app):
    sched = app.state.scheduler
    holder = {"left": False}

    async def hold_the_slot() -> None:
        await sched.acquire("someone")  # the only slot, held for the guard (released then, for a failing test)
        asyncio.get_running_loop().call_later(GUARD_S, sched.release, "someone")

    def leave() -> bool:
        if not holder["left"]:
            holder["left"] = bool(sched._waiting)  # the request waits for the slot
        return holder["left"]

    drive(app, body(), leave, before=hold_the_slot)
    assert holder["left"]
    assert rows(app, "tenant") == []  # its wait was given up: never reserved, never computed
    assert not sched._waiting


def test_a_smoothgrad_whose_client_left_stops_and_is_refunded(app):
    """A batch of SmoothGrad images at the most samples: the client leaves once the computation has begun, and
    the sample loop stops at its next forward pass; the reservation is refunded."""
    calls, left = [0], threading.Event()

    def slow_forward(module: Any, inputs: Any, output: Any) -> None:
        calls[0] += 1
        if calls[0] >= 2:
            left.wait(GUARD_S)  # the computation goes on only once the client has left
            time.sleep(0.02)

    def leave() -> bool:
        if calls[0] >= 2:
            left.set()
        return left.is_set()

    handle = app.state.service.model.register_forward_hook(slow_forward)
    try:
        sent = drive(app, body(4, method="smoothgrad", n_samples=MAX_SMOOTHGRAD_SAMPLES), leave,
                     path="/v1/explain")
    finally:
        handle.remove()
    assert calls[0] < MAX_SMOOTHGRAD_SAMPLES // 2  # stopped long before its last sample
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    [(status, note)] = rows(app, "tenant")
    assert status == "refunded" and "disconnected" in note
    assert app.state.service.store.usage("tenant").as_dict() == {"predict": 0, "explain": 0}


def test_the_json_reader_stops_at_its_next_window_once_cancelled():
    data = b'{"inputs": [' + b",".join([b"0.5"] * 200_000) + b"]}"
    stop = threading.Event()
    assert cancel.scope(stop, jsonscan.loads, data)["inputs"].size == 200_000  # not cancelled: read whole
    stop.set()
    stats: dict[str, int] = {}
    with pytest.raises(cancel.Cancelled):
        cancel.scope(stop, lambda: jsonscan.loads(data, stats=stats))
    assert stats["bytes"] < 1024  # stopped at the first check, not at the end of the body


def test_an_answer_finished_as_its_client_left_is_refunded(app, monkeypatch):
    """The computation ends normally (no forward pass to check at) after its client has left: the answer is
    never sent, and its reservation is refunded, not left reserved."""
    service, left = app.state.service, threading.Event()
    real = service.answer

    def answer_after_the_client_left(key: Any, q: Any) -> Any:
        out = real(key, q)
        left.wait(GUARD_S)  # the client leaves while this runs
        stop = cancel._CURRENT.get()
        assert stop is not None
        stop.wait(GUARD_S)  # and the server has asked the work to stop; it returns all the same
        return out

    monkeypatch.setattr(service, "answer", answer_after_the_client_left)

    def leave() -> bool:
        if service.store.log_rows("tenant"):  # reserved: the computation has begun
            left.set()
        return left.is_set()

    sent = drive(app, body(), leave)
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    [(status, note)] = rows(app, "tenant")
    assert status == "refunded" and "disconnected" in note
