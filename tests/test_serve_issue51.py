"""Issue 51: paid answers never lost, deadlines nothing resets, and the smaller points (item 6).

In process (``TestClient``) where the app decides; over raw sockets against a live ``stealkit serve`` where the
connection layer does (the header and body deadlines). No test asserts a duration: each asserts states, counts
or a connection the server closed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.serve import limits
from stealkit.serve.app import create_app
from tests.test_serve_support import make_victim, write_keys

PAID = "paid-Zx81QpLw6RtV3mNb7Yc4Lk"
SLOW = "slow-Qw3eR5tY7uI9oP1aS2dF6g"
KEYS = [{"key": PAID, "name": "paid", "mode": "probs", "budget": 2, "explain": True},
        {"key": SLOW, "name": "slow", "mode": "probs", "rate": 1, "image_rate": 2}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def images(n: int, seed: int = 0) -> list:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32).tolist()


def v2_body(x: list) -> dict[str, object]:
    arr = np.asarray(x, dtype=np.float32)
    return {"inputs": [{"name": "input", "shape": list(arr.shape), "datatype": "FP32", "data": arr.ravel().tolist()}]}


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


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
