"""The Open Inference Protocol (v2) in process: ``create_app(protocol="v2")`` through a TestClient, and
:class:`V2HttpOracle` against it and against fake v2 servers (answers of the wrong shape, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from stealkit.cli import main
from stealkit.commands.common import _v2_victim
from stealkit.errors import BudgetExhausted, InputError, StealkitError
from stealkit.models import load_model
from stealkit.oracle import LocalExplanationOracle, LocalOracle
from stealkit.oracle.http_v2 import V2HttpOracle, is_v2, parse_v2_address, v2_address
from stealkit.serve.app import create_app
from stealkit.serve.v2 import model_name
from tests.test_serve_support import make_victim, write_keys

PROBS = "probs-key-Zx81QpLw6RtV3mNb7Yc4"
LABEL = "label-key-Zx81QpLw6RtV3mNb7Yc4"
METRICS = "metrics-Ab3dE6gH9jK2mN5p"
KEYS = [{"key": PROBS, "name": "probs", "mode": "probs", "budget": 100, "explain": True},
        {"key": LABEL, "name": "labels", "mode": "label"}]


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("v2") / "digits")


@pytest.fixture()
def client(victim: Path, tmp_path: Path) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", KEYS, model={"max_batch": 32, "metrics_key": METRICS})
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite", protocol="v2"))


def auth(key: str = PROBS) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def body(x: np.ndarray, output: str | None = None, **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                          "data": x.reshape(-1).tolist()}], **extra}
    if output is not None:
        doc["outputs"] = [{"name": output}]
    return doc


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def used(client: TestClient, key_id: str = "probs") -> dict[str, int]:
    """What the server's store charged the key."""
    return client.app.state.service.store.usage(key_id).as_dict()


def test_probes_metadata_and_model_name(client: TestClient):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200 and client.get("/v2").json()["name"] == "stealkit"
    assert client.get("/v2/models/digits/ready").json() == {"name": "digits", "ready": True}
    assert client.get("/v2/models/digits-explain/ready").status_code == 200
    missing = client.get("/v2/models/nope/ready")
    assert missing.status_code == 404 and "no model 'nope'; this server serves 'digits'" in missing.json()["error"]
    assert client.get("/v2/models/digits").status_code == 401
    meta = client.get("/v2/models/digits", headers=auth(LABEL)).json()
    assert meta["platform"] == "stealkit" and meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
    assert meta["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [-1]}]  # what this key may ask
    assert meta["parameters"]["queries_left"] is None and meta["parameters"]["num_classes"] == 10
    assert client.get("/v2/models/digits-explain", headers=auth(LABEL)).status_code == 403
    explain = client.get("/v2/models/digits-explain", headers=auth()).json()
    assert explain["outputs"] == [{"name": "explanation", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert model_name("runs/x/victim/") == "victim" and model_name("m.onnx?input_shape=1,8,8") == "m"
    assert model_name("whatever", "renamed") == "renamed"
    for bad in ("a/b", "x-explain", ""):
        with pytest.raises(InputError, match="--model-name"):
            model_name("m", bad)


def test_answers_equal_local_oracle_and_are_charged(client: TestClient, victim: Path):
    model, spec = load_model(victim)
    x = images(6)
    for mode in ("probs", "topk", "label"):
        r = client.post("/v2/models/digits/infer", headers=auth(), json=body(x, mode, id="r1"))
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        want = LocalOracle(model, spec.input_shape, mode=mode).query(torch.from_numpy(x))
        assert out["name"] == mode and out["shape"] == list(want.shape) and r.json()["id"] == "r1"
        assert np.allclose(np.array(out["data"]).reshape(want.shape), want.numpy(), atol=1e-6)
        assert out["datatype"] == ("INT64" if mode == "label" else "FP32")
    nested = {"inputs": [{"name": "input", "shape": [6, 1, 8, 8], "datatype": "FP64", "data": x.tolist()}]}
    r = client.post("/v2/models/digits/infer", headers=auth(), json=nested)  # no outputs: the key's mode
    assert r.json()["outputs"][0]["name"] == "probs" and r.json()["parameters"]["queries_left"] == 100 - 24
    assert r.headers["X-Stealkit-Queries-Left"] == "76" and used(client) == {"predict": 24, "explain": 0}
    again = client.post("/v2/models/digits/infer", headers=auth() | {"Idempotency-Key": "k1"}, json=body(x[:2]))
    replay = client.post("/v2/models/digits/infer", headers=auth() | {"Idempotency-Key": "k1"}, json=body(x[:2]))
    assert replay.content == again.content and used(client) == {"predict": 26, "explain": 0}
    metrics = client.get("/metrics", headers=auth(METRICS)).text
    assert 'endpoint="/v2/models/{model}/infer",status="200"' in metrics


def test_binary_tensors_both_ways(client: TestClient, victim: Path):
    x = images(3)
    head = json.dumps({"inputs": [{"name": "input", "shape": [3, 1, 8, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "label", "parameters": {"binary_data": True}}]}).encode()
    r = client.post("/v2/models/digits/infer", content=head + x.tobytes(), headers=auth(LABEL) | {
        "Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"})
    n = int(r.headers["Inference-Header-Content-Length"])
    assert json.loads(r.content[:n])["outputs"][0]["parameters"] == {"binary_data_size": 24}
    model, _ = load_model(victim)
    assert (np.frombuffer(r.content[n:], "<i8") == model(torch.from_numpy(x)).argmax(1).numpy()).all()


@pytest.mark.parametrize(("doc", "status", "message"), [
    ({"inputs": [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}, 400,
     "this model's inputs are ['input']"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "INT64", "data": [0] * 64}]}, 400,
     "datatype must be FP32, FP64 or FP16"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 7], "datatype": "FP32", "data": [0.5] * 56}]}, 400,
     "shape [B, 1, 8, 8], got [1, 1, 8, 7]"),
    ({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}, 400,
     "data holds 64 values, shape [2, 1, 8, 8] needs 128"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [2.0] * 64}]}, 400,
     "pixels in [0, 1]"),
    ({"inputs": [{"name": "input", "shape": [33, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64 * 33}]}, 413,
     "at most 32 images"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}],
      "outputs": [{"name": "probs"}, {"name": "label"}]}, 400, "at most one"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}],
      "outputs": [{"name": "logits"}]}, 403, "may ask for"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}],
      "parameters": {"priority": 1}}, 400, "unknown request parameters ['priority']"),
    ({"inputs": [], "extra": 1}, 400, "unknown field 'extra'"),
])
def test_refusals_are_one_line_and_never_charged(client: TestClient, doc, status, message):
    r = client.post("/v2/models/digits/infer", headers=auth(), json=doc)
    assert r.status_code == status and message in r.json()["error"] and "\n" not in r.json()["error"]
    assert used(client) == {"predict": 0, "explain": 0}


def test_explanations_are_the_second_model(client: TestClient, victim: Path):
    model, spec = load_model(victim)
    x = images(4)
    doc = body(x, "explanation", parameters={"method": "gradient", "output": "logit"})
    doc["inputs"].append({"name": "target", "shape": [4], "datatype": "INT64", "data": [0, 1, 2, 3]})
    r = client.post("/v2/models/digits-explain/infer", headers=auth(), json=doc)
    want = LocalExplanationOracle(model, spec.input_shape).explain(torch.from_numpy(x), target=torch.arange(4))
    assert np.allclose(np.array(r.json()["outputs"][0]["data"]).reshape(4, 1, 8, 8), want.numpy(), atol=1e-6)
    assert used(client) == {"predict": 0, "explain": 4}
    refused = client.post("/v2/models/digits-explain/infer", headers=auth(LABEL), json=body(x))
    assert refused.status_code == 403 and "explain = false" in refused.json()["error"]


def test_v2_oracle_against_stealkit_serve(client: TestClient, victim: Path):
    oracle = V2HttpOracle("v2+http://testserver", model="digits", key=PROBS, transport=client._transport,
                          batch_size=1000)
    assert oracle.stealkit and oracle.mode.value == "probs" and oracle.batch_size == 32
    assert oracle.ledger.remaining() == 100 and oracle.dataset == "digits" and len(oracle.classes) == 10
    model, spec = load_model(victim)
    x = torch.from_numpy(images(40))
    assert torch.allclose(oracle.query(x), LocalOracle(model, spec.input_shape).query(x), atol=1e-6)
    g = oracle.explain(x[:3], target=2)
    assert g.shape == (3, 1, 8, 8) and oracle.ledger.as_dict() == {"predict": 40, "explain": 3} == used(client)
    other = V2HttpOracle("http://testserver/v2/models/digits", key=PROBS, transport=client._transport)
    other.query(x)  # another client spends the same key: 83 used of 100
    oracle.query(x[:1])  # the server's answer shrinks this oracle's budget
    assert oracle.ledger.remaining() == 16
    with pytest.raises(BudgetExhausted):
        oracle.query(x[:17])
    with pytest.raises(InputError, match="may ask for modes"):
        V2HttpOracle("v2+http://testserver", model="digits", key=LABEL, mode="probs", transport=client._transport)
    with pytest.raises(InputError, match="offers no explanations"):
        V2HttpOracle("v2+http://testserver", model="digits", key=LABEL, transport=client._transport).explain(x[:1])


def fake_server(answer: dict | None = None, status: int = 200, outputs: list | None = None,
                inputs: list | None = None) -> httpx.MockTransport:
    """A minimal foreign v2 server: metadata, and ``answer`` (or an error ``status``) to every inference."""
    meta = {"name": "m", "platform": "onnxruntime_onnx",
            "inputs": inputs or [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 4, 4]}],
            "outputs": outputs or [{"name": "scores", "datatype": "FP32", "shape": [-1, 3]}]}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v2/models/m":
            return httpx.Response(200, json=meta)
        if request.url.path == "/v2/models/m/infer" and status == 200:
            return httpx.Response(200, json=answer)
        return httpx.Response(status if request.url.path == "/v2/models/m/infer" else 404, json={"error": "boom"})

    return httpx.MockTransport(handle)


def test_v2_oracle_errors_against_foreign_servers():
    x = torch.rand(2, 1, 4, 4)
    wrong = {"outputs": [{"name": "scores", "datatype": "FP32", "shape": [2, 4], "data": [0.1] * 8}]}
    oracle = V2HttpOracle("v2+http://h:1", model="m", transport=fake_server(wrong), retries=0)
    with pytest.raises(StealkitError, match=r"^http://h:1/v2/models/m/infer answered output 'scores' as FP32 "
                                            r"\[2, 4\]; expected a float tensor \[2, 3\]"):
        oracle.query(x)
    assert oracle.ledger.total == 2  # the server answered: charged, as the server counts it
    for status, error in ((400, InputError), (500, StealkitError), (503, StealkitError)):
        refused = V2HttpOracle("v2+http://h:1", model="m", transport=fake_server(status=status), retries=0,
                               mode="logits")
        with pytest.raises(error, match=rf"http://h:1/v2/models/m/infer.*HTTP {status}: boom"):
            refused.query(x)
        assert refused.ledger.total == 0  # refused: nothing charged
    with pytest.raises(InputError, match=r"http://h:1/v2/models/other: the server has no model 'other'"):
        V2HttpOracle("v2+http://h:1", model="other", transport=fake_server())
    with pytest.raises(InputError, match=r"input 'x' is FP32 \[-1, 16\]; stealkit expects an image tensor"):
        V2HttpOracle("v2+http://h:1", model="m", transport=fake_server(
            inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]))
    probs_only = fake_server(outputs=[{"name": "probs", "datatype": "FP32", "shape": [-1, 3]}])
    with pytest.raises(InputError, match="answers probabilities.*pass --mode probs"):
        V2HttpOracle("v2+http://h:1", model="m", mode="logits", transport=probs_only)
    logits = {"outputs": [{"name": "logits", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 0, 0, 0]}]}
    soft = V2HttpOracle("v2+http://h:1", model="m", mode="probs", transport=fake_server(
        logits, outputs=[{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]))
    assert torch.allclose(soft.query(x), torch.softmax(torch.tensor([[1.0, 2, 3], [0, 0, 0]]), 1))
    label = V2HttpOracle("v2+http://h:1", model="m", mode="label", transport=fake_server(logits, outputs=[
        {"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]))
    assert label.query(x).tolist() == [2, 0]


def test_retries_like_the_v1_client():
    """429/503 are retried (not charged, counted once when answered); a generic server's 500 is not retried."""
    calls: list[int] = []
    good = {"outputs": [{"name": "scores", "datatype": "FP32", "shape": [1, 3], "data": [0.2, 0.3, 0.5]}]}

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v2/models/m":
            return fake_server().handle_request(request)
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(503, json={"error": "busy"}, headers={"Retry-After": "0"})
        if len(calls) == 2:
            return httpx.Response(429, json={"error": "slow down"})
        return httpx.Response(500 if len(calls) == 4 else 200, json={"error": "boom"} if len(calls) == 4 else good)

    oracle = V2HttpOracle("v2+http://h:1", model="m", transport=httpx.MockTransport(flaky), backoff=0.001)
    assert torch.allclose(oracle.query(torch.rand(1, 1, 4, 4)), torch.tensor([[0.2, 0.3, 0.5]])) and len(calls) == 3
    with pytest.raises(StealkitError, match="HTTP 500: boom"):
        oracle.query(torch.rand(1, 1, 4, 4))
    assert len(calls) == 4 and oracle.ledger.total == 1  # the 500 was neither retried nor charged


def test_v2_addresses_and_cli_flags(victim: Path, capsys: pytest.CaptureFixture[str]):
    assert v2_address("v2+http://h:8080", "digits") == "v2+http://h:8080/v2/models/digits"
    assert v2_address("http://h:8080/v2/models/digits", None, 10) == "v2+http://h:8080/v2/models/digits?num_classes=10"
    assert parse_v2_address("v2+https://h/v2/models/a%20b?num_classes=3") == ("https://h", "a b", 3)
    assert is_v2("http://h/v2/models/x") and is_v2("v2+http://h") and not is_v2("http://h")
    with pytest.raises(InputError, match="pass --model NAME"):
        parse_v2_address("v2+http://h:1")
    args = ["-q", "extract", "baseline", "--budget", "10", "--out", "unused", "--device", "cpu"]
    with pytest.raises(InputError, match="names model 'a' but --model says 'b'"):
        parse_v2_address("v2+http://h:1/v2/models/a", "b")
    # a v2 address with no --model says to pass one (not that the address is malformed)
    assert main([*args, "--victim", "v2+http://127.0.0.1:9"]) == 2
    assert "which model? pass --model NAME" in capsys.readouterr().err
    assert main([*args, "--victim", str(victim), "--model", "digits"]) == 2
    assert "--model/--protocol v2 name a model on a v2" in capsys.readouterr().err
    assert main([*args, "--victim", "v2+http://127.0.0.1:9", "--model", "m", "--input-shape", "1,8,8"]) == 2
    assert "only apply to an ONNX or TorchScript file" in capsys.readouterr().err
    assert _v2_victim("http://h:1", {"protocol": "v2", "v2_model": "m"}, {"num_classes": "4"}) \
        == "v2+http://h:1/v2/models/m?num_classes=4"
    with pytest.raises(InputError, match="not one"):
        _v2_victim("http://h:1", {"protocol": "v1", "v2_model": "m"}, {})
