"""What an ONNX/TorchScript victim returns (issue 49, point 4): probed when its metadata does not say,
``--output`` overriding, metadata winning over the probe, skl2onnx's two outputs and its ZipMap."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from stealkit.commands.common import victim_option
from stealkit.errors import InputError
from stealkit.models.foreign import PROBE_ROWS, ForeignClassifier, load_foreign, looks_like_probs
from stealkit.oracle import LocalOracle

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SHAPE = (1, 8, 8)
LOG = "stealkit.models.foreign"


def _net(softmax: bool) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 4), *([nn.Softmax(dim=1)] if softmax else [])).eval()


def _with_metadata(path: Path, metadata: dict[str, str]) -> Path:
    proto = onnx.load(str(path))
    for k, v in metadata.items():
        e = proto.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(proto, str(path))
    return path


def _onnx(path: Path, net: nn.Module, metadata: dict[str, str] | None = None) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notices
        torch.onnx.export(net, (torch.rand(2, *SHAPE),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    return _with_metadata(path, metadata) if metadata else path


def _torchscript(path: Path, net: nn.Module,
                 meta: str = '{"input_shape": [1, 8, 8], "value_range": "0,1", "normalize": "none"}') -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notices
        torch.jit.save(torch.jit.script(net), str(path), _extra_files={"stealkit.json": meta})
    return path


def _images(n: int = 6) -> torch.Tensor:
    return torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(3))


def _oracle(model: nn.Module, mode: str) -> LocalOracle:
    return LocalOracle(model, SHAPE, num_classes=4, mode=mode, budget=100)


def _output_lines(caplog: pytest.LogCaptureFixture, path: Path) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOG and str(path) in r.getMessage() and "output read as"
            in r.getMessage()]


# -- the probe ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_softmax_ended_file_without_metadata_is_probed_and_read_as_probabilities(fmt, tmp_path, caplog):
    net = _net(softmax=True)
    path = _onnx(tmp_path / "m.onnx", net) if fmt == "onnx" else _torchscript(tmp_path / "m.pt", net)
    with caplog.at_level(logging.INFO, logger=LOG):
        model, meta = load_foreign(path)
    assert meta.output == "probs" and meta.output_source == "probe"
    assert meta.record() | {"assumed": []} == {"format": fmt, "output": "probs", "output_source": "probe",
                                               "assumed": []}
    x = _images()
    want = net(x).detach()
    got = _oracle(model, "probs").query(x)
    assert torch.allclose(got, want, atol=1e-5)  # the model's own probabilities ...
    assert not torch.allclose(got, want.softmax(dim=1), atol=1e-3)  # ... not a softmax of them
    assert torch.equal(_oracle(model, "label").query(x), want.argmax(dim=1))
    (line,) = _output_lines(caplog, path)  # one line naming the file and the decision
    assert line.levelno == logging.WARNING and "probabilities" in line.getMessage()
    assert "probed" in line.getMessage() and "--output logits" in line.getMessage()


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_logits_file_without_metadata_stays_logits(fmt, tmp_path, caplog):
    net = _net(softmax=False)
    path = _onnx(tmp_path / "m.onnx", net) if fmt == "onnx" else _torchscript(tmp_path / "m.pt", net)
    with caplog.at_level(logging.INFO, logger=LOG):
        model, meta = load_foreign(path)
    assert meta.output == "logits" and meta.output_source == "probe"
    x = _images()
    assert torch.allclose(_oracle(model, "logits").query(x), net(x).detach(), atol=1e-5)
    assert torch.allclose(_oracle(model, "probs").query(x), net(x).detach().softmax(dim=1), atol=1e-5)
    (line,) = _output_lines(caplog, path)
    assert "logits" in line.getMessage() and "probed" in line.getMessage()


def test_the_probe_rule():
    p = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    assert looks_like_probs(p)
    assert not looks_like_probs(p + 1e-3)  # rows summing to 1.002
    assert not looks_like_probs(torch.tensor([[1.5, -0.5], [0.3, 0.7]]))  # sums to 1 but negative
    assert looks_like_probs(p.half()) and not looks_like_probs(torch.empty(0, 2))
    assert PROBE_ROWS >= 8


def test_the_probe_batch_is_fixed_and_spans_the_input_range(tmp_path, monkeypatch):
    seen: list[torch.Tensor] = []
    prepare = ForeignClassifier.prepare

    def spy(self: ForeignClassifier, x: torch.Tensor) -> torch.Tensor:
        z = prepare(self, x)
        seen.append(z.clone())
        return z

    monkeypatch.setattr(ForeignClassifier, "prepare", spy)
    path = tmp_path / "m.pt"
    _torchscript(path, _net(softmax=False), '{"input_shape": [1, 8, 8], "value_range": "0,255"}')
    load_foreign(path)
    load_foreign(path)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1]) and seen[0].shape == (PROBE_ROWS, *SHAPE)
    assert seen[0].min() >= 0 and seen[0].max() <= 255 and seen[0].max() > 200  # the model's own range


# -- what overrides the probe ------------------------------------------------------------------------------

def test_output_flag_overrides_the_probe_and_warns_when_rows_look_like_probabilities(tmp_path, caplog):
    net = _net(softmax=True)
    path = _onnx(tmp_path / "m.onnx", net)
    with caplog.at_level(logging.INFO, logger=LOG):
        model, meta = load_foreign(f"{path}?output=logits")
    assert meta.output == "logits" and meta.output_source == "flag"
    x = _images()
    assert torch.allclose(_oracle(model, "logits").query(x), net(x).detach(), atol=1e-6)  # obeyed
    (line,) = _output_lines(caplog, path)
    assert line.levelno == logging.WARNING and "--output says so" in line.getMessage()
    assert "--output probs" in line.getMessage()
    # the flag also beats the file's metadata
    tagged = _onnx(tmp_path / "tagged.onnx", net, {"output": "logits"})
    assert load_foreign(tagged, flags={"output": "probs"})[1].output_source == "flag"
    assert load_foreign(f"{tagged}?output=probs")[1].output == "probs"


def test_metadata_wins_over_the_probe(tmp_path, caplog):
    soft = _onnx(tmp_path / "soft.onnx", _net(softmax=True), {"output": "logits"})
    with caplog.at_level(logging.INFO, logger=LOG):
        meta = load_foreign(soft)[1]
    assert meta.output == "logits" and meta.output_source == "metadata"
    (line,) = _output_lines(caplog, soft)
    assert line.levelno == logging.WARNING and "its metadata says so" in line.getMessage()
    declared = load_foreign(_onnx(tmp_path / "declared.onnx", _net(softmax=True), {"output": "probs"}))[1]
    assert declared.output == "probs" and declared.output_source == "metadata"
    # probabilities declared for a model that returns negative values: there is no log of them
    logits = _onnx(tmp_path / "logits.onnx", _net(softmax=False), {"output": "probs"})
    with pytest.raises(InputError, match="says output=probs, but the model returns negative values.*--output logits"):
        load_foreign(logits)
    assert load_foreign(f"{logits}?output=logits")[1].output == "logits"


def test_the_output_option_is_folded_into_the_victim_string(tmp_path):
    path = _onnx(tmp_path / "m.onnx", _net(softmax=True))

    @click.command()
    @victim_option()
    def show(victim: str) -> None:
        click.echo(victim)

    res = CliRunner().invoke(show, ["--victim", str(path), "--output", "logits"])
    assert res.exit_code == 0 and res.output.strip() == f"{path}?output=logits"
    res = CliRunner().invoke(show, ["--victim", str(path), "--output", "softmax"])
    assert res.exit_code == 2 and "'logits', 'probs'" in res.output
    res = CliRunner().invoke(show, ["--victim", str(path), "--output", "probs", "--input-shape", "1,8,8"])
    assert res.output.strip() == f"{path}?output=probs&input_shape=1,8,8"


def test_audit_and_every_victim_command_take_output():
    from stealkit.cli import cli

    for args in (["audit"], ["extract", "baseline"], ["attack", "pgd"], ["certify"], ["serve"]):
        res = CliRunner().invoke(cli, [*args, "--help"])
        assert res.exit_code == 0 and "--output [logits|probs]" in res.output, args


# -- scikit-learn (skl2onnx) graphs --------------------------------------------------------------------------

W = np.random.RandomState(0).randn(64, 3).astype(np.float32)


def _skl_like(path: Path, *, zipmap: bool, keys: list, label_op: str = "ArgMax") -> Path:
    """A graph shaped like skl2onnx's classifier output: a label output first, then the probabilities, as a
    float tensor [N, 3] or (``zipmap``) a ZipMap of {class: probability} maps with classes ``keys``."""
    strings = isinstance(keys[0], str)
    kt = TensorProto.STRING if strings else TensorProto.INT64
    labels = helper.make_tensor("classes", kt, [len(keys)], [k.encode() for k in keys] if strings else keys)
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "W"], ["z"]),
        helper.make_node("Softmax", ["z"], ["p"], axis=1),
        helper.make_node(label_op, ["p"], ["idx"], axis=1, keepdims=0),
        helper.make_node("ArrayFeatureExtractor", ["classes", "idx"], ["lab2"], domain="ai.onnx.ml"),
        helper.make_node("Reshape", ["lab2", "minus1"], ["label"]),
    ]
    if zipmap:
        attr = "classlabels_strings" if strings else "classlabels_int64s"
        nodes.append(helper.make_node("ZipMap", ["p"], ["output_probability"], domain="ai.onnx.ml", **{attr: keys}))
        prob = helper.make_value_info("output_probability", helper.make_sequence_type_proto(
            helper.make_map_type_proto(kt, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["probabilities"]))
        prob = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", len(keys)])
    graph = helper.make_graph(
        nodes, "skl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *SHAPE])],
        [helper.make_tensor_value_info("label", kt, ["N"]), prob],
        [numpy_helper.from_array(W, "W"), labels, numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _softmax_of_w(x: torch.Tensor) -> torch.Tensor:
    return (x.reshape(x.shape[0], -1) @ torch.from_numpy(W)).softmax(dim=1)


def test_skl2onnx_two_outputs_the_probability_tensor_is_read_not_the_label(tmp_path):
    model, meta = load_foreign(_skl_like(tmp_path / "skl.onnx", zipmap=False, keys=[0, 1, 2]))
    assert meta.output == "probs" and meta.output_source == "probe" and meta.num_classes == 3
    x = _images()
    oracle = LocalOracle(model, SHAPE, num_classes=3, mode="probs", budget=100)
    assert torch.allclose(oracle.query(x), _softmax_of_w(x), atol=1e-5)


@pytest.mark.parametrize("keys", [[3, 1, 7], ["cat", "ant", "bee"]])
def test_a_zipmap_is_read_as_probabilities_in_sorted_key_order(keys, tmp_path):
    model, meta = load_foreign(_skl_like(tmp_path / "zip.onnx", zipmap=True, keys=keys))
    assert meta.output == "probs" and meta.num_classes == 3
    order = sorted(keys)
    assert meta.class_names == [str(k) for k in order]
    x = _images()
    p = _softmax_of_w(x)  # column j is the class keys[j]
    want = p[:, [keys.index(k) for k in order]]
    oracle = LocalOracle(model, SHAPE, num_classes=3, mode="probs", budget=100)
    assert torch.allclose(oracle.query(x), want, atol=1e-5)
    assert torch.allclose(load_foreign(tmp_path / "zip.onnx")[0](x).softmax(dim=1), want, atol=1e-5)


def test_a_zipmap_that_disagrees_with_its_labels_is_refused_naming_zipmap_false(tmp_path):
    path = _skl_like(tmp_path / "zip.onnx", zipmap=True, keys=[0, 1, 2], label_op="ArgMin")
    with pytest.raises(InputError, match=r"returns a ZipMap .*disagrees with its label output.*'zipmap': False"):
        load_foreign(path)
