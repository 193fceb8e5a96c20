"""stealkit's v2 client against a real Open Inference Protocol server: KServe's Python model server
(``kserve.ModelServer``) answering an ONNX export of a digits victim, started in the test on a free loopback port.

KServe pins protobuf < 7, pandas < 3 and python-dateutil < 3, older than stealkit's environment has, so it runs
from its own virtual environment (``make venv-kserve``, pinned in ``tests/v2server/requirements.txt``); the
tests skip when it is absent. The server logs every request it answers (``V2_LOG``): the ledger must equal it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from stealkit.cli import main
from stealkit.errors import BudgetExhausted, InputError
from stealkit.models import load_model
from stealkit.oracle.http_v2 import V2HttpOracle
from tests.test_serve_support import ROOT, free_port, make_victim

PYTHON = Path(os.environ.get("STEALKIT_KSERVE_PYTHON", ROOT / ".venv-kserve" / "bin" / "python"))
SCRIPT = ROOT / "tests" / "v2server" / "kserve_onnx.py"

# skipped where the environment is absent, except in CI (CI=true), where `make test` builds it and a skip would
# hide a broken install step
pytestmark = pytest.mark.skipif(not PYTHON.exists() and not os.environ.get("CI"),
                                reason=f"no KServe environment at {PYTHON} (make venv-kserve)")


@contextlib.contextmanager
def kserve(onnx: Path, name: str, log: Path, output: str = "logits") -> Iterator[str]:
    port = free_port()
    env = os.environ | {"V2_ONNX": str(onnx), "V2_NAME": name, "V2_PORT": str(port), "V2_LOG": str(log),
                        "V2_OUTPUT": output, "OMP_NUM_THREADS": "1"}
    with open(log.with_suffix(".out"), "wb") as out:
        proc = subprocess.Popen([str(PYTHON), str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"KServe exited: {log.with_suffix('.out').read_text()[-2000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v2/models/{name}/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def server_images(log: Path) -> int:
    """Images the server answered, from its own log."""
    if not log.exists():
        return 0
    return sum(json.loads(line)["n"] for line in log.read_text().splitlines())


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from stealkit.models.export import export_model

    root = tmp_path_factory.mktemp("kserve")
    model_dir = make_victim(root / "digits")
    model, spec = load_model(model_dir)
    export_model(model, spec, root / "digits.onnx")
    return model_dir, root / "digits.onnx"


@pytest.mark.slow
def test_extraction_against_kserve_ledger_equals_server_log(victim, tmp_path: Path):
    model_dir, onnx = victim
    log = tmp_path / "answered.jsonl"
    with kserve(onnx, "digits", log) as url:
        oracle = V2HttpOracle(f"v2+{url}", model="digits", mode="logits", batch_size=64)
        assert oracle.input_shape == (1, 8, 8) and oracle.num_classes == 10 and not oracle.stealkit
        model, _ = load_model(model_dir)
        x = torch.rand(150, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        assert torch.allclose(oracle.query(x), model(x), atol=1e-5)  # three requests: 64 + 64 + 22
        assert oracle.ledger.as_dict()["predict"] == server_images(log) == 150
        capped = V2HttpOracle(f"{url}/v2/models/digits", mode="probs", budget=10)
        with pytest.raises(BudgetExhausted):
            capped.query(x[:11])  # over this oracle's budget: refused locally, never sent
        assert server_images(log) == 150
        with pytest.raises(InputError, match=r"/v2/models/nope: the server has no model 'nope'.*check --model"):
            V2HttpOracle(f"v2+{url}", model="nope")
        out = tmp_path / "run"
        assert main(["-q", "extract", "baseline", "--victim", f"v2+{url}", "--model", "digits", "--mode", "probs",
                     "--budget", "300", "--dataset", "digits", "--student", "mlp2", "--epochs", "3",
                     "--out", str(out), "--device", "cpu"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queries"]["predict"] == 300 and server_images(log) == 150 + 300
    assert json.loads((out / "config.json").read_text())["config"]["victim"] == f"v2+{url}/v2/models/digits"


@pytest.mark.slow
def test_label_only_kserve_server(victim, tmp_path: Path):
    model_dir, onnx = victim
    log = tmp_path / "answered.jsonl"
    with kserve(onnx, "labels", log, output="label") as url:
        with pytest.raises(InputError, match="do not say how many classes.*--num-classes"):
            V2HttpOracle(f"v2+{url}", model="labels")
        with pytest.raises(InputError, match="answers labels only.*pass --mode label"):
            V2HttpOracle(f"v2+{url}", model="labels", num_classes=10, mode="probs")
        oracle = V2HttpOracle(f"v2+{url}/v2/models/labels?num_classes=10")
        assert oracle.mode.value == "label"
        model, _ = load_model(model_dir)
        x = torch.rand(40, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        assert torch.equal(oracle.query(x), model(x).argmax(1))
        assert oracle.ledger.total == server_images(log) == 40


@pytest.mark.slow
def test_audit_against_kserve_is_not_reconcilable_and_its_ledger_equals_the_servers_log(victim, tmp_path: Path,
                                                                                         capsys):
    """KServe serves the Open Inference Protocol with no count of what it answered (no queries_used in its
    metadata, no statistics extension): the audit says "not reconcilable"; the test's own server log shows the
    ledger was right."""
    _, onnx = victim
    log = tmp_path / "answered.jsonl"
    with kserve(onnx, "digits", log) as url:
        out = tmp_path / "audit"
        assert main(["-q", "audit", "--victim", f"v2+{url}", "--model", "digits", "--dataset", "digits",
                     "--answers", "label", "--budgets", "20", "--recipe=--student=mlp2",
                     "--recipe=--student-arg=hidden=8", "--recipe=--epochs=1", "--recipe=--set=min_steps=0",
                     "--transfer-images", "10", "--decision-images", "0", "--datafree-budget", "0",
                     "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rec = summary["reconciliation"]
    assert rec["server"] is None and rec["equal"] is None and "not reconcilable" in rec["note"]
    evaluation = summary["evaluation"]["queries"]["predict"]  # the test split's labels, bought once
    assert rec["audit"]["predict"] == summary["queries"] + evaluation == server_images(log)
    assert summary["queries"] > 40 and evaluation == 450
    assert "queries not reconcilable" in capsys.readouterr().out
