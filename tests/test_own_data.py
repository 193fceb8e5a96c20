"""The owner's own data (issue 50): arrays and folders of images read as the victim's input, as query sources, as
the test split; one-line errors; the warnings and records."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stealkit.data import load_query_source, parse_source, read_images
from stealkit.errors import InputError

SHAPE = (1, 8, 8)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_npy_flat_and_shaped_read_the_same(tmp_path):
    x = np.random.default_rng(0).random((6, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "flat.npy", x.reshape(6, 64))
    np.save(tmp_path / "shaped.npy", x)
    np.save(tmp_path / "hw.npy", x[:, 0])
    np.save(tmp_path / "hwc.npy", x.transpose(0, 2, 3, 1))
    got = [read_images(tmp_path / f"{n}.npy", input_shape=SHAPE, with_labels=False) for n in
           ("flat", "shaped", "hw", "hwc")]
    for d in got:
        assert d.x.shape == (6, 1, 8, 8) and d.x.dtype == torch.float32 and d.y is None
        assert torch.equal(d.x, torch.from_numpy(x)) and d.size == 6 and d.pixel_scale == "float [0, 1]"
    assert len({d.digest for d in got}) == 1 and len(got[0].digest) == 64


def test_npz_with_labels_and_bytes_detected(tmp_path):
    x = np.random.default_rng(1).integers(0, 256, (5, 3, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", x=x, y=np.array([0, 1, 2, 1, 0]))
    d = read_images(tmp_path / "a.npz", input_shape=(3, 4, 4), with_labels=True, num_classes=3)
    assert d.pixel_scale == "bytes 0..255" and d.y.tolist() == [0, 1, 2, 1, 0]
    assert torch.allclose(d.x, torch.from_numpy(x).float() / 255)
    # bytes stored as floats (largest value above 1) are detected too
    np.savez(tmp_path / "f.npz", x=x.astype(np.float64), y=np.array([0, 1, 2, 1, 0]))
    f = read_images(tmp_path / "f.npz", input_shape=(3, 4, 4), with_labels=True)
    assert f.pixel_scale == "bytes 0..255" and torch.allclose(f.x, d.x) and f.digest == d.digest
    assert d.record() == {"source": str(tmp_path / "a.npz"), "size": 5, "sha256": d.digest,
                          "pixel_scale": "bytes 0..255"}


def test_folder_of_pngs_in_class_folders_of_mixed_sizes_and_modes(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(2)
    for k, mode, size in (("3", "RGB", (20, 10)), ("7", "L", (8, 8)), ("10", "RGBA", (5, 9))):
        (tmp_path / "imgs" / k).mkdir(parents=True)
        for i in range(2):
            channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
            arr = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
            Image.fromarray(arr[..., 0] if mode == "L" else arr, mode).save(tmp_path / "imgs" / k / f"{i}.png")
    (tmp_path / "imgs" / "7" / "x.jpeg").write_bytes(
        (tmp_path / "imgs" / "7" / "0.png").read_bytes())  # a PNG named .jpeg is still read
    d = read_images(tmp_path / "imgs", input_shape=SHAPE, with_labels=True, num_classes=11)
    assert d.x.shape == (7, 1, 8, 8) and float(d.x.min()) >= 0 and float(d.x.max()) <= 1
    assert d.y.tolist() == [3, 3, 7, 7, 7, 10, 10]  # integer folder names are their values
    assert d.pixel_scale == "bytes 0..255" and d.class_names == ("3", "7", "10")
    colour = read_images(tmp_path / "imgs", input_shape=(3, 6, 6), with_labels=False)
    assert colour.x.shape == (7, 3, 6, 6)
    # named classes: sorted names are the ids
    (tmp_path / "named" / "cat").mkdir(parents=True)
    (tmp_path / "named" / "ant").mkdir(parents=True)
    Image.new("L", (3, 3), 200).save(tmp_path / "named" / "cat" / "a.png")
    Image.new("RGB", (3, 3), (0, 0, 0)).save(tmp_path / "named" / "ant" / "b.jpg")
    named = read_images(tmp_path / "named", input_shape=SHAPE, with_labels=True)
    assert named.y.tolist() == [0, 1] and named.class_names == ("ant", "cat")
    assert float(named.x[1].mean()) == pytest.approx(200 / 255, abs=1e-6)


def test_flat_folder_without_labels(tmp_path):
    from PIL import Image

    for i in range(3):
        Image.new("L", (16, 16), 40 * i).save(tmp_path / f"{i}.png")
    d = read_images(tmp_path, input_shape=SHAPE, with_labels=False)
    assert d.size == 3 and d.y is None
    with pytest.raises(InputError) as exc:
        read_images(tmp_path, input_shape=SHAPE, with_labels=True, what="--test-data")
    assert "class" in _one_line(exc) and _one_line(exc).startswith("--test-data")


@pytest.mark.parametrize("case, words", [
    ("shape", "[N, 64]"),
    ("missing", "no such file"),
    ("labels", "no 'y'"),
    ("nox", "no 'x'"),
    ("range", "outside both"),
    ("pickle", "not a plain numeric"),
    ("empty", "no PNG/JPEG"),
    ("badlabel", "classes are 0..2"),
    ("npylabels", "images only"),
])
def test_bad_input_is_one_line(tmp_path, case, words):
    x = np.zeros((4, 64), dtype=np.float32)
    path = tmp_path / "d.npz"
    if case == "shape":
        np.save(path := tmp_path / "d.npy", np.zeros((4, 3, 5, 5)))
    elif case == "labels":
        np.savez(path, x=x)
    elif case == "nox":
        np.savez(path, images=x)
    elif case == "range":
        np.savez(path, x=x - 1, y=np.zeros(4, dtype=int))
    elif case == "pickle":
        np.save(path := tmp_path / "d.npy", np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True)
    elif case == "empty":
        (path := tmp_path / "empty").mkdir()
        (path / "notes.txt").write_text("hi")
    elif case == "badlabel":
        np.savez(path, x=x, y=np.array([0, 1, 2, 5]))
    elif case == "npylabels":
        np.save(path := tmp_path / "d.npy", x)
    with pytest.raises(InputError) as exc:
        read_images(path, input_shape=SHAPE, with_labels=case not in ("shape", "pickle"), num_classes=3)
    assert words in _one_line(exc)


def test_file_query_source_is_shuffled_and_capped(tmp_path):
    x = np.random.default_rng(3).random((30, 64)).astype(np.float32)
    np.save(tmp_path / "pool.npy", x)
    spec = str(tmp_path / "pool.npy")
    assert parse_source(spec).is_file and not parse_source(spec).is_synthetic
    whole = load_query_source(spec, input_shape=SHAPE, n=None, seed=0)
    assert whole.shape == (30, 1, 8, 8)
    some = load_query_source(spec, input_shape=SHAPE, n=10, seed=0)
    assert torch.equal(some, whole[:10]) and not torch.equal(some, torch.from_numpy(x[:10]).view(10, 1, 8, 8))
    with pytest.raises(InputError) as exc:
        parse_source(str(tmp_path / "nothere.npz"))
    assert "no such file" in _one_line(exc)


# ---------------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def digits_victim(tmp_path_factory):
    """A tiny digits victim, the owner's pool (.npz, bytes, flat) and test split (.npz with labels, 150 items,
    5 of which are planted in the pool; both float32, so the planted items are byte-equal)."""
    from stealkit.data import load_splits
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("own")
    train_victim("digits", "mlp2", TrainConfig(epochs=5, batch_size=64, lr=0.01, seed=0), out=root / "victim",
                 arch_kwargs={"hidden": 16})
    splits = load_splits("digits")
    test_x, test_y = splits.test.x[:150], splits.test.y[:150]
    pool = torch.cat([splits.attacker_pool.x[:100], test_x[:5]])
    np.savez(root / "pool.npz", x=pool.reshape(len(pool), -1).numpy())  # flat; float32, as the test items
    np.savez(root / "test.npz", x=test_x.numpy(), y=test_y.numpy())
    return root


def _victim_accuracy(root) -> float:
    from stealkit.models import load_model

    model, _ = load_model(root / "victim")
    with np.load(root / "test.npz") as f:
        x, y = torch.from_numpy(f["x"]), torch.from_numpy(f["y"])
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def test_extract_surrogate_with_own_pool_and_test_data(digits_victim, tmp_path, capsys):
    import json

    import stealkit.oracle.victim
    from stealkit.cli import main

    stealkit.oracle.victim._WARNED.clear()  # each warning is logged once per process
    root = digits_victim
    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(root / "victim"), "--budget", "40", "--pool",
               str(root / "pool.npz"), "--test-data", str(root / "test.npz"), "--student", "mlp2", "--student-arg",
               "hidden=8", "--epochs", "1", "--set", "min_steps=0", "--out", str(out)])
    assert rc == 0
    assert "5 of the 150 test items are also in --pool" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["victim_accuracy"] == pytest.approx(_victim_accuracy(root), abs=1e-6)
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["own_data"]["test_data"]["size"] == 150
    assert config["own_data"]["pool"]["size"] == 105 and config["own_data"]["pool"]["pixel_scale"] == "float [0, 1]"


def test_audit_scores_on_the_owners_test_items_and_warns_of_overlap(digits_victim, tmp_path, capsys):
    import json

    from stealkit.cli import main

    root = digits_victim
    out = tmp_path / "audit"
    rc = main(["-q", "audit", "--victim", str(root / "victim"), "--pool", str(root / "pool.npz"), "--test-data",
               str(root / "test.npz"), "--answers", "label", "--budgets", "20", "--set", "student=mlp2", "--set",
               "epochs=1", "--set", "min_steps=0", "--transfer-images", "0", "--decision-images", "0",
               "--datafree-budget", "0", "--gradmatch-budgets", "0", "--exact-budget", "0", "--seeds", "1",
               "--defence", "none", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr()
    parts = [json.loads(p.read_text()) for p in (out / "parts").glob("*.json")]
    assert parts and all(p["victim_accuracy"] == pytest.approx(_victim_accuracy(root), abs=1e-6) for p in parts)
    assert "5 of the 150" in text.out + text.err
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["own_data"]["test_data"]["size"] == 150
    summary = json.loads((out / "summary.json").read_text())
    assert any("5 of the 150" in n for n in summary["notes"])
    assert any("--test-data" in n and config["own_data"]["test_data"]["sha256"][:12] in n for n in summary["notes"])
    assert "5 of the 150" in (out / "report.html").read_text()


def test_a_module_victim_without_a_data_set_runs_on_own_pool_and_test_data(digits_victim, tmp_path):
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate
    from stealkit.models import load_model
    from stealkit.oracle.victim import Target

    root = digits_victim
    model, _ = load_model(root / "victim")
    target = Target(model, input_shape=(1, 8, 8), test_data=str(root / "test.npz"))
    assert target.dataset is None
    options = SurrogateOptions(pool=str(root / "pool.npz"), student="mlp2", student_kwargs={"hidden": 8}, epochs=1,
                               settings={"min_steps": 0})
    run = run_surrogate(target, 30, options, out=tmp_path / "run", report=False)
    assert run.victim_accuracy == pytest.approx(_victim_accuracy(root), abs=1e-6)
    assert run.config["own_data"]["test_data"]["size"] == 150 and run.config["dataset"] is None
    # without --test-data there is no test split: one line says what to pass
    with pytest.raises(InputError, match="--test-data"):
        run_surrogate(Target(model, input_shape=(1, 8, 8)), 30, options, out=tmp_path / "r2", report=False)


def test_small_test_split_states_its_interval(digits_victim):
    from stealkit.models import load_model
    from stealkit.oracle.victim import Target, own_data

    model, _ = load_model(digits_victim / "victim")
    v = Target(model, input_shape=(1, 8, 8), test_data=str(digits_victim / "test.npz")).open(budget=0)
    records, notes = own_data(v, {"--pool": str(digits_victim / "pool.npz"), "--unrelated": "patches"})
    assert set(records) == {"test_data", "pool"}
    half = 1.96 * (0.9 * 0.1 / 150) ** 0.5
    assert any(f"+/- {half:.3f}" in n and "150 items" in n for n in notes)
    assert any(n.startswith("5 of the 150 test items") for n in notes)
