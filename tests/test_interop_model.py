"""``--model`` (certify, serve) takes what ``--substitute`` takes: a model directory, an extraction run directory,
an ONNX or TorchScript file; an ONNX model serves predictions but refuses explanations."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from stealkit.cli import main
from stealkit.errors import InputError
from stealkit.models import load_model
from stealkit.models.export import export_model
from stealkit.models.locate import has_gradients, load_any_model
from stealkit.serve.app import create_app
from tests.test_serve_support import make_victim, write_keys

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

PREDICT = {"key": "predict-key-Zx81QpLw6RtV3mNb7Yc4", "name": "predictor", "mode": "probs", "budget": 100}
EXPLAIN = {"key": "explain-key-Zx81QpLw6RtV3mNb7Yc4", "name": "explainer", "mode": "probs", "explain": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One digits MLP in four forms: model directory, extraction run directory, ONNX file, TorchScript file."""
    root = tmp_path_factory.mktemp("models")
    model_dir = make_victim(root / "model")
    run = root / "run"
    shutil.copytree(model_dir, run / "student")
    (run / "config.json").write_text("{}")
    model, spec = load_model(model_dir)
    export_model(model, spec, root / "model.onnx", "onnx")
    export_model(model, spec, root / "model.pt", "torchscript")
    return {"dir": model_dir, "run": run, "onnx": root / "model.onnx", "torchscript": root / "model.pt"}


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def _x(n: int = 5) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_every_form_loads_as_the_same_model(models: dict[str, Path]) -> None:
    want = load_any_model(models["dir"])[0](_x())
    for form in ("run", "onnx", "torchscript"):
        model, spec = load_any_model(models[form])
        assert tuple(spec.input_shape) == (1, 8, 8) and spec.num_classes == 10
        assert spec.extra.get("dataset") == "digits"
        with torch.no_grad():
            assert torch.allclose(model(_x()), want, atol=1e-4), form
    assert [has_gradients(load_any_model(models[f])[1]) for f in ("dir", "onnx", "torchscript")] == [True, False, True]


def test_flags_on_a_model_directory_and_missing_paths_are_one_error(models: dict[str, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(["certify", "--model", str(models["dir"]), "--input-shape", "1,8,8", "--sigma", "0.25",
                      "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "only apply to an ONNX (.onnx) or TorchScript (.pt)" in out
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="extraction run directory"):
        load_any_model(tmp_path / "nowhere")


@pytest.mark.parametrize("form", ["run", "onnx", "torchscript"])
def test_certify_takes_every_form_and_certifies_the_same(models: dict[str, Path], tmp_path: Path, form: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    def certify(model: Path, out: Path) -> list[dict]:
        args = ["certify", "--model", str(model), "--sigma", "0.25", "--n0", "10", "--n", "40", "--num", "4",
                "--bound", "cohen", "--batch-size", "50", "--out", str(out)]
        code, text = _cli(args, capsys)
        assert code == 0, text
        return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]

    want = certify(models["dir"], tmp_path / "dir")
    got = certify(models[form], tmp_path / form)
    # same noise (seed 0), same model: the same votes, so the same labels and radii
    assert [(r["label"], r["counts"], r["radius"]) for r in got] == [(r["label"], r["counts"], r["radius"]) for r in want]


def test_serve_predicts_from_an_onnx_file_and_refuses_explaining_keys(models: dict[str, Path], tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.toml", [PREDICT])
    client = TestClient(create_app(models["onnx"], keys, tmp_path / "db.sqlite"))
    x = _x(3).numpy()
    r = client.post("/v1/predict", json={"inputs": x.tolist()}, headers={"Authorization": f"Bearer {PREDICT['key']}"})
    assert r.status_code == 200, r.text
    want = torch.softmax(load_any_model(models["dir"])[0](torch.from_numpy(x)), 1).detach().numpy()
    assert np.allclose(r.json()["outputs"], want, atol=1e-5)
    info = client.get("/v1/info", headers={"Authorization": f"Bearer {PREDICT['key']}"}).json()
    assert info["arch"] == "onnx" and info["queries_used"]["predict"] == 3
    both = write_keys(tmp_path / "both.toml", [PREDICT, EXPLAIN])
    with pytest.raises(InputError, match=r"ONNX: onnxruntime gives no gradients.*explainer"):
        create_app(models["onnx"], both, tmp_path / "db2.sqlite")


def test_serve_explains_from_a_torchscript_file(models: dict[str, Path], tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.toml", [EXPLAIN])
    client = TestClient(create_app(models["torchscript"], keys, tmp_path / "db.sqlite"))
    r = client.post("/v1/explain", json={"inputs": _x(2).tolist()}, headers={"Authorization": f"Bearer {EXPLAIN['key']}"})
    assert r.status_code == 200, r.text
    assert np.array(r.json()["outputs"]).shape == (2, 1, 8, 8)


def test_serve_command_refuses_an_onnx_model_with_explaining_keys_at_start_up(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = write_keys(tmp_path / "keys.toml", [EXPLAIN])
    code, out = _cli(["serve", "--model", str(models["onnx"]), "--keys", str(keys), "--db",
                      str(tmp_path / "db.sqlite")], capsys)
    assert code == 2 and "cannot explain" in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1
