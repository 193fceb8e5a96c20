"""Interop: ONNX and TorchScript victims, ``stealkit export``, ``--substitute RUNDIR``."""

from __future__ import annotations

import json
import pickle
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from stealkit.cli import main
from stealkit.errors import InputError, StealkitError, UnsafeFileError
from stealkit.extract.common import open_victim
from stealkit.models import ModelSpec, build_model, load_model, save_model
from stealkit.models.export import TOLERANCE, export_model
from stealkit.models.foreign import load_foreign
from stealkit.models.foreign_meta import META_FILE, join_victim, split_victim
from stealkit.models.locate import load_substitute, locate_model_dir
from stealkit.oracle import LocalOracle

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SHAPE = (1, 8, 8)


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small conv2 trained briefly on digits, saved as a stealkit model directory."""
    from stealkit.data import load_splits
    from stealkit.train import TrainConfig, fit

    torch.manual_seed(0)
    model = build_model("conv2", input_shape=SHAPE, num_classes=10, c1=8, c2=16, hidden=32)
    train = load_splits("digits").victim_train
    fit(model, train.x, train.y, TrainConfig(epochs=4, batch_size=64, lr=1e-2))
    model.eval()
    spec = ModelSpec.from_model(model, extra={"dataset": "digits", "split_seed": 0})
    return save_model(model, spec, tmp_path_factory.mktemp("zoo") / "victim")


@pytest.fixture(scope="module")
def exports(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("exports")
    model, spec = load_model(zoo_dir)
    files = {"onnx": out / "victim.onnx", "torchscript": out / "victim.pt", "safetensors": out / "victim.safetensors"}
    for fmt, path in files.items():
        res = export_model(model, spec, path, fmt)
        assert res.max_abs_diff <= TOLERANCE and path.exists()
    return files


def _images(n: int = 6) -> torch.Tensor:
    return torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(3))


def _plain_onnx(path: Path, *, shape: list, out_dim: int = 4, metadata: dict[str, str] | None = None,
                softmax: bool = False) -> Path:
    """An ONNX file not written by stealkit: a flatten + linear layer, input of the given (symbolic) shape."""
    import onnx

    torch.manual_seed(1)
    flat = int(torch.tensor(SHAPE).prod())
    net = nn.Sequential(nn.Flatten(), nn.Linear(flat, out_dim), *([nn.Softmax(dim=1)] if softmax else [])).eval()
    b = shape[0] if isinstance(shape[0], int) else 2
    example = torch.rand(b, *SHAPE) if len(shape) == 4 else torch.rand(b, flat)
    axes = {"x": {0: "batch"}} if isinstance(shape[0], str) else None
    if len(shape) == 4 and isinstance(shape[2], str):
        axes = {"x": {0: "batch", 2: "h", 3: "w"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notices
        torch.onnx.export(net, (example,), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes=axes)
    if metadata:
        proto = onnx.load(str(path))
        for k, v in metadata.items():
            e = proto.metadata_props.add()
            e.key, e.value = k, v
        onnx.save(proto, str(path))
    return path


# -- loading: round trips and metadata ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "safetensors"])
def test_round_trip_answers_like_the_zoo_model(fmt, zoo_dir, exports):
    model, _ = load_model(zoo_dir)
    x = _images()
    v = open_victim(str(exports[fmt]), mode="logits")
    assert v.input_shape == SHAPE and v.num_classes == 10 and v.dataset == "digits"
    assert torch.allclose(v.oracle.query(x), model(x).detach(), atol=1e-5)


def test_metadata_is_read_from_the_file(exports):
    for fmt in ("onnx", "torchscript"):
        model, meta = load_foreign(exports[fmt])
        assert meta.format == fmt and meta.input_shape == SHAPE and meta.num_classes == 10
        assert meta.value_range == (0.0, 1.0) and meta.mean is None and meta.assumed == ()
        assert meta.class_names == [str(i) for i in range(10)] and meta.extra == {"dataset": "digits", "split_seed": 0}
    with zipfile.ZipFile(exports["torchscript"]) as zf:
        assert any(n.endswith(f"extra/{META_FILE}") for n in zf.namelist())
        assert not any("traced_inputs" in n for n in zf.namelist())  # no data baked into the export


@pytest.mark.parametrize("mode", ["label", "topk", "probs", "logits"])
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_every_prediction_mode_through_local_oracle_and_the_ledger(fmt, mode, zoo_dir, exports):
    ref = open_victim(str(zoo_dir), mode=mode, top_k=3, budget=10)
    v = open_victim(str(exports[fmt]), mode=mode, top_k=3, budget=10)
    assert isinstance(v.oracle, LocalOracle)
    x = _images(6)
    got, want = v.oracle.query(x), ref.oracle.query(x)
    assert got.shape == want.shape
    assert torch.allclose(got.float(), want.float(), atol=1e-5)
    assert v.oracle.ledger.as_dict() == ref.oracle.ledger.as_dict() == {"predict": 6, "explain": 0}
    with pytest.raises(StealkitError):  # 6 + 6 > 10: refused whole, nothing charged
        v.oracle.query(x)
    assert v.oracle.ledger.as_dict()["predict"] == 6


def test_torchscript_explains_onnx_says_it_cannot(zoo_dir, exports):
    x = _images(3)
    ref = open_victim(str(zoo_dir), explain=True)
    ts = open_victim(str(exports["torchscript"]), explain=True)
    g = ts.oracle.explain(x)
    assert g.shape == x.shape and torch.allclose(g, ref.oracle.explain(x), atol=1e-5)
    assert ts.oracle.ledger.as_dict() == {"predict": 0, "explain": 3}
    with pytest.raises(InputError, match="ONNX victim.*no gradients.*explanation"):
        open_victim(str(exports["onnx"]), explain=True)


def test_onnx_without_metadata_needs_the_input_shape(tmp_path, caplog):
    path = _plain_onnx(tmp_path / "plain.onnx", shape=["batch", 1, "h", "w"])
    with pytest.raises(InputError, match=r"input shape is unknown.*--input-shape C,H,W"):
        open_victim(str(path))
    with caplog.at_level("WARNING"):
        v = open_victim(str(path) + "?input_shape=1,8,8", mode="logits")
    assert "gives value_range or normalize; assuming pixels in [0, 1]" in caplog.text
    assert v.input_shape == SHAPE and v.num_classes == 4  # classes read from the graph's output
    assert v.oracle.query(_images(2)).shape == (2, 4)


def test_static_graph_shape_is_enough_and_a_contradicting_flag_is_an_error(tmp_path):
    path = _plain_onnx(tmp_path / "static.onnx", shape=["batch", 1, 8, 8])
    assert open_victim(str(path)).input_shape == SHAPE
    with pytest.raises(InputError, match=r"graph takes images of shape \[1, 8, 8\] but input_shape says \[3, 8, 8\]"):
        open_victim(str(path) + "?input_shape=3,8,8")
    with pytest.raises(InputError, match="num_classes says 7 classes but the model returns 4"):
        open_victim(str(path) + "?num_classes=7")


def test_flat_input_fixed_batch_value_range_and_probs_output(tmp_path):
    flat = _plain_onnx(tmp_path / "flat.onnx", shape=[2, 64], out_dim=3,
                       metadata={"input_shape": "1,8,8", "value_range": "0,255", "normalize": "0.5,2"})
    v = open_victim(str(flat), mode="logits")
    x = _images(5)  # five images through a graph that takes exactly two at a time (the last pair padded)
    model, meta = load_foreign(flat)
    assert meta.value_range == (0.0, 255.0) and meta.mean == [0.5] and meta.std == [2.0]
    z = torch.cat([((x * 255.0 - 0.5) / 2.0).reshape(5, -1), torch.zeros(1, 64)]).numpy()
    sess = ort.InferenceSession(str(flat), providers=["CPUExecutionProvider"])
    want = torch.cat([torch.from_numpy(sess.run(None, {"x": z[i : i + 2]})[0]) for i in (0, 2, 4)])[:5]
    assert torch.allclose(v.oracle.query(x), want, atol=1e-4)
    logits = _plain_onnx(tmp_path / "logits.onnx", shape=["batch", 1, 8, 8])
    probs = _plain_onnx(tmp_path / "probs.onnx", shape=["batch", 1, 8, 8], metadata={"output": "probs"}, softmax=True)
    assert load_foreign(probs)[1].output == "probs"
    for mode in ("probs", "label"):  # a softmax output answers like the logits it came from
        want = open_victim(str(logits), mode=mode).oracle.query(x)
        assert torch.allclose(open_victim(str(probs), mode=mode).oracle.query(x).float(), want.float(), atol=1e-5)


def test_onnx_whose_input_is_not_an_image(tmp_path):
    path = _plain_onnx(tmp_path / "vec.onnx", shape=["batch", 64])
    with pytest.raises(InputError, match="flat vectors of 64 values but input_shape \\[1, 4, 4\\]"):
        open_victim(str(path) + "?input_shape=1,4,4")
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(InputError, match="is not an ONNX model onnxruntime can load"):
        open_victim(str(bad))


def test_torchscript_without_metadata_and_flag_checks(tmp_path):
    path = tmp_path / "plain.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notices
        torch.jit.save(torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(64, 5))), str(path))
    with pytest.raises(InputError, match="input shape is unknown"):
        open_victim(str(path))
    with pytest.raises(InputError, match="failed on a batch of shape \\[16, 3, 8, 8\\]"):
        open_victim(str(path) + "?input_shape=3,8,8")
    v = open_victim(str(path) + "?input_shape=1,8,8&num_classes=5", mode="label")
    assert v.num_classes == 5 and v.oracle.query(_images(4)).shape == (4,)
    with pytest.raises(InputError, match="normalize has 3 mean"):
        open_victim(str(path) + "?input_shape=1,8,8&normalize=0.1,0.2,0.3/1,1,1")


@pytest.mark.parametrize("text, match", [
    ("input_shape=1,8", "three positive ints"), ("num_classes=1", "integer >= 2"),
    ("value_range=1,0", "LO < HI"), ("normalize=0.5,0", "std must be positive"), ("colour=red", "unknown option"),
])
def test_bad_option_values_are_one_clear_error(text, match, exports):
    with pytest.raises(InputError, match=match):
        open_victim(f"{exports['torchscript']}?{text}")


def test_victim_string_carries_the_flags():
    s = join_victim("m.onnx", {"input_shape": "1,28,28", "normalize": "0.1/0.3"})
    assert split_victim(s) == ("m.onnx", {"input_shape": "1,28,28", "normalize": "0.1/0.3"})
    assert split_victim("http://host:8000/?a=1") == ("http://host:8000/?a=1", {})
    with pytest.raises(InputError, match="only apply to an ONNX .* or TorchScript"):
        join_victim("runs/victim", {"num_classes": "10"})


# -- safety: a pickle is never loaded ----------------------------------------------------------------------

def test_pickled_torch_save_files_are_refused(tmp_path, zoo_dir):
    model, _ = load_model(zoo_dir)
    zipped = tmp_path / "checkpoint.pt"
    torch.save(model, zipped)  # a zip archive holding a pickle: torch.load would run its code
    legacy = tmp_path / "legacy.pth"
    legacy.write_bytes(pickle.dumps({"w": [1, 2]}, protocol=2))
    for path in (zipped, legacy):
        with pytest.raises(UnsafeFileError, match="not TorchScript.*torch.jit.save.*never unpickles"):
            open_victim(str(path))
        with pytest.raises(UnsafeFileError):
            load_substitute(path)


# -- export ------------------------------------------------------------------------------------------------

def test_export_cli_reports_the_max_difference_and_reloads(tmp_path, zoo_dir, capsys):
    out = tmp_path / "stolen.onnx"
    assert main(["export", str(zoo_dir), "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "onnx" in line and "max |logit difference|" in line and out.exists()
    assert float(line.rsplit(" ", 1)[1]) <= TOLERANCE
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["input_shape"] == "1,8,8" and meta["num_classes"] == "10" and meta["normalize"] == "none"
    assert json.loads(meta["stealkit_spec"])["arch"] == "conv2"


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "safetensors"])
@pytest.mark.slow
def test_export_of_a_batchnorm_model_stays_in_eval_mode(fmt, tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet", input_shape=SHAPE, num_classes=10, depth=8, width=0.125).eval()
    with torch.no_grad():  # give BatchNorm running statistics unlike any single batch's
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    suffix = {"onnx": ".onnx", "torchscript": ".pt", "safetensors": ".safetensors"}[fmt]
    res = export_model(model, ModelSpec.from_model(model), tmp_path / f"r{suffix}", batch=16)
    assert res.max_abs_diff <= TOLERANCE
    assert not any(m.training for m in model.modules())


def test_export_that_does_not_match_writes_nothing(tmp_path, zoo_dir):
    model, spec = load_model(zoo_dir)
    out = tmp_path / "x.pt"
    with pytest.raises(StealkitError, match="differs from the model by .* nothing was written"):
        export_model(model, spec, out, tolerance=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_export_checks_format_and_suffix(tmp_path, zoo_dir, capsys):
    assert main(["export", str(zoo_dir), "--format", "onnx", "--out", str(tmp_path / "m.pt")]) == 2
    assert "must be named .onnx" in capsys.readouterr().err
    assert main(["export", str(zoo_dir), "--out", str(tmp_path / "m.bin")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "neither a model directory" in capsys.readouterr().err


def test_single_safetensors_file_loads_alone(exports, zoo_dir):
    model, spec = load_model(exports["safetensors"])
    assert spec == load_model(zoo_dir)[1]


# -- the CLI: flags, run directories ----------------------------------------------------------------------

def test_flags_reach_the_loader_and_are_refused_for_model_directories(tmp_path, zoo_dir, capsys):
    path = _plain_onnx(tmp_path / "plain.onnx", shape=["batch", 1, "h", "w"])
    args = ["extract", "baseline", "--budget", "20", "--dataset", "digits", "--student", "mlp2", "--epochs", "1"]
    assert main([*args, "--victim", str(path), "--out", str(tmp_path / "r1")]) == 2
    assert "--input-shape C,H,W" in capsys.readouterr().err
    assert main([*args, "--victim", str(zoo_dir), "--input-shape", "1,8,8", "--out", str(tmp_path / "r2")]) == 2
    assert "only apply to an ONNX" in capsys.readouterr().err
    ten = _plain_onnx(tmp_path / "ten.onnx", shape=["batch", 1, "h", "w"], out_dim=10)
    assert main([*args, "--input-shape", "1,8,8", "--value-range", "0,1", "--normalize", "none",
                 "--victim", str(ten), "--out", str(tmp_path / "r3")]) == 0
    assert json.loads((tmp_path / "r3" / "summary.json").read_text())["queries"] == {"predict": 20, "explain": 0}
    assert f"{ten}?input_shape=1,8,8&value_range=0,1&normalize=none" in (tmp_path / "r3" / "config.json").read_text()


def test_a_copy_of_an_onnx_module_shares_its_session(exports):
    import copy

    model, _ = load_foreign(exports["onnx"])
    x = _images(3)
    assert torch.equal(copy.deepcopy(model)(x), model(x))


def test_extract_from_onnx_then_attack_with_the_run_directory(tmp_path, exports, capsys):
    run = tmp_path / "steal-from.onnx"  # a directory, whatever its name says
    assert main(["extract", "baseline", "--victim", str(exports["onnx"]), "--mode", "probs", "--budget", "60",
                 "--student", "mlp2", "--epochs", "2", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["queries"] == {"predict": 60, "explain": 0}
    assert locate_model_dir(run) == run / "student"
    att = tmp_path / "pgd"
    assert main(["attack", "pgd", "--substitute", str(run), "--victim", str(exports["torchscript"]),
                 "--n", "10", "--steps", "2", "--out", str(att)]) == 0
    res = json.loads((att / "summary.json").read_text())
    assert res["n"] == 10 and res["attempts"] > 0
    assert res["victim_queries"]["predict"] == res["clean_queries"] + res["adversarial_queries"] > 10
    capsys.readouterr()
    assert main(["attack", "pgd", "--substitute", str(tmp_path), "--victim", str(exports["onnx"]),
                 "--n", "5", "--out", str(tmp_path / "pgd2")]) == 2
    err = capsys.readouterr().err
    assert "neither a model directory" in err and "extraction run directory (holding student/" in err
    assert main(["attack", "pgd", "--substitute", str(exports["onnx"]), "--victim", str(exports["onnx"]),
                 "--n", "5", "--out", str(tmp_path / "pgd3")]) == 2
    assert "no gradients" in capsys.readouterr().err


def test_cuda_provider_only_where_onnxruntime_has_it(caplog):
    from stealkit.models.foreign import _providers

    class FakeOrt:
        def __init__(self, providers: list[str]) -> None:
            self.providers = providers

        def get_available_providers(self) -> list[str]:
            return self.providers

    gpu = FakeOrt(["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu = FakeOrt(["CPUExecutionProvider"])
    assert _providers(gpu, torch.device("cuda")) == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert _providers(gpu, torch.device("cpu")) == ["CPUExecutionProvider"]
    with caplog.at_level("WARNING"):
        assert _providers(cpu, torch.device("cuda:0")) == ["CPUExecutionProvider"]
    assert "no CUDA provider" in caplog.text
