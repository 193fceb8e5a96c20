"""Issue 18, items 1, 2, 4, 5: an answer is charged only if it can be delivered, every response is counted,
retries are never paid twice, and a request refused for budget costs no model time."""

from __future__ import annotations

import io
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from stealkit.errors import StealkitError
from stealkit.oracle.http import HttpOracle
from stealkit.serve.app import create_app
from tests.test_serve_support import make_victim, write_keys

KEY = "charge-Zx81QpLw6RtV3mNb7Yc4"
SMALL = "small-Zx81QpLw6RtV3mNb7Yc4"
METRICS_KEY = "metrics-Ab3dE6gH9jK2mN5pQ7"
KEYS = [{"key": KEY, "name": "charged", "mode": "probs", "budget": 1000, "explain": True},
        {"key": SMALL, "name": "small", "mode": "probs", "budget": 5}]
NPY = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


@pytest.fixture()
def client(victim: Path, tmp_path: Path) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", KEYS, model={"max_batch": 64, "max_body_mb": 0.05,
                                                           "metrics_key": METRICS_KEY})
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite"), raise_server_exceptions=False)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def images(n: int) -> np.ndarray:
    return np.random.default_rng(0).random((n, 1, 8, 8), dtype=np.float32)


def used(client: TestClient, key: str = KEY) -> dict[str, int]:
    return client.get("/v1/info", headers=auth(key)).json()["queries_used"]


def metrics(client: TestClient) -> str:
    return client.get("/metrics", headers=auth(METRICS_KEY)).text


def consistent(client: TestClient) -> bool:
    return all(a["consistent"] for a in client.app.state.service.store.audit().values())


# -- item 1: a charged answer never becomes a 500 ---------------------------------------------------------


def test_huge_sigma_is_a_400_naming_it_and_costs_nothing(client):
    r = client.post("/v1/explain", json={"inputs": images(1).tolist(), "method": "smoothgrad", "sigma": 3e38,
                                         "output": "prob"}, headers=auth(KEY))
    assert r.status_code == 400 and "sigma" in r.json()["detail"], r.text
    assert used(client) == {"predict": 0, "explain": 0}


def test_undeliverable_answer_is_refunded_logged_and_500(client, monkeypatch):
    service = client.app.state.service
    monkeypatch.setattr(service, "answer", lambda key, q: (torch.full((q.n, 10), math.nan), None))
    r = client.post("/v1/predict", content=npy(images(3)), headers=auth(KEY) | NPY)
    assert r.status_code == 500 and r.json()["error"] == "internal_error" and "not charged" in r.json()["detail"]
    assert used(client) == {"predict": 0, "explain": 0} and consistent(client)
    (row,) = service.store.log_rows("charged")
    assert row["status"] == "refunded" and "non-finite" in row["note"] and row["n"] == 3


# -- item 2: every response counted once -----------------------------------------------------------------


def test_500_and_413_are_counted(client, monkeypatch):
    monkeypatch.setattr(client.app.state.service, "answer", lambda key, q: (torch.full((q.n, 10), math.inf), None))
    assert client.post("/v1/predict", content=npy(images(1)), headers=auth(KEY) | NPY).status_code == 500
    assert client.post("/v1/predict", content=b"\0" * 2**17, headers=auth(KEY) | NPY).status_code == 413
    text = metrics(client)
    assert 'stealkit_requests_total{endpoint="/v1/predict",status="500"} 1.0' in text
    assert 'stealkit_requests_total{endpoint="/v1/predict",status="413"} 1.0' in text
    assert 'stealkit_requests_refused_total{key="charged",reason="too_large"} 1.0' in text


# -- item 4: reconciliation --------------------------------------------------------------------------------


def test_idempotency_key_answers_a_retry_from_the_log(client):
    headers = auth(KEY) | NPY | {"Idempotency-Key": "req-1"}
    first = client.post("/v1/predict", content=npy(images(4)), headers=headers)
    again = client.post("/v1/predict", content=npy(images(4)), headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again.headers["x-stealkit-replayed"] == "1"
    assert used(client) == {"predict": 4, "explain": 0}
    charges = client.get("/v1/charges", headers=auth(KEY)).json()["charges"]
    assert [(c["request_id"], c["n"], c["status"]) for c in charges] == [("req-1", 4, "answered")]


class DropFirstAnswer(httpx.BaseTransport):
    """Forwards to the app, but loses the first query's response (the connection dropped after the server
    answered and charged it)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.dropped = inner, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == "/v1/predict" and not self.dropped:
            response.read()
            self.dropped += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_http_oracle_retry_after_a_dropped_connection_is_not_paid_twice(client):
    transport = DropFirstAnswer(client._transport)
    oracle = HttpOracle("http://testserver", key=KEY, transport=transport, backoff=0.0)
    out = oracle.query(torch.from_numpy(images(5)))
    assert out.shape == (5, 10) and transport.dropped == 1
    assert oracle.ledger.as_dict() == used(client) == {"predict": 5, "explain": 0}


def test_http_oracle_counts_what_the_server_billed_when_retries_run_out(client):
    class AlwaysDrop(DropFirstAnswer):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            self.dropped = 0
            return super().handle_request(request)

    oracle = HttpOracle("http://testserver", key=KEY, transport=AlwaysDrop(client._transport), retries=2,
                        backoff=0.0)
    with pytest.raises(StealkitError, match="billed 2 predict"):
        oracle.query(torch.from_numpy(images(2)))
    assert oracle.ledger.as_dict() == used(client) == {"predict": 2, "explain": 0}


def test_http_oracle_refunds_a_500(client, monkeypatch):
    monkeypatch.setattr(client.app.state.service, "answer", lambda key, q: (torch.full((q.n, 10), math.nan), None))
    oracle = HttpOracle("http://testserver", key=KEY, transport=client._transport, retries=1, backoff=0.0)
    with pytest.raises(StealkitError, match="500"):
        oracle.query(torch.from_numpy(images(2)))
    assert oracle.ledger.as_dict() == used(client) == {"predict": 0, "explain": 0}


# -- item 5: reserve before computing --------------------------------------------------------------------


def test_budget_is_reserved_before_the_model_runs(client, monkeypatch):
    """While one request computes, its images are already charged: a second one that does not fit is
    refused without running the model."""
    service = client.app.state.service
    real, calls, inner = service.answer, [], []

    def answer(key, q):
        calls.append(q.n)
        if len(calls) == 1:
            assert service.store.usage("small").predict == 4  # reserved before the work
            try:
                service.query(key, "predict", npy(images(2)), "application/x-npy", {}, None, None)
            except Exception as exc:  # noqa: BLE001
                inner.append(getattr(exc, "status", None))
        return real(key, q)

    monkeypatch.setattr(service, "answer", answer)
    r = client.post("/v1/predict", content=npy(images(4)), headers=auth(SMALL) | NPY)
    assert r.status_code == 200 and inner == [402] and calls == [4]
    assert used(client, SMALL) == {"predict": 4, "explain": 0} and consistent(client)


def test_recover_refunds_reservations_a_crash_left(client):
    store = client.app.state.service.store
    res = store.reserve("charged", "predict", 7, mode="probs", input_digest="x")
    assert store.usage("charged").predict == 7
    assert store.recover() == 1
    assert store.usage("charged").predict == 0 and store.log_rows("charged")[0]["status"] == "refunded"
    assert res.row_id and consistent(client)


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "before=0", "before=99999999999999999999999"])
def test_charges_listing_refuses_bad_paging(client, query):
    r = client.get(f"/v1/charges?{query}", headers=auth(KEY))
    assert r.status_code == 400 and r.json()["error"] == "bad_input"


def test_http_oracle_pays_the_servers_smoothgrad_price(client):
    """Item 9's price (one explain query per SmoothGrad sample) is what the client's ledger counts too."""
    oracle = HttpOracle("http://testserver", key=KEY, transport=client._transport)
    out = oracle.explain(torch.from_numpy(images(2)), "smoothgrad", n_samples=3, sigma=0.05)
    assert out.shape == (2, 1, 8, 8)
    assert oracle.ledger.as_dict() == used(client) == {"predict": 0, "explain": 6}


def test_idempotency_key_reused_for_another_request_is_refused(client):
    headers = auth(KEY) | NPY | {"Idempotency-Key": "req-2"}
    assert client.post("/v1/predict", content=npy(images(2)), headers=headers).status_code == 200
    r = client.post("/v1/predict", content=npy(images(3)), headers=headers)
    assert r.status_code == 422 and "different request" in r.json()["detail"]
    assert used(client) == {"predict": 2, "explain": 0}
