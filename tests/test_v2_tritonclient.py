"""The official Triton client (``tritonclient[http]``) against ``stealkit serve --protocol v2``: a real v2 client,
binary and JSON tensors, the key in ``Authorization: Bearer``, budgets and errors as tritonclient reports them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stealkit.models import load_model
from stealkit.oracle import LocalExplanationOracle, LocalOracle
from stealkit.serve.store import Store
from tests.test_serve_support import live_server, make_victim, write_keys

httpclient = pytest.importorskip("tritonclient.http")
utils = pytest.importorskip("tritonclient.utils")

KEY = "triton-key-Zx81QpLw6RtV3mNb7Yc4"
SMALL = "small-key-Zx81QpLw6RtV3mNb7Yc4"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("triton")
    victim = make_victim(root / "digits")
    keys = write_keys(root / "keys.toml", [
        {"key": KEY, "name": "triton", "mode": "probs", "explain": True},
        {"key": SMALL, "name": "small", "mode": "label", "budget": 10}])
    with live_server(victim, keys, root / "db.sqlite", extra=("--protocol", "v2", "--model-name", "digits")) as url:
        yield url, victim, root / "db.sqlite"


def infer(client, x: np.ndarray, output: str, *, binary: bool, key: str = KEY, model: str = "digits"):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput(output, binary_data=binary)
    return client.infer(model, [inp], outputs=[out], headers={"Authorization": f"Bearer {key}"})


def test_tritonclient_metadata_and_answers(server):
    url, victim, db = server
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits") and not client.is_model_ready("nope")
    meta = client.get_model_metadata("digits", headers=AUTH)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert {o["name"] for o in meta["outputs"]} == {"probs", "topk", "label"}
    model, spec = load_model(victim)
    x = np.random.default_rng(0).random((20, 1, 8, 8), dtype=np.float32)
    local = LocalOracle(model, spec.input_shape, mode="probs")
    for binary in (True, False):  # the binary tensor extension (tritonclient's default) and JSON
        probs = infer(client, x, "probs", binary=binary).as_numpy("probs")
        assert probs.shape == (20, 10) and np.allclose(probs, local.query(torch.from_numpy(x)).numpy(), atol=1e-6)
        labels = infer(client, x, "label", binary=binary).as_numpy("label")
        assert labels.dtype == np.int64 and (labels == probs.argmax(1)).all()
    grads = client.infer("digits-explain", [_input(x[:3])], headers=AUTH, outputs=[
        httpclient.InferRequestedOutput("explanation")], parameters={"method": "gradient"}).as_numpy("explanation")
    want = LocalExplanationOracle(model, spec.input_shape).explain(torch.from_numpy(x[:3]))
    assert np.allclose(grads, want.numpy(), atol=1e-6)
    store = Store(db)
    assert store.usage("triton").as_dict() == {"predict": 80, "explain": 3}  # 4 x 20 images, 3 explanations
    store.close()


def _input(x: np.ndarray):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_tritonclient_sees_one_line_errors_and_refusals_cost_nothing(server):
    url, _, db = server
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    x = np.random.default_rng(1).random((4, 1, 8, 8), dtype=np.float32)
    with pytest.raises(utils.InferenceServerException, match="unknown API key"):
        infer(client, x, "label", binary=True, key="wrong")
    with pytest.raises(utils.InferenceServerException, match="no model 'nope'"):
        infer(client, x, "label", binary=True, key=SMALL, model="nope")
    with pytest.raises(utils.InferenceServerException, match=r"shape \[B, 1, 8, 8\], got \[4, 1, 4, 16\]"):
        infer(client, x.reshape(4, 1, 4, 16), "label", binary=True, key=SMALL)
    with pytest.raises(utils.InferenceServerException, match="may ask for"):
        infer(client, x, "probs", binary=True, key=SMALL)  # a label key asks for probabilities
    assert infer(client, np.concatenate([x, x]), "label", binary=True, key=SMALL).as_numpy("label").shape == (8,)
    with pytest.raises(utils.InferenceServerException, match="budget"):
        infer(client, x, "label", binary=True, key=SMALL)  # 8 + 4 > 10: refused whole
    store = Store(db)
    assert store.usage("small").as_dict() == {"predict": 8, "explain": 0}
    store.close()
