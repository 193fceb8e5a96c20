"""Issue 18, items 7, 8, 9, 12, 13: what a request may cost before it is charged, /metrics behind its own
credential (aggregated over workers), fair sharing between tenants, and an OpenAPI schema that says what
the server accepts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.errors import InputError
from stealkit.serve import payloads
from stealkit.serve.app import create_app
from stealkit.serve.limits import FairScheduler
from tests.test_serve_support import make_victim, write_keys

KEY = "limits-Zx81QpLw6RtV3mNb7Yc4"
UNNAMED = "unnamed-Qw3eR5tY7uI9oP1aS2"
METRICS_KEY = "metrics-Ab3dE6gH9jK2mN5pQ7"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


def app(victim: Path, tmp_path: Path, **model: object) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "tenant", "budget": 100},
                                               {"key": UNNAMED, "mode": "label"}], model=model or None)
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite", max_inflight=2))


# -- item 7: bounded before it is charged ------------------------------------------------------------------


def test_default_body_limit_follows_the_largest_legal_batch(victim: Path, tmp_path: Path):
    client = app(victim, tmp_path, max_batch=16)
    assert client.get("/v1/info", headers=AUTH).json()["max_body_bytes"] == 16 * 64 * 8 + 64 * 1024
    r = client.post("/v1/predict", content=b" " * (60 * 2**20), headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "too_large"


def test_unknown_json_field_is_refused_before_its_value_is_parsed():
    body = b'{"inputs": [[[[0.5]]]], "junk": [' + b"1.0, " * 1000 + b"this is not JSON"
    with pytest.raises(InputError, match="unknown field 'junk'"):
        payloads.parse_json_object(body, frozenset({"inputs", "mode"}))
    with pytest.raises(InputError, match="not valid JSON"):
        payloads.parse_json_object(body)  # without the field check the whole value is parsed


def test_body_reads_wait_for_the_in_flight_bound(victim: Path, tmp_path: Path):
    client = app(victim, tmp_path)
    inflight = client.app.state.inflight
    assert inflight.acquire(blocking=False) and inflight.acquire(blocking=False)
    try:
        r = client.post("/v1/predict", json={"inputs": np.zeros((1, 1, 8, 8)).tolist()}, headers=AUTH)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    finally:
        inflight.release()
        inflight.release()
    assert client.get("/v1/info", headers=AUTH).json()["queries_used"]["predict"] == 0


# -- item 8: /metrics has its own credential and no key-derived labels -------------------------------------


def test_metrics_need_their_own_key(victim: Path, tmp_path: Path):
    assert app(victim, tmp_path).get("/metrics").status_code == 403  # no metrics_key: off
    (tmp_path / "m").mkdir()
    client = app(victim, tmp_path / "m", metrics_key=METRICS_KEY)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=AUTH).status_code == 401  # a tenant's key is not the metrics key
    client.post("/v1/predict", json={"inputs": np.zeros((1, 1, 8, 8)).tolist()},
                headers={"Authorization": f"Bearer {UNNAMED}"})
    text = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).text
    assert 'stealkit_queries_served_total{key="key2",kind="predict"} 1.0' in text  # the entry's position
    assert "pid=" not in text


# -- item 12: one aggregated series per metric across workers ----------------------------------------------

WORKER = """
import sys
from stealkit.serve.metrics import Metrics
m = Metrics()
m.observe("/v1/predict", 200, 0.01)
m.refuse("tenant", "budget_exhausted")
if sys.argv[1] == "render":
    print(m.render(dict).decode())
"""


@pytest.mark.slow  # two workers started and scraped: about 7 s
def test_workers_export_one_aggregated_series(tmp_path: Path):
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for arg in ("a", "b", "render"):
        out = subprocess.run([sys.executable, "-c", WORKER, arg], env=env, capture_output=True, text=True, check=True)
    text = out.stdout
    assert 'stealkit_requests_total{endpoint="/v1/predict",status="200"} 3.0' in text
    assert 'stealkit_requests_refused_total{key="tenant",reason="budget_exhausted"} 3.0' in text
    assert 'stealkit_request_latency_seconds_count{endpoint="/v1/predict"} 3.0' in text and "pid" not in text


# -- item 9: fair scheduling ------------------------------------------------------------------------------


def test_a_flooding_key_leaves_a_slot_for_another():
    async def scenario() -> list[str]:
        sched, order, release = FairScheduler(slots=2), [], asyncio.Event()

        async def job(key: str, i: int) -> None:
            async with sched.slot(key):
                order.append(f"{key}{i}")
                if key == "flood":
                    await release.wait()

        floods = [asyncio.create_task(job("flood", i)) for i in range(10)]
        await asyncio.sleep(0)
        other = asyncio.create_task(job("quiet", 0))
        await asyncio.wait_for(other, timeout=5)  # served while every flood job still holds or waits
        release.set()
        await asyncio.gather(*floods)
        return order

    order = asyncio.run(scenario())
    assert order[:2] == ["flood0", "quiet0"] and len(order) == 11


def test_scheduler_serves_waiting_keys_round_robin():
    async def scenario() -> list[str]:
        sched, order = FairScheduler(slots=1), []

        async def job(key: str, i: int) -> None:
            async with sched.slot(key):
                order.append(f"{key}{i}")
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(job("a", i)) for i in range(3)] + [asyncio.create_task(job("b", 0))]
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a0", "b0", "a1", "a2"]


# -- item 13: the schema says what the server accepts ----------------------------------------------------


def test_openapi_describes_valid_bodies(victim: Path, tmp_path: Path):
    schema = app(victim, tmp_path, max_batch=16).get("/openapi.json").json()
    body = schema["paths"]["/v1/explain"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    inputs = body["properties"]["inputs"]
    assert inputs["minItems"] == 1 and inputs["maxItems"] == 16 and "[B][1][8][8]" in inputs["description"]
    image = inputs["items"]
    assert (image["minItems"], image["items"]["minItems"], image["items"]["items"]["minItems"]) == (1, 8, 8)
    assert body["additionalProperties"] is False and body["properties"]["sigma"]["maximum"] == 10
    assert body["properties"]["n_samples"]["maximum"] == 256
    predict = schema["paths"]["/v1/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(predict["properties"]) == {"inputs", "mode"}
    assert json.dumps(schema)  # serialisable


def test_one_key_cannot_hold_the_whole_in_flight_bound(victim: Path, tmp_path: Path):
    """max_inflight=2 leaves one key at most 1 request in flight; another key still gets in."""
    client = app(victim, tmp_path)
    quota = client.app.state.quota
    assert quota.per_key == 1 and quota.try_acquire("tenant")  # the tenant has one request in flight
    try:
        x = {"inputs": np.zeros((1, 1, 8, 8)).tolist()}
        r = client.post("/v1/predict", json=x, headers=AUTH)
        assert r.status_code == 429 and r.json()["error"] == "too_many_in_flight"
        assert client.post("/v1/predict", json=x, headers={"Authorization": f"Bearer {UNNAMED}"}).status_code == 200
    finally:
        quota.release("tenant")
    assert client.post("/v1/predict", json=x, headers=AUTH).status_code == 200
