"""Issue 51: paid answers never lost, deadlines nothing resets, and the smaller points (item 6).

In process (``TestClient``) where the app decides; over raw sockets against a live ``stealkit serve`` where the
connection layer does (the header and body deadlines). No test asserts a duration: each asserts states, counts
or a connection the server closed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.serve import limits
from stealkit.serve.app import create_app
from tests.test_serve_sockets import answer, closed_by_server, connect, early
from tests.test_serve_support import live_server, write_keys

PAID = "paid-Zx81QpLw6RtV3mNb7Yc4Lk"
SLOW = "slow-Qw3eR5tY7uI9oP1aS2dF6g"
OTHER = "other-Mn7bV5cX3zL1kJ9hG8fDs"
KEYS = [{"key": PAID, "name": "paid", "mode": "probs", "budget": 2, "explain": True},
        {"key": SLOW, "name": "slow", "mode": "probs", "rate": 1, "image_rate": 2},
        {"key": OTHER, "name": "other", "mode": "probs"}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def images(n: int, seed: int = 0) -> list:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32).tolist()


def v2_body(x: list) -> dict[str, object]:
    arr = np.asarray(x, dtype=np.float32)
    return {"inputs": [{"name": "input", "shape": list(arr.shape), "datatype": "FP32", "data": arr.ravel().tolist()}]}


@pytest.fixture()
def client(victim: Path, tmp_path: Path) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", KEYS)
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite", protocol="v2", model_name="digits"))


def ledger(client: TestClient, key_id: str) -> tuple[dict[str, int], list[tuple[int, str]]]:
    store = client.app.state.service.store
    return store.usage(key_id).as_dict(), [(r["n"], r["status"]) for r in store.log_rows(key_id)]


# -- item 4: idempotency before budget -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/predict", "/v1/explain", "/v2/models/digits/infer"])
def test_a_paid_answer_is_replayed_after_the_budget_is_spent(client, route):
    doc = v2_body(images(2)) if route.startswith("/v2") else {"inputs": images(2)}
    headers = auth(PAID) | {"Idempotency-Key": "spend-it-all"}
    first = client.post(route, json=doc, headers=headers)
    assert first.status_code == 200
    spent = ledger(client, "paid")
    assert sum(spent[0].values()) == 2  # the whole budget
    again = client.post(route, json=doc, headers=headers)
    assert again.status_code == 200, again.text
    assert again.content == first.content and again.headers["x-stealkit-replayed"] == "1"
    assert ledger(client, "paid") == spent  # not charged twice, nothing logged
    # a new request (another key or none) is refused for budget, before its body is read
    for extra in ({"Idempotency-Key": "another"}, {}):
        refused = client.post(route, json=doc, headers=auth(PAID) | extra)
        assert refused.status_code == 402, refused.text
    assert ledger(client, "paid") == spent


def test_a_paid_answer_is_replayed_past_the_rate_limits(client, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(limits, "_now", lambda: now[0])  # the buckets' clock stands still: no token comes back
    headers = auth(SLOW) | {"Idempotency-Key": "rate-1"}
    doc = {"inputs": images(2)}
    first = client.post("/v1/predict", json=doc, headers=headers)
    assert first.status_code == 200
    spent = ledger(client, "slow")
    assert client.post("/v1/predict", json=doc, headers=auth(SLOW)).status_code == 429  # the bucket is empty
    again = client.post("/v1/predict", json=doc, headers=headers)
    assert again.status_code == 200, again.text
    assert again.content == first.content and again.headers["x-stealkit-replayed"] == "1"
    assert ledger(client, "slow") == spent


def test_a_known_key_with_another_request_is_still_refused(client):
    """Skipping the budget check for a known Idempotency-Key never answers a different request free."""
    headers = auth(PAID) | {"Idempotency-Key": "k"}
    assert client.post("/v1/predict", json={"inputs": images(2)}, headers=headers).status_code == 200
    spent = ledger(client, "paid")
    r = client.post("/v1/predict", json={"inputs": images(2, seed=1)}, headers=headers)
    assert r.status_code == 422 and r.json()["error"] == "idempotency_key_reused"
    assert ledger(client, "paid") == spent


# -- item 2: deadlines nothing resets ------------------------------------------------------------------------

BROKE = "broke-Lk8jH6gF4dS2aP0oI9uY7q"
THROTTLED = "throttled-Hj5kL8mN2bV4cX6zQ1w"


@pytest.fixture(scope="module")
def server(victim: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("deadlines")
    keys = write_keys(tmp / "keys.toml", [{"key": BROKE, "name": "broke", "budget": 0},
                                          {"key": THROTTLED, "name": "throttled", "rate": 0.0001},
                                          {"key": OTHER, "name": "other", "mode": "probs", "budget": 100}])
    with live_server(victim, keys, tmp / "db.sqlite",
                     extra=("--header-timeout", "1", "--body-timeout", "2")) as url:
        yield url


@pytest.mark.parametrize(("request_head", "status"), [
    (early("GET", "/healthz"), b"200"),
    (early("POST", "/v1/predict"), b"401"),
    (early("POST", "/v1/predict", BROKE), b"402"),
    (early("POST", "/nowhere", BROKE), b"404"),
], ids=["healthz", "401", "402", "404"])
def test_a_request_answered_before_its_body_keeps_a_deadline(server, request_head, status):
    with contextlib.closing(connect(server)) as s:
        s.sendall(request_head)
        assert answer(s).split(b" ")[1] == status
        s.sendall(b"{")  # one body byte after the answer: it must not reset (or remove) the deadline
        assert closed_by_server(s)


def test_a_request_answered_429_before_its_body_keeps_a_deadline(server):
    with contextlib.closing(connect(server)) as s:  # the key's one request token: a junk body, 400
        s.sendall(early("POST", "/v1/predict", THROTTLED)[:-len(b"Content-Length: 6000\r\n\r\n")]
                  + b"Content-Length: 1\r\n\r\n{")
        assert answer(s).split(b" ")[1] == b"400"
    with contextlib.closing(connect(server)) as s:
        s.sendall(early("POST", "/v1/predict", THROTTLED))
        assert answer(s).split(b" ")[1] == b"429"
        s.sendall(b"{")
        assert closed_by_server(s)


def test_a_body_trickled_after_an_early_answer_is_cut_off(server):
    """Bytes keep arriving, each before the last deadline would have passed: the deadline still falls."""
    with contextlib.closing(connect(server)) as s:
        s.sendall(early("GET", "/healthz"))
        answer(s)
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < 400:  # 20 s of one byte every 50 ms against a 1 s deadline (a failing test ends)
                s.sendall(b" ")
                sent += 1
                time.sleep(0.05)
        assert sent < 400  # the server cut the connection while bytes were still coming


def test_a_body_finished_after_an_early_answer_leaves_the_connection_usable(server):
    with contextlib.closing(connect(server)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
        assert answer(s).split(b" ")[1] == b"200"
        s.sendall(b"{}" + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the body ends; the next request
        assert answer(s).split(b" ")[1] == b"200"
        assert closed_by_server(s)  # then idle: the header deadline closes it


# -- item 5: what "delivered" means, and its remedy -------------------------------------------------------------


def test_an_answer_reset_after_its_hand_off_is_charged_and_its_retry_is_free(server):
    """A charge is settled once the whole answer is handed to the transport (docs/guide/serve.md): a client that
    reads a few bytes and resets pays; its retry with the same Idempotency-Key gets the kept answer, uncharged."""
    import json
    import socket
    import struct

    import httpx

    doc = json.dumps({"inputs": images(16)}).encode()
    head = (f"POST /v1/predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OTHER}\r\nIdempotency-Key: reset-1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(doc)}\r\n\r\n").encode()
    s = connect(server)
    s.sendall(head + doc)
    assert s.recv(200).startswith(b"HTTP/1.1 200")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # a reset, having read 200 bytes
    charges = httpx.get(server + "/v1/charges", headers=auth(OTHER), timeout=30).json()
    for _ in range(100):  # the settle follows the hand-off in the same request; wait only for it to be recorded
        if charges["charges"] and charges["charges"][-1]["status"] != "reserved":
            break
        time.sleep(0.05)
        charges = httpx.get(server + "/v1/charges", headers=auth(OTHER), timeout=30).json()
    assert [(c["status"], c["n"]) for c in charges["charges"]] == [("answered", 16)]  # delivered: charged
    retry = httpx.post(server + "/v1/predict", content=doc, timeout=30, headers=auth(OTHER) | {
        "Idempotency-Key": "reset-1", "Content-Type": "application/json"})
    assert retry.status_code == 200 and retry.headers["x-stealkit-replayed"] == "1"
    after = httpx.get(server + "/v1/charges", headers=auth(OTHER), timeout=30).json()
    assert after["charges"] == charges["charges"] and after["queries_used"] == charges["queries_used"]


# -- item 6: the smaller points --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/v1/predict"])
def test_transfer_encoding_with_content_length_is_refused(server, path):
    """Two framings of one body (request smuggling's raw material): 400, and the connection is closed."""
    with contextlib.closing(connect(server)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BROKE}\r\n".encode()
                  + b"Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"0\r\n\r\n")
        head = answer(s)
        assert head.split(b" ")[1] == b"400" and b"connection: close" in head.lower()
        assert closed_by_server(s)


@pytest.mark.parametrize("where", ["key", "metrics_key"])
def test_a_non_ascii_secret_is_refused_when_the_keys_file_is_loaded(where):
    from stealkit.errors import InputError
    from stealkit.serve.keys import parse_keys

    secret = "tenant-Zx81QpLw6RtV3mNb7Yc4-schlüssel"
    data = {"key": [{"key": secret if where == "key" else PAID, "name": "alice"}]}
    if where == "metrics_key":
        data["model"] = {"metrics_key": secret}
    with pytest.raises(InputError) as info:
        parse_keys(data)
    message = str(info.value)
    assert "ASCII" in message and "\n" not in message


def test_failed_keys_on_one_worker_throttle_another(client, victim, tmp_path):
    """Two workers on one database (two apps): a guesser's failures on one are throttled on the other, and a
    tenant known at the address on one is still admitted on the other (tests/test_serve_authshare.py)."""
    assert client.get("/v1/info", headers=auth(OTHER)).status_code == 200  # a tenant at this address
    for _ in range(20):
        assert client.get("/v1/info", headers=auth("guess-0000000000000000000000")).status_code == 401
    getattr(client.app.state.service.auth_throttle, "flush", lambda: None)()  # its writes have landed
    other_worker = TestClient(create_app(victim, tmp_path / "keys.toml", tmp_path / "db.sqlite"))
    assert other_worker.get("/v1/info", headers=auth("guess-1111111111111111111111")).status_code == 429
    assert other_worker.get("/v1/info", headers=auth(OTHER)).status_code == 200


def test_charges_ids_do_not_reveal_other_tenants_volume(client):
    doc = {"inputs": images(1)}
    for key in (OTHER, OTHER, PAID, OTHER, PAID):  # the tenants' requests interleave
        assert client.post("/v1/predict", json=doc, headers=auth(key)).status_code == 200
    ids = {}
    for key in (PAID, OTHER):
        ids[key] = [c["id"] for c in client.get("/v1/charges", headers=auth(key)).json()["charges"]]
    assert ids == {PAID: [1, 2], OTHER: [1, 2, 3]}  # each key's own numbers, whatever the others did
    page = client.get("/v1/charges", params={"limit": 1, "before": 3}, headers=auth(OTHER)).json()["charges"]
    assert [c["id"] for c in page] == [2]  # paging back uses the same numbers


def test_an_older_log_is_numbered_per_key_when_migrated(tmp_path):
    import sqlite3

    from stealkit.serve.store import Store

    db = tmp_path / "old.sqlite"
    Store(db).close()
    conn = sqlite3.connect(db)  # the same file as a stealkit before per-key numbers wrote it
    conn.executescript("""
        DROP INDEX IF EXISTS query_log_seq; DROP TRIGGER IF EXISTS query_log_settle_once;
        ALTER TABLE query_log DROP COLUMN seq;
        INSERT INTO keys (key_id, name, created) VALUES ('a', 'a', 0), ('b', 'b', 0);""")
    for key in "abbab":
        conn.execute("INSERT INTO query_log (key_id, time, kind, n, mode, input_digest, output_digest) "
                     "VALUES (?, 0, 'predict', 1, 'probs', 'x', 'y')", (key,))
    conn.commit()
    conn.close()
    store = Store(db)
    assert [r["seq"] for r in store.log_rows("a")] == [1, 2] and [r["seq"] for r in store.log_rows("b")] == [1, 2, 3]
    res = store.reserve("a", "predict", 1, mode="probs", input_digest="z")
    assert [r["seq"] for r in store.log_rows("a")] == [1, 2, 3]
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):  # the trigger is back, and guards seq too
        store._conn().execute("UPDATE query_log SET status='answered', seq=7 WHERE id=?", (res.row_id,))


# -- item 1: parsing costs what the bytes weigh --------------------------------------------------------------

MB = 1 << 20


def _repeat(unit: bytes, size: int) -> bytes:
    return unit * max(1, size // len(unit))


def _objects_of_tiny_arrays(size: int) -> bytes:  # the shape: 81.6 s of CPU for 6.3 MB before
    obj = b'{"a":[{}' + b",[1]" * 4000 + b"]}"
    return b'{"inputs":[' + b",".join([obj] * max(1, size // len(obj))) + b"]}"


def _nested_objects(size: int) -> bytes:  # objects within the depth cap, each with many fields
    obj = b"{" + b",".join(b'"k%d":{"a":1}' % i for i in range(4000)) + b"}"
    return b'{"inputs":[' + b",".join([obj] * max(1, size // len(obj))) + b"]}"


def _strings(size: int) -> bytes:
    return b'{"inputs":[' + _repeat(b'"aaaaaaa",', size) + b'"a"]}'


def _junk_option(size: int) -> bytes:
    return b'{"inputs":[[[[0]]]],"mode":[' + _repeat(b"{},", size) + b"{}]}"


JUNK = {"tiny-arrays-in-objects": _objects_of_tiny_arrays, "nested-objects": _nested_objects,
        "strings": _strings, "junk-option": _junk_option}


@pytest.mark.parametrize("shape", sorted(JUNK))
@pytest.mark.parametrize("size", [1 * MB, 5 * MB], ids=["1MB", "5MB"])
def test_junk_json_is_refused_having_read_a_bounded_prefix(shape, size):
    from stealkit.errors import InputError
    from stealkit.serve import jsonscan, payloads

    body = JUNK[shape](size)
    assert len(body) >= size * 0.9
    stats: dict[str, int] = {}
    with pytest.raises(InputError):
        jsonscan.loads(body, fields=frozenset({"inputs", "mode"}), stats=stats)  # no schema: the value cap alone
    assert stats["values"] <= jsonscan.MAX_VALUES + 1
    assert stats["bytes"] < 64 * 1024 + 100 * jsonscan.MAX_VALUES  # a prefix, not the body: whatever its size
    with pytest.raises(InputError):  # and as /v1 reads a body
        payloads.decode_json(body, (1, 8, 8), max_batch=64, fields=frozenset({"mode"}))


@pytest.mark.parametrize("shape", sorted(JUNK))
def test_junk_json_is_refused_at_the_first_wrong_token_of_the_v1_schema(shape):
    from stealkit.serve import jsonscan

    body = JUNK[shape](MB)
    stats: dict[str, int] = {}
    with pytest.raises(jsonscan.JsonError):
        jsonscan.loads(body, fields=frozenset({"inputs", "mode"}), numeric=frozenset({"inputs"}), flat=True,
                       stats=stats)
    assert stats["values"] <= 3 and stats["bytes"] < 64


@pytest.mark.parametrize("route", ["/v1/predict", "/v2/models/digits/infer"])
def test_junk_json_over_http_is_a_400(client, route):
    body = _objects_of_tiny_arrays(MB)
    r = client.post(route, content=body, headers=auth(OTHER) | {"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert ledger(client, "other") == ({"predict": 0, "explain": 0}, [])


def test_an_honest_v2_request_is_far_below_the_value_cap(client):
    x = images(2)
    doc = v2_body(x) | {"id": "r1", "outputs": [{"name": "probs", "parameters": {"binary_data": False}}],
                        "parameters": {"binary_data_output": False}}
    assert client.post("/v2/models/digits/infer", json=doc, headers=auth(OTHER)).status_code == 200


def test_a_mode_that_is_not_a_string_is_refused_before_any_comparison() -> None:
    """Found by the schema fuzz: ``"mode": [0, 0]`` reached the mode check as a numeric array, whose comparison
    with "" is element by element (a 500 instead of a 400)."""
    import numpy as np

    from stealkit.errors import InputError
    from stealkit.serve.service import Service

    with pytest.raises(InputError, match="mode must be a string"):
        Service.choose_mode(None, None, np.array([0.0, 0.0]))  # type: ignore[arg-type]
