"""Issue 40: slow clients, half-open connections and junk cost the attacker, not the service.

A live ``stealkit serve`` with small limits (header deadline 1 s, body deadline 2 s, 4 connections per address)
is attacked over raw sockets; the in-process tests check admission before the body is read."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.serve.app import create_app
from stealkit.serve.conn import RepeatFilter, trusted_match
from tests.test_serve_sockets import GUARD_S, answer_or_nothing, closed_by_server, connect
from tests.test_serve_support import live_server, make_victim, write_keys

HONEST = "honest-Zx81QpLw6RtV3mNb7Yc4"
HOSTILE = "hostile-Qw3eR5tY7uI9oP1aS2dF6"
BROKE = "broke-Lk8jH6gF4dS2aP0oI9uY7"
KEYS = [{"key": HONEST, "name": "honest", "budget": 1000}, {"key": HOSTILE, "name": "hostile"},
        {"key": BROKE, "name": "broke", "budget": 0}]
X = {"inputs": np.zeros((1, 1, 8, 8)).tolist()}


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


@pytest.fixture(scope="module")
def server(victim: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("hard")
    keys = write_keys(tmp / "keys.toml", KEYS)
    log = tmp / "server.log"
    with live_server(victim, keys, tmp / "db.sqlite", log=log,
                     extra=("--header-timeout", "1", "--body-timeout", "2", "--max-connections-per-address", "4")
                     ) as url:
        yield url, log


def honest_ok(url: str) -> bool:
    r = httpx.post(url + "/v1/predict", json=X, headers={"Authorization": f"Bearer {HONEST}"}, timeout=GUARD_S)
    return r.status_code == 200


def test_headers_that_never_finish_are_closed(server):
    url, _ = server
    with contextlib.closing(connect(url)) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        assert closed_by_server(s)


def test_an_idle_connection_is_closed(server):
    url, _ = server
    with contextlib.closing(connect(url)) as s:
        assert closed_by_server(s)


def test_one_address_holds_at_most_its_share_and_others_are_served(server):
    url, log = server
    before = log.stat().st_size
    held = [connect(url, "127.0.0.2") for _ in range(4)]
    try:
        for s in held:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # headers never finished
        refused = [connect(url, "127.0.0.2") for _ in range(50)]
        for s in refused:  # a whole request on each, answered only if the connection had been admitted
            with contextlib.closing(s):
                assert answer_or_nothing(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") is None
        assert honest_ok(url)  # another address is served meanwhile
    finally:
        for s in held:
            s.close()
    assert log.stat().st_size - before < 2000  # nothing logged per refused connection


def test_a_trickled_body_times_out_alone(server):
    url, _ = server
    with contextlib.closing(connect(url)) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + HOSTILE.encode() + b"\r\nContent-Length: 6000\r\n\r\n{")
        assert honest_ok(url)  # served while the hostile body is pending
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.1 408") and b"body_timeout" in data
    assert b"connection: close" in data.lower()


def test_a_key_without_budget_is_refused_before_its_body(server):
    url, _ = server
    with contextlib.closing(connect(url)) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + BROKE.encode() + b"\r\nContent-Length: 6000\r\n\r\n")
        data = s.recv(65536)  # answered without sending a byte of the body
    assert data.startswith(b"HTTP/1.1 402")


# -- in process --------------------------------------------------------------------------------------------


@pytest.fixture()
def client(victim: Path, tmp_path: Path) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", KEYS + [{"key": "third-Mn7bV5cX3zL1kJ9hG8f", "name": "third",
                                                       "mode": "logits", "explain": True}])
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite", max_inflight=8, protocol="v2"))


THIRD = {"Authorization": "Bearer third-Mn7bV5cX3zL1kJ9hG8f"}


def used(client: TestClient, key_id: str = "third") -> dict[str, int]:
    return client.app.state.service.store.usage(key_id).as_dict()


# -- point 4: an Idempotency-Key is replayed only for the identical request ----------------------------------


def v2_body(x: np.ndarray, **extra: object) -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}], **extra}


@pytest.mark.parametrize(("first", "second"), [
    (("/v1/predict", {"mode": "probs"}, {}), ("/v1/predict", {"mode": "label"}, {})),
    (("/v1/predict", {}, {}), ("/v1/predict", {}, {"Accept": "application/x-npy"})),
    (("/v1/explain", {"method": "smoothgrad", "sigma": 0.1, "n_samples": 2}, {}),
     ("/v1/explain", {"method": "smoothgrad", "sigma": 0.2, "n_samples": 2}, {})),
    (("/v1/explain", {"target": 1}, {}), ("/v1/explain", {"target": 2}, {})),
    (("/v1/explain", {}, {}), ("/v1/predict", {}, {})),
    (("/v1/predict", {}, {}), ("/v2/models/model/infer", {}, {})),
    (("/v2/models/model/infer", {"outputs": [{"name": "probs"}]}, {}),
     ("/v2/models/model/infer", {"outputs": [{"name": "logits"}]}, {})),
], ids=["mode", "accept", "sigma", "target", "endpoint", "v1-to-v2", "v2-output"])
def test_idempotency_key_reused_for_a_different_request_is_422(client, first, second):
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    statuses, charged = [], []
    for path, fields, headers in (first, second):
        doc = v2_body(x, **fields) if path.startswith("/v2") else {"inputs": x.tolist(), **fields}
        before = sum(used(client).values())
        r = client.post(path, json=doc, headers=THIRD | headers | {"Idempotency-Key": "same-key"})
        statuses.append(r.status_code)
        charged.append(sum(used(client).values()) - before)
    assert statuses == [200, 422] and charged[1] == 0, statuses
    r_doc = r.json()
    message = r_doc.get("detail") or r_doc.get("error")
    assert "different request" in message and "Idempotency-Key" in message
    # the identical request is still replayed, uncharged
    path, fields, headers = first
    doc = v2_body(x, **fields) if path.startswith("/v2") else {"inputs": x.tolist(), **fields}
    again = client.post(path, json=doc, headers=THIRD | headers | {"Idempotency-Key": "same-key"})
    assert again.status_code == 200 and again.headers["x-stealkit-replayed"] == "1"
    assert sum(used(client).values()) == charged[0]


def test_exhausted_key_is_refused_before_the_body_is_read(client):
    pulled = []

    def body() -> Iterator[bytes]:
        pulled.append(1)
        yield b'{"inputs": ' + str(X["inputs"]).encode() + b"}"

    r = client.post("/v1/predict", content=body(), headers={"Authorization": f"Bearer {BROKE}",
                                                             "Content-Type": "application/json"})
    assert r.status_code == 402 and r.json()["error"] == "budget_exhausted"
    assert not pulled


def test_two_keys_at_their_share_leave_room_for_others(client):
    """Two hostile keys each at their in-flight share (body reads pending) leave slots for a third key."""
    quota, inflight = client.app.state.quota, client.app.state.inflight
    held = []
    for key in ("hostile", "honest"):
        while quota.try_acquire(key):
            assert inflight.acquire(blocking=False)
            held.append(key)
    try:
        r = client.post("/v1/predict", json=X, headers={"Authorization": f"Bearer {HOSTILE}"})
        assert r.status_code == 429 and r.json()["error"] == "too_many_in_flight"
        r = client.post("/v1/predict", json=X, headers={"Authorization": "Bearer third-Mn7bV5cX3zL1kJ9hG8f"})
        assert r.status_code == 200
    finally:
        for key in held:
            quota.release(key)
            inflight.release()


def test_repeated_log_lines_are_folded():
    f = RepeatFilter(window=60)
    records = [logging.LogRecord("asyncio", logging.ERROR, "", 0, "socket.accept() out of system resource", (),
                                 None) for _ in range(1000)]
    assert sum(f.filter(r) for r in records) == 1


@pytest.mark.parametrize(("host", "trusted", "ok"), [("10.1.2.3", ("10.0.0.0/8",), True), ("10.1.2.3", (), False),
                                                     ("192.168.0.1", ("10.0.0.0/8", "192.168.0.1"), True),
                                                     ("127.0.0.1", ("10.0.0.0/8",), False)])
def test_trusted_proxies_match_addresses_and_networks(host, trusted, ok):
    assert trusted_match(host, trusted) is ok


# -- point 5: malformed v2 requests are one-line 400s, never a 500 -------------------------------------------


def _v2_doc(**spec: object) -> dict[str, object]:
    tensor = {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64} | spec
    return {"inputs": [tensor]}


@pytest.mark.parametrize(("doc", "header_length"), [
    (_v2_doc(), "9" * 5000), (_v2_doc(), "\u00b2"), (_v2_doc(), "-1"), (_v2_doc(), "1e3"),
    (_v2_doc(datatype=["FP32"]), None), (_v2_doc(datatype={"a": 1}), None), (_v2_doc(datatype=7), None),
    (_v2_doc(name=["input"]), None), (_v2_doc(name={"x": 1}), None),
    (_v2_doc(shape=[10**400, 1, 8, 8]), None), (_v2_doc(shape=[1, 1, 8, 2**70]), None),
    (_v2_doc(parameters={"binary_data_size": [1]}), None), (_v2_doc(parameters={"binary_data_size": 2**70}), None),
    ({"inputs": [_v2_doc()["inputs"][0]], "outputs": [{"name": ["probs"]}]}, None),
    ({"inputs": [_v2_doc()["inputs"][0]], "outputs": [{"name": "probs", "parameters": []}]}, None),
    ({"inputs": [_v2_doc()["inputs"][0]], "parameters": {"binary_data_output": {"a": 1}}}, None),
    ({"inputs": [_v2_doc()["inputs"][0]], "id": ["x"]}, None),
])
def test_malformed_v2_requests_are_400s(client, doc, header_length):
    before = used(client)
    head = json.dumps(doc).encode()
    headers = THIRD | {"Content-Type": "application/json"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = header_length.encode()  # type: ignore[assignment]
    r = client.post("/v2/models/model/infer", content=head, headers=headers)
    assert r.status_code in (400, 413), r.text
    message = r.json()["error"]
    assert isinstance(message, str) and "\n" not in message and "Traceback" not in message
    assert used(client) == before


def test_malformed_v2_explain_parameters_are_400s(client):
    for params in ({"method": ["smoothgrad"]}, {"n_samples": "9" * 5000},
                   {"sigma": [0.1]}, {"output": {"a": 1}}, {"target": [[1]]}, {"target": True}):
        r = client.post("/v2/models/model-explain/infer", json=_v2_doc() | {"parameters": params}, headers=THIRD)
        assert r.status_code == 400, (params, r.text)


# -- point 3: junk bodies are read without a Python object per number -------------------------------------


def _json_body(pixel: bytes, batch: int = 2048) -> bytes:
    image = b"[[" + b"],[".join([b",".join([pixel] * 8)] * 8) + b"]]"
    return b'{"inputs": [' + b",".join([b"[" + image + b"]"] * batch) + b"]}"


@pytest.mark.parametrize("pixel", [b"0.5", b"2.5"], ids=["valid", "out-of-range"])
def test_a_json_body_costs_a_few_times_its_size(pixel):
    """Python floats and list slots cost ~13x a body of short numbers (json.loads); the vectorised reader
    keeps the peak of traced allocations under 6x."""
    import tracemalloc

    from stealkit.errors import InputError
    from stealkit.serve import payloads

    body = _json_body(pixel)
    tracemalloc.start()
    try:
        with contextlib.suppress(InputError):
            payloads.decode_json(body, (1, 8, 8), max_batch=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * len(body), peak / len(body)


def test_numeric_arrays_read_exactly_as_json_does():
    from stealkit.serve import jsonscan

    x = np.random.default_rng(3).random((5, 1, 8, 8))
    text = json.dumps({"inputs": x.tolist(), "target": [1, 2, 3], "mode": "probs", "v": [True, None, "a"]})
    got = jsonscan.loads(text.encode())
    ref = json.loads(text)
    assert np.array_equal(got["inputs"].astype(np.float32), np.array(ref["inputs"]).astype(np.float32))
    assert got["target"].dtype == np.int64 and got["target"].tolist() == [1, 2, 3]
    assert got["mode"] == "probs" and got["v"] == [True, None, "a"]


@pytest.mark.parametrize("text", [b"[1 2]", b"[1,,2]", b"[1,2,]", b"[,1]", b"[-,1]", b"[1-2]", b"[+1]", b"[.5]",
                                  b"[1e]", b"[[1],[2,3]]", b"[1,[2]]", b"[[1,2],[3,4]", b"[1]]", b'[["a"]]',
                                  b"[NaN]", b"[" * 40 + b"]" * 40, b'{"a":' * 40 + b"1" + b"}" * 40,
                                  b"[99999999999999999999]", b"[0x10]", b'{"a": 1,}', b'"\xff"'])
def test_malformed_json_is_one_input_error(text):
    from stealkit.errors import InputError
    from stealkit.serve import jsonscan

    with pytest.raises(InputError):
        jsonscan.loads(text)


# -- point 6: a keys file that could only fail is refused at start-up, in one line ----------------------------


@pytest.mark.parametrize("text", [
    'x = ' + "[" * 3000 + "]" * 3000 + '\n',
    'x = ' + "{a = " * 3000 + "1" + "}" * 3000 + '\n',
    'x = ' + "[" * 20 + "]" * 20 + '\n',
])
def test_a_deeply_nested_keys_file_is_one_line_at_start_up(victim, tmp_path, capsys, text):
    from stealkit.cli import main

    (tmp_path / "keys.toml").write_text(text)
    code = main(["serve", "--model", str(victim), "--keys", str(tmp_path / "keys.toml"),
                 "--db", str(tmp_path / "db.sqlite")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err[:300]
    assert "deep" in err


@pytest.mark.parametrize("spec", ["noise:sigma=inf", "noise:sigma=1e308", "noise:sigma=nan", "round:decimals=100000",
                                  "round:decimals=-1", "reverse_sigmoid:beta=inf", "reverse_sigmoid:gamma=1e308",
                                  "topk:k=10000000000", "noise:sigma=0.1,seed=-1"])
def test_defence_parameters_must_be_finite_and_sane(spec):
    from stealkit.errors import InputError
    from stealkit.serve.keys import parse_keys

    with pytest.raises(InputError, match=r"key #1 \('alice'\): defences: .* must be") as exc:
        parse_keys({"key": [{"key": HONEST, "name": "alice", "defences": [spec]}]})
    assert "\n" not in str(exc.value)


# -- point 8: v2 tensor data are numbers of the declared datatype, sent one way --------------------------------


@pytest.mark.parametrize("spec", [
    {"data": ["0.5"] * 64}, {"data": [True] * 64}, {"data": [[0.5] * 8] * 7 + [["0.5"] * 8]},
    {"data": [0.5] * 63 + [None]},
])
def test_v2_data_must_be_numbers(client, spec):
    before = used(client)
    r = client.post("/v2/models/model/infer", json=_v2_doc(**spec), headers=THIRD)
    assert r.status_code == 400 and "\n" not in r.json()["error"], r.text
    assert used(client) == before


def test_v2_integer_tensors_hold_integers(client):
    doc = _v2_doc()
    doc["inputs"].append({"name": "target", "shape": [1], "datatype": "INT64", "data": [1.5]})
    r = client.post("/v2/models/model-explain/infer", json=doc, headers=THIRD)
    assert r.status_code == 400 and "integers" in r.json()["error"]


def test_v2_tensor_sent_both_as_data_and_binary_is_refused(client):
    raw = np.full((1, 1, 8, 8), 0.5, np.float32).tobytes()
    head = json.dumps(_v2_doc(parameters={"binary_data_size": len(raw)})).encode()
    r = client.post("/v2/models/model/infer", content=head + raw,
                    headers=THIRD | {"Inference-Header-Content-Length": str(len(head)),
                                     "Content-Type": "application/octet-stream"})
    assert r.status_code == 400 and "both" in r.json()["error"]


# -- point 9: the failed-key throttle --------------------------------------------------------------------------


def test_a_guesser_on_a_shared_address_does_not_lock_out_its_tenants(client, monkeypatch):
    from stealkit.serve import limits

    monkeypatch.setattr(limits, "_now", lambda: 1000.0)  # no refill between requests
    assert client.get("/v1/info", headers={"Authorization": f"Bearer {HONEST}"}).status_code == 200
    codes = [client.get("/v1/info", headers={"Authorization": f"Bearer guess-{i}"}).status_code for i in range(30)]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
    assert client.post("/v1/predict", json=X, headers={"Authorization": f"Bearer {HONEST}"}).status_code == 200
    # a right key never seen from this address gets the guesser's answer: no oracle for guesses
    assert client.get("/v1/info", headers={"Authorization": f"Bearer {HOSTILE}"}).status_code == 429


def test_forwarded_for_is_not_believed_from_an_untrusted_peer(server):
    """From loopback, which uvicorn trusts by default (runs last: it throttles 127.0.0.1 for guesses)."""
    url, _ = server
    codes = []
    with httpx.Client(base_url=url, timeout=GUARD_S, transport=httpx.HTTPTransport(local_address="127.0.0.1")) as c:
        for i in range(25):
            codes.append(c.get("/v1/info", headers={"Authorization": f"Bearer guess-{i}",
                                                    "X-Forwarded-For": f"10.0.{i}.1"}).status_code)
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}


# -- point 10: a charge is settled once the answer is handed to the connection ----------------------------------


def _asgi_query(app, *, disconnect_early: bool, fail_send: bool = False, seen: list | None = None) -> list[dict]:
    """Drive the ASGI app directly: a /v1/predict whose client is gone before the answer (``disconnect_early``)
    or whose connection fails while the body is sent (``fail_send``)."""
    import asyncio

    body = json.dumps(X).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/predict", "raw_path": b"/v1/predict",
             "query_string": b"", "root_path": "", "client": ("127.0.0.9", 5000), "server": ("testserver", 80),
             "headers": [(b"authorization", f"Bearer {HONEST}".encode()), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())], "state": {}}
    sent: list[dict] = []

    async def run() -> None:
        done = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            if not disconnect_early:
                await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                if seen is not None:
                    seen.append(app.state.service.store.log_rows("honest")[-1]["status"])
                if fail_send:
                    raise OSError("connection reset")
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        with contextlib.suppress(OSError):
            await app(scope, receive, send)

    asyncio.run(run())
    return sent


def test_an_answer_whose_client_left_is_never_charged(client):
    """The client is gone as soon as its body is in: its work stops before any reservation (issue 51 item 1;
    a client that leaves later is refunded: tests/test_serve_cancel.py)."""
    sent = _asgi_query(client.app, disconnect_early=True)
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent)  # no answer
    assert client.app.state.service.store.log_rows("honest") == []
    assert used(client, "honest") == {"predict": 0, "explain": 0}


def test_an_answer_whose_send_fails_is_refunded(client):
    _asgi_query(client.app, disconnect_early=False, fail_send=True)
    row = client.app.state.service.store.log_rows("honest")[-1]
    assert row["status"] == "refunded" and "OSError" in row["note"]
    assert used(client, "honest") == {"predict": 0, "explain": 0}


def test_the_charge_is_settled_after_the_answer_is_sent(client):
    seen: list[str] = []
    sent = _asgi_query(client.app, disconnect_early=False, seen=seen)
    assert sent[0]["status"] == 200 and seen == ["reserved"]  # not yet settled while the body is handed over
    assert client.app.state.service.store.log_rows("honest")[-1]["status"] == "answered"
    assert used(client, "honest") == {"predict": 1, "explain": 0}
    assert all(a["consistent"] for a in client.app.state.service.store.audit().values())
