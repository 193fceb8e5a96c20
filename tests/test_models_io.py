"""save_model / load_model: exact round trips, atomic writes, strict loading, and refusal of pickles."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import stealkit.models.io as models_io
from stealkit.errors import InputError, UnsafeFileError
from stealkit.models import ModelSpec, build_model, load_model, save_model

CASES = [
    ("resnet", (3, 32, 32), {"depth": 8, "width": 0.25}),
    ("conv2", (1, 28, 28), {}),
    ("mlp2", (1, 8, 8), {"hidden": 32}),
    ("vgg11", (1, 8, 8), {}),
    ("lenet5", (1, 28, 28), {"activation": "relu"}),
]


@pytest.fixture(autouse=True)
def _single_thread():
    """These models are tiny: on a small, busy machine, intra-op thread syncs cost more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make(arch="conv2", shape=(1, 28, 28), **kw):
    torch.manual_seed(0)
    model = build_model(arch, input_shape=shape, num_classes=10, mean=0.25, std=0.4, **kw)
    model.train()
    with torch.no_grad():  # move batch-norm running statistics away from their initial values
        model(torch.rand(8, *shape))
    return model.eval()


def spec_of(model, **kw) -> ModelSpec:
    return ModelSpec.from_model(
        model, class_names=[f"c{i}" for i in range(10)], metrics={"accuracy": 0.5}, extra={"note": "t", **kw}
    )


@pytest.mark.parametrize("arch,shape,kw", CASES, ids=[c[0] for c in CASES])
def test_round_trip_gives_identical_outputs(tmp_path, arch, shape, kw):
    model = make(arch, shape, **kw)
    spec = spec_of(model)
    out_dir = save_model(model, spec, tmp_path / "m")
    assert out_dir == tmp_path / "m"
    assert sorted(p.name for p in out_dir.iterdir()) == ["model.json", "model.safetensors"]
    loaded, loaded_spec = load_model(out_dir)
    assert not loaded.training
    assert loaded_spec == spec
    x = torch.rand(4, *shape)
    assert torch.equal(loaded(x), model(x))
    sd, lsd = model.state_dict(), loaded.state_dict()
    assert sd.keys() == lsd.keys() and all(torch.equal(sd[k], lsd[k]) for k in sd)


def test_any_of_the_three_paths_loads(tmp_path):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    x = torch.rand(2, 1, 28, 28)
    for p in (tmp_path, tmp_path / "model.json", tmp_path / "model.safetensors", str(tmp_path)):
        loaded, spec = load_model(p, device="cpu")
        assert torch.equal(loaded(x), model(x))
        assert spec.class_names[3] == "c3" and spec.metrics == {"accuracy": 0.5} and spec.extra["note"] == "t"


def test_files_on_disk(tmp_path):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    data = json.loads((tmp_path / "model.json").read_text())
    assert data["arch"] == "conv2" and data["kwargs"] == {"c1": 32, "c2": 64, "hidden": 128}
    with open(tmp_path / "model.safetensors", "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    assert header["__metadata__"]["format"] == "pt"
    assert "net.0.weight" in header


def test_loading_does_not_touch_the_global_rng(tmp_path):
    model = make("resnet", (3, 32, 32), depth=8, width=0.25)
    save_model(model, spec_of(model), tmp_path)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    load_model(tmp_path)
    assert torch.equal(torch.rand(3), want)


def test_failed_save_leaves_old_files_and_no_temporaries(tmp_path, monkeypatch):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def crash(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(models_io, "save_file", crash)
    other = make("conv2", (1, 28, 28), c1=4)
    with pytest.raises(OSError, match="disk full"):
        save_model(other, spec_of(other), tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before
    monkeypatch.undo()
    loaded, _ = load_model(tmp_path)
    assert torch.equal(loaded(torch.ones(1, 1, 28, 28)), model(torch.ones(1, 1, 28, 28)))


def test_overwrite_replaces_both_files(tmp_path):
    a, b = make(), make("mlp2", (1, 28, 28))
    save_model(a, spec_of(a), tmp_path)
    save_model(b, spec_of(b), tmp_path)
    loaded, spec = load_model(tmp_path)
    assert spec.arch == "mlp2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.safetensors"]


def test_safetensors_whose_first_byte_is_0x80_is_not_mistaken_for_a_pickle(tmp_path):
    # The header grows by one byte per padding character (then is rounded up to a multiple of 8), so aim the
    # padding at a header length whose low byte is 0x80 and try the few lengths around it.
    model = make("logistic", (1, 8, 8))
    save_model(model, spec_of(model, pad=""), tmp_path)
    start = (0x80 - (tmp_path / "model.safetensors").read_bytes()[0]) % 256
    for n in range(max(0, start - 8), start + 9):
        save_model(model, spec_of(model, pad="x" * n), tmp_path)
        if (tmp_path / "model.safetensors").read_bytes()[:1] == b"\x80":
            break
    else:
        pytest.fail("could not produce a safetensors header whose length has low byte 0x80")
    loaded, _ = load_model(tmp_path)
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(loaded(x), model(x))


# --- refusing pickles -----------------------------------------------------------------------------------


class Payload:
    """Unpickling this creates ``marker``: proof that a file was unpickled."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_pickle(path: Path, marker: Path) -> None:
    with open(path, "wb") as fh:
        pickle.dump({"weights": Payload(marker)}, fh, protocol=4)


def write_torch(path: Path, marker: Path) -> None:
    torch.save({"weights": Payload(marker)}, path)


def test_payload_really_runs_when_unpickled(tmp_path):
    marker = tmp_path / "ran"
    write_pickle(tmp_path / "p.pkl", marker)
    with open(tmp_path / "p.pkl", "rb") as fh:
        pickle.load(fh).get("weights").close()
    assert marker.exists()


@pytest.mark.parametrize("writer", [write_pickle, write_torch], ids=["pickle", "torch.save"])
@pytest.mark.parametrize(
    "name", ["model.pt", "model.pth", "model.pkl", "model.pickle", "model.ckpt", "pytorch_model.bin"]
)
def test_pickle_suffixes_are_refused(tmp_path, writer, name):
    marker = tmp_path / "ran"
    writer(tmp_path / name, marker)
    with pytest.raises(UnsafeFileError, match="save_model") as err:
        load_model(tmp_path / name)
    assert "run arbitrary code" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("writer", [write_pickle, write_torch], ids=["pickle", "torch.save"])
@pytest.mark.parametrize("disguise", ["model.safetensors", "model.json"])
def test_pickles_are_refused_by_content_whatever_their_name(tmp_path, writer, disguise):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    marker = tmp_path / "ran"
    writer(tmp_path / disguise, marker)
    with pytest.raises(UnsafeFileError, match="pickle|zip"):
        load_model(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("writer", [write_pickle, write_torch], ids=["pickle", "torch.save"])
def test_pickle_with_an_unknown_suffix_is_refused(tmp_path, writer):
    marker = tmp_path / "ran"
    writer(tmp_path / "weights.dat", marker)
    with pytest.raises(UnsafeFileError):
        load_model(tmp_path / "weights.dat")
    assert not marker.exists()


def test_directory_of_checkpoints_is_refused_with_a_hint(tmp_path):
    marker = tmp_path / "ran"
    write_torch(tmp_path / "checkpoint.pt", marker)
    with pytest.raises(UnsafeFileError, match="checkpoint.pt"):
        load_model(tmp_path)
    assert not marker.exists()


def test_protocol_0_pickle_is_never_unpickled(tmp_path):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    marker = tmp_path / "ran"
    with open(tmp_path / "model.safetensors", "wb") as fh:
        pickle.dump(Payload(marker), fh, protocol=0)
    with pytest.raises(InputError, match="safetensors"):
        load_model(tmp_path)
    assert not marker.exists()


# --- mismatches and missing files -----------------------------------------------------------------------


def test_weights_that_do_not_match_the_spec(tmp_path):
    model = make("conv2", (1, 28, 28), c1=8)
    spec = spec_of(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    wrong = ModelSpec.from_dict({**spec.to_dict(), "kwargs": {"c1": 16, "c2": 64, "hidden": 128}})
    (tmp_path / "model.json").write_text(wrong.to_json())
    with pytest.raises(InputError, match="don't match the spec.*wrong shape: net.0.weight"):
        load_model(tmp_path)
    wrong = ModelSpec.from_dict({**spec.to_dict(), "arch": "mlp2", "kwargs": {}})
    (tmp_path / "model.json").write_text(wrong.to_json())
    with pytest.raises(InputError, match="don't match the spec.*missing.*unexpected"):
        load_model(tmp_path)


def test_edited_spec_is_caught(tmp_path):
    model = make("conv2", (1, 28, 28))
    save_model(model, spec_of(model), tmp_path)
    data = json.loads((tmp_path / "model.json").read_text())
    data["num_classes"] = 5
    data["class_names"] = data["class_names"][:5]
    (tmp_path / "model.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="different saves"):
        load_model(tmp_path)
    data = json.loads(spec_of(model).to_json())
    data["mean"] = [0.5]
    (tmp_path / "model.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="normalisation mean"):
        load_model(tmp_path)


def test_save_refuses_a_spec_that_does_not_describe_the_model(tmp_path):
    model = make("conv2", (1, 28, 28))
    spec = ModelSpec(arch="conv2", input_shape=(1, 28, 28), num_classes=10, kwargs={"c1": 16})
    with pytest.raises(InputError, match="don't match the spec"):
        save_model(model, spec, tmp_path)
    spec = ModelSpec.from_dict({**spec_of(model).to_dict(), "std": [0.5]})
    with pytest.raises(InputError, match="normalisation std"):
        save_model(model, spec, tmp_path)
    with pytest.raises(InputError, match="ModelSpec"):
        save_model(model, spec.to_dict(), tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        save_model(model, spec_of(model), tmp_path / "file")


def test_missing_things_are_clear_input_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="model spec .*model.json does not exist"):
        load_model(empty)
    model = make()
    save_model(model, spec_of(model), tmp_path / "m")
    os.remove(tmp_path / "m" / "model.safetensors")
    with pytest.raises(InputError, match="model weights .*model.safetensors does not exist"):
        load_model(tmp_path / "m")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="expected a model directory"):
        load_model(tmp_path / "notes.txt")


def test_corrupt_files_are_input_errors(tmp_path):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    good = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match="not a readable safetensors"):
        load_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(good)
    (tmp_path / "model.json").write_text('{"arch": "conv2", ')
    with pytest.raises(InputError, match="model.json: model spec is not valid JSON"):
        load_model(tmp_path)


def test_bad_device(tmp_path):
    model = make()
    save_model(model, spec_of(model), tmp_path)
    with pytest.raises(InputError, match="device"):
        load_model(tmp_path, device="gpu0")
