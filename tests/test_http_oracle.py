"""HttpOracle against a real ``stealkit serve`` (uvicorn subprocess on a free loopback port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stealkit.cli import main
from stealkit.errors import BudgetExhausted, InputError
from stealkit.extract import BaselineConfig, extract_baseline
from stealkit.extract.common import make_evaluator, student_factory, victim_splits
from stealkit.models import load_model
from stealkit.oracle import ExplanationOracle, LocalExplanationOracle, LocalOracle, Oracle
from stealkit.oracle.http import HttpOracle
from stealkit.serve.store import Store
from stealkit.train import TrainConfig
from tests.test_serve_support import live_server, make_victim, write_keys

pytestmark = pytest.mark.slow

KEYS = [
    {"key": "probs-key-Zx81QpLw6RtV3mNb7Yc4", "name": "probs", "mode": "probs", "explain": True},
    {"key": "small-key-Zx81QpLw6RtV3mNb7Yc4", "name": "small", "mode": "probs", "budget": 30},
    {"key": "label-key-Zx81QpLw6RtV3mNb7Yc4", "name": "labels", "mode": "label", "budget": 1000},
    {"key": "cli-key-Zx81QpLw6RtV3mNb7Yc4", "name": "cli", "mode": "probs", "budget": 1000},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("http")
    victim = make_victim(root / "victim")
    keys = write_keys(root / "keys.toml", KEYS)
    with live_server(victim, keys, root / "db.sqlite", log=root / "server.log") as url:
        yield url, victim, root / "db.sqlite"


def test_protocols_and_info(server):
    url, victim, _ = server
    oracle = HttpOracle(url, key="probs-key-Zx81QpLw6RtV3mNb7Yc4")
    _, spec = load_model(victim)
    assert isinstance(oracle, Oracle) and isinstance(oracle, ExplanationOracle)
    assert oracle.input_shape == (1, 8, 8) and oracle.num_classes == 10 and oracle.dataset == "digits"
    assert oracle.mode.value == "probs" and oracle.ledger.remaining() is None
    assert oracle.classes == spec.class_names
    with pytest.raises(InputError, match="may ask for modes"):
        HttpOracle(url, key="probs-key-Zx81QpLw6RtV3mNb7Yc4", mode="logits")
    with pytest.raises(InputError, match="refused the API key"):
        HttpOracle(url, key="wrong")


def test_answers_equal_local_oracle(server):
    url, victim, _ = server
    model, spec = load_model(victim)
    x = torch.rand(300, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    for mode in ("probs", "topk", "label"):
        remote = HttpOracle(url, key="probs-key-Zx81QpLw6RtV3mNb7Yc4", mode=mode, batch_size=128)
        local = LocalOracle(model, spec.input_shape, mode=mode, batch_size=128)
        got, want = remote.query(x), local.query(x)
        assert got.dtype == want.dtype and torch.allclose(got.double(), want.double(), atol=1e-6)
        assert remote.ledger.as_dict() == local.ledger.as_dict() == {"predict": 300, "explain": 0}
    remote = HttpOracle(url, key="probs-key-Zx81QpLw6RtV3mNb7Yc4")
    g = remote.explain(x[:5], "gradient", target=torch.tensor([0, 1, 2, 3, 4]))
    want = LocalExplanationOracle(model, spec.input_shape).explain(x[:5], target=torch.tensor([0, 1, 2, 3, 4]))
    assert torch.allclose(g, want, atol=1e-6) and remote.ledger.as_dict() == {"predict": 0, "explain": 5}


def test_ledger_mirrors_server_budget(server):
    url, _, db = server
    a = HttpOracle(url, key="small-key-Zx81QpLw6RtV3mNb7Yc4", budget=100)
    assert a.ledger.remaining() == 30  # the key's budget is smaller than the one asked for
    b = HttpOracle(url, key="small-key-Zx81QpLw6RtV3mNb7Yc4")
    b.query(torch.rand(20, 1, 8, 8))  # another client spends the same key
    a.query(torch.rand(4, 1, 8, 8))  # the server's answer shrinks a's ledger
    assert a.ledger.remaining() == 6
    with pytest.raises(BudgetExhausted):
        a.query(torch.rand(7, 1, 8, 8))  # refused locally, nothing sent
    assert a.ledger.as_dict()["predict"] == 4
    b.ledger.budget = None  # b does not know a spent some: the server refuses and nothing is charged
    with pytest.raises(BudgetExhausted):
        b.query(torch.rand(7, 1, 8, 8))
    assert b.ledger.as_dict()["predict"] == 20 and b.ledger.remaining() == 6
    usage = Store(db).usage("small")
    assert usage.predict == 24


def test_extraction_over_http_equals_local(server):
    """The core's baseline extraction, same seed, local oracle vs HTTP: same ledgers, same student."""
    url, victim, _ = server
    model, spec = load_model(victim)
    local = LocalOracle(model, spec.input_shape, mode="label", budget=200)
    remote = HttpOracle(url, key="label-key-Zx81QpLw6RtV3mNb7Yc4", mode="label", budget=200)
    from stealkit.extract.common import Victim

    v = Victim(oracle=local, input_shape=(1, 8, 8), num_classes=10, dataset="digits", model=model, spec=spec)
    splits = victim_splits(v)
    cfg = BaselineConfig(checkpoints=(100, 200), seed=3, train=TrainConfig(epochs=5, batch_size=32, seed=3))
    results = []
    for oracle in (local, remote):
        ev = make_evaluator(v, splits.test.x, splits.test.y)
        results.append(extract_baseline(oracle, splits.attacker_pool.x, make_student=student_factory("mlp2", v, 3),
                                        evaluator=ev, config=cfg))
    a, b = results
    assert a.queries == b.queries == {"predict": 200, "explain": 0}
    assert local.ledger.as_dict() == remote.ledger.as_dict()
    assert [p["queries"] for p in a.curve] == [p["queries"] for p in b.curve] == [100, 200]
    assert a.accuracy == b.accuracy
    for pa, pb in zip(a.student.parameters(), b.student.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_cli_extraction_over_http(server, tmp_path: Path):
    """`stealkit extract baseline --victim URL --key KEY` runs unchanged; same queries and accuracy as local."""
    url, victim, _ = server
    args = ["-q", "extract", "baseline", "--budget", "150", "--mode", "probs", "--student", "mlp2", "--epochs", "5",
            "--seed", "1"]
    assert main([*args, "--victim", str(victim), "--out", str(tmp_path / "local")]) == 0
    assert main([*args, "--victim", url, "--key", "cli-key-Zx81QpLw6RtV3mNb7Yc4", "--out", str(tmp_path / "http")]) == 0
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    remote = json.loads((tmp_path / "http" / "summary.json").read_text())
    assert local["queries"] == remote["queries"] == {"predict": 150, "explain": 0}
    assert remote["accuracy"] == pytest.approx(local["accuracy"], abs=1e-9)
    assert remote["fidelity"] is None and local["fidelity"] is not None  # fidelity over HTTP needs the model
    assert (tmp_path / "http" / "student" / "model.safetensors").exists()
    a, _ = load_model(tmp_path / "local" / "student")
    b, _ = load_model(tmp_path / "http" / "student")
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)
