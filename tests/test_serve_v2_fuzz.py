"""Hypothesis fuzzing of the v2 routes: malformed v2 requests (JSON and binary tensors, bent shapes, datatypes,
names, parameters, header lengths) get a 4xx ``{"error": ...}`` answer, never a 5xx, and nothing refused is
charged."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stealkit.serve.app import create_app
from stealkit.serve.limits import AuthThrottle
from tests.test_serve_fuzz import assert_nothing_refused_was_charged, json_values, pixel
from tests.test_serve_support import make_victim, write_keys

KEYS = [{"key": "probs-key-Zx81QpLw6RtV3mNb7Yc4", "name": "probs", "mode": "probs", "budget": 300, "explain": True},
        {"key": "label-key-Zx81QpLw6RtV3mNb7Yc4", "name": "labels", "mode": "label"}]
PATHS = ["/v2/models/digits/infer", "/v2/models/digits-explain/infer", "/v2/models/nope/infer", "/v2/models/digits"]
NAMES = st.sampled_from(["input", "target", "x", "", None])
DATATYPES = st.sampled_from(["FP32", "FP64", "FP16", "INT64", "INT32", "BYTES", "fp32", None, 3])
SHAPES = st.one_of(st.just([2, 1, 8, 8]), st.just([1, 1, 8, 8]), st.just([2]),
                   st.lists(st.one_of(st.integers(-2, 9), st.text(max_size=1), st.booleans()), max_size=5))
OUTPUTS = st.one_of(st.none(), st.lists(st.fixed_dictionaries({"name": st.sampled_from(
    ["probs", "label", "logits", "topk", "explanation", "x"])}, optional={"parameters": json_values}), max_size=2))
PARAMETERS = st.one_of(st.none(), st.dictionaries(st.sampled_from(
    ["binary_data_output", "method", "output", "n_samples", "sigma", "target", "priority"]),
    st.one_of(json_values, st.sampled_from(["gradient", "smoothgrad", "logit", "prob", 5, 0.1, True])), max_size=3))


@st.composite
def tensor(draw: st.DrawFn) -> tuple[dict, bytes]:
    shape = draw(SHAPES)
    spec = {"name": draw(NAMES), "shape": shape, "datatype": draw(DATATYPES)}
    n = int(np.prod(shape)) if all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape) else 3
    n = min(n, 300)
    if draw(st.booleans()):  # binary tensor extension, sometimes with a lying size
        raw = draw(st.one_of(st.just(np.full(n, 0.5, "<f4").tobytes()), st.binary(max_size=64)))
        spec["parameters"] = {"binary_data_size": draw(st.one_of(st.just(len(raw)), st.integers(-1, 5000)))}
        return spec, raw
    spec["data"] = draw(st.one_of(st.lists(st.floats(0, 1), min_size=n, max_size=n), st.lists(pixel, max_size=8),
                                  json_values))
    return spec, b""


@st.composite
def v2_requests(draw: st.DrawFn) -> dict:
    parts = draw(st.lists(tensor(), max_size=3))
    doc: dict = {"inputs": [spec for spec, _ in parts]}
    for field, strategy in (("outputs", OUTPUTS), ("parameters", PARAMETERS), ("id", st.text(max_size=4))):
        value = draw(strategy)
        if value is not None:
            doc[field] = value
    if draw(st.integers(0, 9)) == 0:
        doc["unexpected"] = 1
    head = json.dumps(doc, allow_nan=True).encode()
    raw = b"".join(r for _, r in parts)
    headers = {"Authorization": "Bearer " + draw(st.sampled_from([k["key"] for k in KEYS] + ["wrong"]))}
    if raw or draw(st.booleans()):
        headers["Inference-Header-Content-Length"] = draw(st.one_of(st.just(str(len(head))), st.sampled_from(
            ["-1", "x", "999999", "0"])))
    headers["Content-Type"] = draw(st.sampled_from(["application/json", "application/octet-stream", "text/plain"]))
    return {"method": "POST", "url": draw(st.sampled_from(PATHS)), "headers": headers, "content": head + raw}


@st.composite
def valid_requests(draw: st.DrawFn) -> dict:
    """Well-formed requests (JSON or binary), so that answers are charged and counted too."""
    n = draw(st.integers(1, 3))
    x = np.full((n, 1, 8, 8), draw(st.floats(0, 1)), "<f4")
    spec: dict = {"name": "input", "shape": [n, 1, 8, 8], "datatype": "FP32"}
    raw = b""
    if draw(st.booleans()):
        raw = x.tobytes()
        spec["parameters"] = {"binary_data_size": len(raw)}
    else:
        spec["data"] = x.reshape(-1).tolist()
    head = json.dumps({"inputs": [spec], "outputs": [{"name": draw(st.sampled_from(["label", "probs"]))}]}).encode()
    headers = {"Authorization": f"Bearer {KEYS[0]['key']}", "Content-Type": "application/json"}
    if raw:
        headers["Inference-Header-Content-Length"] = str(len(head))
    return {"method": "POST", "url": PATHS[0], "headers": headers, "content": head + raw}


@pytest.fixture()
def client(tmp_path: Path) -> TestClient:
    victim = make_victim(tmp_path.parent / "fuzz-victim")
    keys = write_keys(tmp_path / "keys.toml", KEYS, model={"max_batch": 64, "max_body_mb": 0.5})
    app = create_app(victim, keys, tmp_path / "db.sqlite", protocol="v2", model_name="digits")
    app.state.service.auth_throttle = AuthThrottle(rate=1e6, burst=1e9)
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.slow
def test_fuzz_v2(client: TestClient):
    statuses: Counter[int] = Counter()
    answered = [0]

    @given(st.one_of(v2_requests(), valid_requests()))
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(req: dict) -> None:
        r = client.request(**req)
        statuses[r.status_code] += 1
        assert r.status_code < 500, (req, r.status_code, r.text[:500])
        if r.status_code >= 400:
            assert isinstance(r.json().get("error"), str) and r.json().get("code")
        elif req["url"].endswith("/infer"):
            answered[0] += int(r.headers["x-stealkit-cost"])

    run()
    print(f"v2 fuzz statuses: {dict(sorted(statuses.items()))}, queries charged {answered[0]}")
    assert_nothing_refused_was_charged(client, answered)
    assert statuses[200] > 0 and sum(n for s, n in statuses.items() if 400 <= s < 500) > 0
