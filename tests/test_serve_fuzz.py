"""Hypothesis fuzzing of the API: malformed requests of every kind get a 4xx JSON answer, never a 5xx,
and nothing refused is ever charged."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stealkit.serve.app import create_app
from stealkit.serve.limits import AuthThrottle
from tests.test_serve_support import make_victim, write_keys

KEYS = [
    {"key": "probs-key-Zx81QpLw6RtV3mNb7Yc4", "name": "probs", "mode": "probs", "budget": 300, "explain": True},
    {"key": "label-key-Zx81QpLw6RtV3mNb7Yc4", "name": "labels", "mode": "label", "prada": {"delta": 0.95, "min_samples": 10}},
    {"key": "logit-key-Zx81QpLw6RtV3mNb7Yc4", "name": "logits", "mode": "logits", "explain": True, "explain_budget": 50},
]
TOKENS = ["probs-key-Zx81QpLw6RtV3mNb7Yc4", "label-key-Zx81QpLw6RtV3mNb7Yc4", "logit-key-Zx81QpLw6RtV3mNb7Yc4", "wrong", "", "probs-key-Zx81QpLw6RtV3mNb7Yc4\x00", "é"]
PATHS = ["/v1/predict", "/v1/explain", "/v1/info", "/healthz", "/metrics", "/openapi.json", "/v1/", "/v2/predict",
         "/v1/predict/x", "/%00", "/v1/predict?mode=label", "/../etc/passwd", "/v1/charges",
         "/v1/charges?limit=0", "/v1/charges?before=99999999999999999999999", "/v1/charges?limit=x"]
CONTENT_TYPES = ["application/x-npy", "application/json", "application/octet-stream", "text/plain", "",
                 "application/json; charset=utf-8", "multipart/form-data", "application/x-npy; q=1"]
OPTION_KEYS = ["mode", "method", "output", "target", "n_samples", "sigma", "extra"]
OPTION_VALUES = st.one_of(
    st.sampled_from(["label", "topk", "probs", "logits", "gradient", "smoothgrad", "logit", "prob", "LOGITS"]),
    st.integers(-5, 300).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str), st.text(max_size=8))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=30)
pixel = st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 300),
                  st.booleans(), st.text(max_size=2), st.none())


def nested(shape: tuple[int, ...]) -> st.SearchStrategy:
    if not shape:
        return pixel
    return st.lists(nested(shape[1:]), min_size=shape[0], max_size=shape[0])


shapes = st.one_of(st.just((2, 1, 8, 8)), st.just((1, 1, 8, 8)),
                   hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=9))


@st.composite
def json_inputs(draw: st.DrawFn) -> bytes:
    shape = draw(shapes)
    if draw(st.booleans()) and len(shape) == 4 and shape[1:] == (1, 8, 8):
        x = draw(hnp.arrays(np.float64, shape, elements=st.floats(0, 1))).tolist()
        if draw(st.booleans()):  # one bad pixel somewhere
            flat = draw(st.sampled_from([float("nan"), float("inf"), -0.5, 2.0, "x", None, True, [0.5]]))
            x[0][0][draw(st.integers(0, 7))][draw(st.integers(0, 7))] = flat
    else:
        x = draw(nested(shape[:4]) if len(shape) <= 4 else json_values)
    obj = {"inputs": x} | draw(st.dictionaries(st.sampled_from(OPTION_KEYS), json_values | OPTION_VALUES, max_size=3))
    return json.dumps(obj, allow_nan=True).encode()


@st.composite
def npy_inputs(draw: st.DrawFn) -> bytes:
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_, np.complex64,
                                  ">f4", "<f8", "U3", "V4"]))
    shape = draw(shapes)
    arr = np.zeros(shape, dtype=dtype) if np.dtype(dtype).kind in "UV" else draw(hnp.arrays(dtype, shape))
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


bodies = st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()), json_inputs(),
                   npy_inputs(), st.just(b""), st.just(b"\x80\x04\x95" + b"\x00" * 20))


@st.composite
def requests(draw: st.DrawFn) -> dict:
    headers = {}
    token = draw(st.sampled_from([*TOKENS, None]))
    if token is not None:
        prefix = draw(st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
        headers["Authorization"] = (prefix + token).encode("utf-8")  # bytes: non-ASCII keys reach the server
    ct = draw(st.sampled_from([*CONTENT_TYPES, None]))
    if ct is not None:
        headers["Content-Type"] = ct
    if draw(st.booleans()):
        headers["Accept"] = draw(st.sampled_from(["application/x-npy", "application/json", "*/*", "text/html"]))
    return {
        "method": draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH"])),
        "url": draw(st.sampled_from(PATHS)),
        "headers": headers,
        "params": draw(st.dictionaries(st.sampled_from(OPTION_KEYS), OPTION_VALUES, max_size=3)),
        "content": draw(bodies),
    }


def make_client(root: Path) -> tuple[TestClient, list[int]]:
    victim = make_victim(root.parent / "fuzz-victim")
    keys = write_keys(root / "keys.toml", KEYS, model={"max_batch": 64, "max_body_mb": 0.5})
    app = create_app(victim, keys, root / "db.sqlite")
    # the fuzzer sends thousands of wrong keys from one address; throttling them would hide every other path
    app.state.service.auth_throttle = AuthThrottle(rate=1e6, burst=1e9)
    return TestClient(app, raise_server_exceptions=False), [0]


@pytest.fixture()
def app_client(tmp_path: Path) -> tuple[TestClient, list[int]]:
    """A fresh server per test: no test depends on what another one sent."""
    return make_client(tmp_path)


def check(client: TestClient, answered: list[int], req: dict, statuses: Counter[int]) -> None:
    r = client.request(**req)
    statuses[r.status_code] += 1
    assert r.status_code < 500, (req, r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()
        assert isinstance(err.get("error"), str) and err.get("detail")
    elif req["url"].startswith(("/v1/predict", "/v1/explain")):
        if "x-stealkit-cost" in r.headers:
            answered[0] += int(r.headers["x-stealkit-cost"])
        else:
            answered[0] += r.json()["cost"]


def assert_nothing_refused_was_charged(client: TestClient, answered: list[int]) -> None:
    store = client.app.state.service.store
    audit = store.audit()
    assert all(a["consistent"] for a in audit.values())
    assert sum(a["predict_used"] + a["explain_used"] for a in audit.values()) == answered[0]
    assert not [r for r in store.log_rows() if r["status"] == "reserved"]


def fuzz(app_client: tuple[TestClient, list[int]], strategy: st.SearchStrategy, n: int) -> Counter[int]:
    """Send ``n`` drawn requests, then check that exactly the answered ones were charged."""
    statuses: Counter[int] = Counter()

    @given(strategy)
    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(req: dict) -> None:
        check(*app_client, req, statuses)

    run()
    print(f"fuzz statuses: {dict(sorted(statuses.items()))}, queries charged {app_client[1][0]}")
    assert_nothing_refused_was_charged(*app_client)
    return statuses


@pytest.mark.slow
def test_fuzz_quick(app_client):
    fuzz(app_client, requests(), 300)


@pytest.mark.slow
def test_fuzz_thousands(app_client):
    fuzz(app_client, requests(), 4000)


# -- schema-driven: bodies drawn from the server's own OpenAPI schema, then bent ----------------------------

HUGE = st.sampled_from([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e308, 2**64, -1, 0, 1e-300])


def from_schema(schema: dict, max_batch: int = 3) -> st.SearchStrategy:
    """Values valid under a (small subset of) JSON schema: objects, arrays, numbers, integers, enums, oneOf."""
    if "oneOf" in schema:
        return st.one_of([from_schema(s, max_batch) for s in schema["oneOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        required = {k: from_schema(v, max_batch) for k, v in schema["properties"].items() if k in schema["required"]}
        optional = {k: from_schema(v, max_batch) for k, v in schema["properties"].items()
                    if k not in schema["required"]}
        return st.fixed_dictionaries(required, optional=optional)
    if kind == "array":
        lo = schema.get("minItems", 0)
        hi = min(schema.get("maxItems", lo + 3), max(lo, max_batch))
        return st.lists(from_schema(schema["items"], max_batch), min_size=lo, max_size=hi)
    if kind == "number":
        return st.floats(schema.get("minimum", -1e6), schema.get("maximum", 1e6))
    if kind == "integer":
        return st.integers(schema.get("minimum", -1000), schema.get("maximum", 1000))
    return st.text(max_size=5)


@st.composite
def schema_requests(draw: st.DrawFn, schemas: dict[str, dict]) -> dict:
    path = draw(st.sampled_from(sorted(schemas)))
    body = draw(from_schema(schemas[path]))
    for _ in range(draw(st.integers(0, 2))):  # bend it: huge/NaN numbers, wrong types, unknown fields
        field = draw(st.sampled_from(["sigma", "n_samples", "target", "mode", "method", "output", "junk"]))
        body[field] = draw(HUGE | json_values | OPTION_VALUES)
    token = draw(st.sampled_from(["probs-key-Zx81QpLw6RtV3mNb7Yc4", "label-key-Zx81QpLw6RtV3mNb7Yc4",
                                  "logit-key-Zx81QpLw6RtV3mNb7Yc4"]))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if draw(st.booleans()):
        headers["Accept"] = "application/x-npy"
    return {"method": "POST", "url": path, "headers": headers, "content": json.dumps(body, allow_nan=True).encode()}


def openapi_bodies(client: TestClient) -> dict[str, dict]:
    paths = client.get("/openapi.json").json()["paths"]
    return {p: paths[p]["post"]["requestBody"]["content"]["application/json"]["schema"]
            for p in ("/v1/predict", "/v1/explain")}


@pytest.mark.slow
def test_schema_fuzz_quick(app_client):
    statuses = fuzz(app_client, schema_requests(openapi_bodies(app_client[0])), 200)
    assert statuses[200] > 0 and statuses[400] > 0


@pytest.mark.slow
def test_schema_fuzz_thousands(app_client):
    statuses = fuzz(app_client, schema_requests(openapi_bodies(app_client[0])), 3000)
    assert statuses[200] > 0


def test_fuzz_charged_only_answers(app_client):
    """The budget counters equal the queries answered 200 (on a server of its own: no order dependence)."""
    valid = {"inputs": np.full((3, 1, 8, 8), 0.5).tolist()}
    statuses: Counter[int] = Counter()
    for token in ("probs-key-Zx81QpLw6RtV3mNb7Yc4", "label-key-Zx81QpLw6RtV3mNb7Yc4"):
        check(*app_client, {"method": "POST", "url": "/v1/predict", "json": valid,
                            "headers": {"Authorization": f"Bearer {token}"}}, statuses)
    assert statuses == {200: 2} and app_client[1][0] == 6
    assert_nothing_refused_was_charged(*app_client)


def test_oversized_body_refused_without_reading(app_client, tmp_path: Path):
    client, _ = app_client
    r = client.post("/v1/predict", content=b"\x00" * (2**20), headers={"Authorization": "Bearer probs-key-Zx81QpLw6RtV3mNb7Yc4"})
    assert r.status_code == 413 and "limit" in r.json()["detail"]
