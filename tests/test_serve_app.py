"""The API in process (TestClient): auth, modes, answers equal to LocalOracle's, refusals never charged."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from stealkit.models import load_model
from stealkit.oracle import LocalExplanationOracle, LocalOracle
from stealkit.serve.app import create_app
from stealkit.serve.defences import reverse_sigmoid
from tests.test_serve_support import make_victim, write_keys

KEYS = [
    {"key": "probs-key-Zx81QpLw6RtV3mNb7Yc4", "name": "probs", "mode": "probs", "budget": 60, "explain": True},
    {"key": "label-key-Zx81QpLw6RtV3mNb7Yc4", "name": "labels", "mode": "label"},
    {"key": "logit-key-Zx81QpLw6RtV3mNb7Yc4", "name": "logits", "mode": "logits", "top_k": 2},
    {"key": "rs-key-Zx81QpLw6RtV3mNb7Yc4", "name": "rs", "mode": "probs", "defences": ["reverse_sigmoid:beta=0.5,gamma=0.2"]},
    {"key": "slow-key-Zx81QpLw6RtV3mNb7Yc4", "name": "slow", "mode": "probs", "rate": 2},
    {"key": "few-images-Zx81QpLw6RtV3mNb7Yc4", "name": "few", "mode": "probs", "image_rate": 5},
    {"key": "prada-key-Zx81QpLw6RtV3mNb7Yc4", "name": "watched", "mode": "label", "prada": {"delta": 0.95, "min_samples": 20,
                                                                         "block": True}},
]


METRICS_KEY = "metrics-Ab3dE6gH9jK2mN5p"


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


@pytest.fixture()
def client(victim: Path, tmp_path: Path) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", KEYS, model={"max_batch": 64, "max_body_mb": 0.05,
                                                                   "metrics_key": METRICS_KEY})
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite"))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def used(client: TestClient, key: str) -> dict[str, int]:
    return client.get("/v1/info", headers=auth(key)).json()["queries_used"]


NPY_HEADERS = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}


class TestAuth:
    @pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "probs-key-Zx81QpLw6RtV3mNb7Yc4"},
                                         {"Authorization": "Basic probs-key-Zx81QpLw6RtV3mNb7Yc4"}, {"Authorization": "Bearer "}])
    def test_missing_or_wrong_key_is_401(self, client, headers):
        for method, path in (("POST", "/v1/predict"), ("POST", "/v1/explain"), ("GET", "/v1/info")):
            r = client.request(method, path, headers=headers, json={"inputs": images(1).tolist()})
            assert r.status_code == 401 and r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"

    def test_keys_are_stored_hashed(self, client, tmp_path):
        raw = (tmp_path / "db.sqlite").read_bytes() + (tmp_path / "db.sqlite-wal").read_bytes() \
            if (tmp_path / "db.sqlite-wal").exists() else (tmp_path / "db.sqlite").read_bytes()
        assert b"probs-key-Zx81QpLw6RtV3mNb7Yc4" not in raw

    def test_health_and_openapi_need_no_key(self, client):
        assert client.get("/healthz").json()["status"] == "ok"
        schema = client.get("/openapi.json").json()
        assert {"/v1/predict", "/v1/explain", "/v1/info", "/healthz", "/metrics"} <= set(schema["paths"])
        body = schema["paths"]["/v1/predict"]["post"]["requestBody"]["content"]
        assert "application/x-npy" in body and "application/json" in body


class TestAnswers:
    def test_info(self, client, victim):
        info = client.get("/v1/info", headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4")).json()
        _, spec = load_model(victim)
        assert info["input_shape"] == [1, 8, 8] and info["num_classes"] == 10
        assert info["dataset"] == "digits" and info["classes"] == spec.class_names
        assert info["mode"] == "probs" and info["allowed_modes"] == ["probs", "topk", "label"]
        assert info["queries_left"] == 60 and info["explain"] is True

    @pytest.mark.parametrize("key,mode,kw", [("probs-key-Zx81QpLw6RtV3mNb7Yc4", "probs", {}), ("label-key-Zx81QpLw6RtV3mNb7Yc4", "label", {}),
                                             ("logit-key-Zx81QpLw6RtV3mNb7Yc4", "logits", {}), ("logit-key-Zx81QpLw6RtV3mNb7Yc4", "topk", {"top_k": 2})])
    def test_same_answers_as_local_oracle(self, client, victim, key, mode, kw):
        model, spec = load_model(victim)
        x = images(7)
        r = client.post(f"/v1/predict?mode={mode}", content=npy(x), headers=auth(key) | NPY_HEADERS)
        assert r.status_code == 200 and r.headers["x-stealkit-mode"] == mode
        got = np.load(io.BytesIO(r.content))
        want = LocalOracle(model, spec.input_shape, mode=mode, **kw).query(torch.from_numpy(x)).numpy()
        assert got.dtype == want.dtype and np.array_equal(got, want)

    def test_json_and_npy_agree(self, client):
        x = images(3)
        a = client.post("/v1/predict", json={"inputs": x.tolist()}, headers=auth("label-key-Zx81QpLw6RtV3mNb7Yc4")).json()
        b = client.post("/v1/predict", content=npy(x), headers=auth("label-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        assert a["mode"] == "label" and a["outputs"] == np.load(io.BytesIO(b.content)).tolist()
        assert a["queries_left"] is None and a["queries_used"]["predict"] == 3

    def test_defence_applied(self, client, victim):
        model, spec = load_model(victim)
        x = images(5)
        got = client.post("/v1/predict", json={"inputs": x.tolist()}, headers=auth("rs-key-Zx81QpLw6RtV3mNb7Yc4")).json()["outputs"]
        local = LocalOracle(model, spec.input_shape, defences=[reverse_sigmoid(0.5, 0.2)])
        assert np.allclose(got, local.query(torch.from_numpy(x)).numpy(), atol=1e-7)

    def test_explain_gradient_and_smoothgrad(self, client, victim):
        model, spec = load_model(victim)
        x = images(4)
        r = client.post("/v1/explain", json={"inputs": x.tolist(), "target": [0, 1, 2, 3], "output": "prob"},
                        headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4"))
        assert r.status_code == 200, r.text
        local = LocalExplanationOracle(model, spec.input_shape)
        want = local.explain(torch.from_numpy(x), target=torch.tensor([0, 1, 2, 3]), output="prob")
        assert np.allclose(r.json()["outputs"], want.numpy(), atol=1e-6)
        r = client.post("/v1/explain?method=smoothgrad&n_samples=3&sigma=0.05", content=npy(x),
                        headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | {"Content-Type": "application/x-npy"})
        assert r.status_code == 200 and np.array(r.json()["outputs"]).shape == (4, 1, 8, 8)
        # 4 gradients + 4 SmoothGrad maps of 3 samples each (price: one explain query per sample)
        assert used(client, "probs-key-Zx81QpLw6RtV3mNb7Yc4") == {"predict": 0, "explain": 4 + 4 * 3}

    def test_explain_not_allowed(self, client):
        r = client.post("/v1/explain", json={"inputs": images(1).tolist()}, headers=auth("label-key-Zx81QpLw6RtV3mNb7Yc4"))
        assert r.status_code == 403 and r.json()["error"] == "explain_not_allowed"


BAD_BODIES = [
    (b"", "json", 400), (b"not json", "json", 400), (b"[]", "json", 400), (b'{"inputs": 3}', "json", 400),
    (b'{"inputs": [[[[0.5]]]]}', "json", 400), (b'{"inputs": [], "mode": "probs"}', "json", 400),
    (json.dumps({"inputs": [[[[0.5] * 8] * 8]], "mode": "scores"}).encode(), "json", 400),
    (json.dumps({"inputs": [[[[0.5] * 8] * 8]], "mode": "logits"}).encode(), "json", 403),
    (json.dumps({"inputs": [[[[0.5] * 8] * 8]], "extra": 1}).encode(), "json", 400),
    (json.dumps({"inputs": [[[["a"] * 8] * 8]]}).encode(), "json", 400),
    (json.dumps({"inputs": [[[[True] * 8] * 8]]}).encode(), "json", 400),
    (json.dumps({"inputs": [[[[2.0] * 8] * 8]]}).encode(), "json", 400),
    (json.dumps({"inputs": [[[[0.5] * 8] * 7 + [[0.5] * 7]]]}).encode(), "json", 400),
    (b'{"inputs": [[[[NaN, 0, 0, 0, 0, 0, 0, 0]' + b", [0, 0, 0, 0, 0, 0, 0, 0]" * 7 + b"]]]}", "json", 400),
    (b"[" * 20000, "json", 400),
    (npy(images(2).astype(np.float64)[:, :, :4]), "npy", 400),
    (npy((images(2) * 255).astype(np.uint8)), "npy", 400),
    (npy(np.full((1, 1, 8, 8), np.inf, np.float32)), "npy", 400),
    (npy(np.full((1, 1, 8, 8), -0.5, np.float32)), "npy", 400),
    (npy(np.array([{"a": 1}], dtype=object)), "npy", 400),
    (npy(images(1))[:-10], "npy", 400),
    (b"\x93NUMPY garbage", "npy", 400),
    (b"\x80\x04K\x01.", "npy", 400),
    (npy(images(65)), "npy", 413),
    (npy(np.zeros((1, 1, 8, 8), np.float32))[:8] + b"\x00" * 100000, "npy", 413),
]


class TestRefusals:
    @pytest.mark.parametrize("body,kind,status", BAD_BODIES)
    def test_bad_input_is_4xx_json_and_not_charged(self, client, body, kind, status):
        ct = "application/x-npy" if kind == "npy" else "application/json"
        r = client.post("/v1/predict", content=body, headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | {"Content-Type": ct})
        assert r.status_code == status, r.text
        assert r.json()["error"] and r.json()["detail"]
        assert used(client, "probs-key-Zx81QpLw6RtV3mNb7Yc4") == {"predict": 0, "explain": 0}

    def test_unsupported_media_type(self, client):
        r = client.post("/v1/predict", content=b"x", headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | {"Content-Type": "text/csv"})
        assert r.status_code == 415

    def test_unknown_endpoint_and_method(self, client):
        assert client.get("/v2/predict").status_code == 404
        assert client.get("/v1/predict", headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4")).status_code == 405
        assert client.get("/v2/predict").json()["error"] == "not_found"

    def test_budget(self, client):
        r = client.post("/v1/predict", content=npy(images(50)), headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        assert r.status_code == 200 and r.headers["x-stealkit-queries-left"] == "10"
        r = client.post("/v1/predict", content=npy(images(11)), headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        assert r.status_code == 402 and r.json()["queries_left"] == 10
        r = client.post("/v1/explain", content=npy(images(11)), headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        assert r.status_code == 402
        r = client.post("/v1/predict", content=npy(images(10)), headers=auth("probs-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        assert r.status_code == 200 and r.headers["x-stealkit-queries-left"] == "0"
        assert used(client, "probs-key-Zx81QpLw6RtV3mNb7Yc4") == {"predict": 60, "explain": 0}
        audit = client.app.state.service.store.audit()
        assert all(a["consistent"] for a in audit.values())
        assert [row["n"] for row in client.app.state.service.store.log_rows()] == [50, 10]

    def test_rate_limits(self, client):
        codes = [client.post("/v1/predict", content=npy(images(1)), headers=auth("slow-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
                 .status_code for _ in range(6)]
        assert codes[:2] == [200, 200] and 429 in codes
        r = client.post("/v1/predict", content=npy(images(1)), headers=auth("slow-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
        assert client.post("/v1/predict", content=npy(images(5)),
                           headers=auth("few-images-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS).status_code == 200
        assert client.post("/v1/predict", content=npy(images(5)),
                           headers=auth("few-images-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS).status_code == 429

    def test_metrics_text(self, client):
        client.post("/v1/predict", content=npy(images(3)), headers=auth("labels" and "label-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS)
        client.post("/v1/predict", content=b"bad", headers=auth("label-key-Zx81QpLw6RtV3mNb7Yc4") | {"Content-Type": "application/x-npy"})
        text = client.get("/metrics", headers=auth(METRICS_KEY)).text
        assert 'stealkit_queries_served_total{key="labels",kind="predict"} 3' in text
        assert 'stealkit_requests_refused_total{key="labels",reason="bad_input"' in text
        assert "stealkit_request_latency_seconds_bucket" in text and "# TYPE" in text

    def test_prada_flags_and_blocks_synthetic_queries(self, client):
        """Queries that are tiny perturbations of one seed image: far from normal distances -> flagged."""
        rng = np.random.default_rng(0)
        seed = rng.random((1, 1, 8, 8), dtype=np.float32)
        status = 200
        for i in range(10):
            steps = rng.choice([0.0, 0.05], size=(10, 1, 8, 8)).astype(np.float32)
            x = np.clip(seed + steps * (1 + i % 2), 0, 1)
            status = client.post("/v1/predict", content=npy(x), headers=auth("prada-key-Zx81QpLw6RtV3mNb7Yc4") | NPY_HEADERS).status_code
            if status == 403:
                break
        assert status == 403
        assert 'stealkit_prada_flagged{key="watched"} 1.0' in client.get("/metrics", headers=auth(METRICS_KEY)).text
