"""The Python API with the owner's data in memory (issue 50): numpy arrays and torch tensors as the pool and the
test split give the figures, the ledger and the digest the equivalent .npz file gives; bad arrays are one line
before any work; ``input_shape=`` is honoured for a file victim; the audit's typed result."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stealkit.api import audit, steal
from stealkit.errors import InputError
from tests import test_own_data

digits_victim = test_own_data.digits_victim  # module-scoped: a digits mlp2 victim, pool.npz and test.npz

TINY = {"mode": "label", "student": "mlp2", "student_args": {"hidden": 8}, "epochs": 1, "settings": {"min_steps": 0},
        "seed": 1}
#: an audit of the label cells (two attackers) at 20 queries, every other part left out
AUDIT_TINY = {"answers": "label", "budgets": (20,), "settings": {"student": "mlp2", "epochs": 1, "min_steps": 0},
              "transfer_images": 0, "decision_images": 0, "datafree_budget": 0, "gradmatch": (), "exact_budget": 0,
              "seeds": 1, "defences": ["none"]}


def _arrays(root):
    with np.load(root / "pool.npz") as f:
        pool = f["x"]
    with np.load(root / "test.npz") as f:
        x, y = f["x"], f["y"]
    return pool, x, y


def _owner_accuracy(root) -> float:
    return test_own_data._victim_accuracy(root)


@pytest.mark.slow
def test_steal_with_arrays_or_tensors_is_the_npz_run(digits_victim, tmp_path):
    """The same pool and test split as .npz files, numpy arrays and torch tensors: the same ledger, figures and
    data digests at the same seed; config.json records the arrays as source "array" with their sha256."""
    root = digits_victim
    pool, x, y = _arrays(root)
    victim = root / "victim"
    files = steal(victim, budget=30, pool=str(root / "pool.npz"), test=str(root / "test.npz"),
                  out=tmp_path / "files", **TINY)
    arrays = steal(victim, budget=30, pool=pool, test=(x, y), out=tmp_path / "arrays", **TINY)
    tensors = steal(victim, budget=30, pool=torch.from_numpy(pool), test=(torch.from_numpy(x), torch.from_numpy(y)),
                    out=tmp_path / "tensors", **TINY)
    for run in (arrays, tensors):
        assert run.queries == files.queries == {"predict": 30, "explain": 0}
        assert (run.accuracy, run.fidelity) == (files.accuracy, files.fidelity)
        for which in ("pool", "test_data"):
            got, want = run.config["own_data"][which], files.config["own_data"][which]
            assert got["source"] == "array" and want["source"] != "array"
            assert {k: got[k] for k in ("size", "sha256", "pixel_scale")} == \
                   {k: want[k] for k in ("size", "sha256", "pixel_scale")}
        assert run.config["pool"].startswith("array:")
    assert arrays.config["pool"] == tensors.config["pool"]  # the same numbers, the same name
    # the test split decides the figures: the victim's accuracy is its accuracy on the owner's items
    assert arrays.victim_accuracy == pytest.approx(_owner_accuracy(root), abs=1e-6)
    on_disk = json.loads((tmp_path / "arrays" / "config.json").read_text())["config"]["own_data"]
    assert on_disk["test_data"]["sha256"] == files.config["own_data"]["test_data"]["sha256"]


@pytest.mark.parametrize("case, words", [
    ("shape", "fit neither the victim's flat input [N, 64]"),
    ("labels", "labels lie in [0, 12] but the victim's classes are 0..9"),
    ("negative", "labels lie in [-1"),
    ("nan", "NaN"),
    ("length", "one label per image"),
    ("fraction", "integer class ids"),
    ("bytes", "outside both [0, 1] and 0..255"),
    ("notarray", "numpy array or a torch tensor"),
])
@pytest.mark.parametrize("call", ["steal", "audit"])
def test_bad_arrays_are_one_line_before_any_work(digits_victim, tmp_path, case, words, call):
    root = digits_victim
    pool, x, y = _arrays(root)
    x, y = x.copy(), y.copy()
    if case == "shape":
        x = np.zeros((4, 3, 5, 5), dtype=np.float32)
        y = y[:4]
    elif case == "labels":
        y[0] = 12
    elif case == "negative":
        y[0] = -1
    elif case == "nan":
        x[0, 0, 0, 0] = np.nan
    elif case == "length":
        y = y[:-1]
    elif case == "fraction":
        y = y.astype(np.float64) + 0.5
    elif case == "bytes":
        x = x * 1000
    test: object = (x, y) if case != "notarray" else ([[0.0] * 64], [0])
    out = tmp_path / "out"
    with pytest.raises(InputError) as exc:
        if call == "steal":
            steal(root / "victim", budget=30, pool=pool, test=test, out=out, **TINY)
        else:
            audit(root / "victim", pool=pool, test=test, out=out, **AUDIT_TINY)
    text = str(exc.value)
    assert "\n" not in text and words in text, text
    assert not out.exists()  # nothing written


def test_a_bad_pool_array_is_refused_too(digits_victim, tmp_path):
    root = digits_victim
    _, x, y = _arrays(root)
    with pytest.raises(InputError, match=r"^pool: .*NaN"):
        steal(root / "victim", budget=30, pool=np.full((5, 64), np.nan, dtype=np.float32), test=(x, y),
              out=tmp_path / "o", **TINY)
    with pytest.raises(InputError, match="labels are needed but only images were given"):
        steal(root / "victim", budget=30, test=x, out=tmp_path / "o", **TINY)
    assert not (tmp_path / "o").exists()


def _torchscript(root, path):
    """The victim as a TorchScript file without metadata: its input shape is unknown to the loader."""
    from stealkit.models import load_model

    model = load_model(root / "victim")[0].eval()
    torch.jit.save(torch.jit.trace(model, torch.zeros(1, 1, 8, 8)), str(path))
    return path


def test_input_shape_is_one_line_where_it_cannot_apply(digits_victim, tmp_path):
    root = digits_victim
    pool, x, y = _arrays(root)
    path = _torchscript(root, tmp_path / "plain.pt")
    with pytest.raises(InputError, match="input shape is unknown"):
        steal(path, budget=30, pool=pool, test=(x, y), out=tmp_path / "no", **TINY)
    with pytest.raises(InputError, match=r"input_shape= only apply.*model\.json already says"):
        steal("standard:digits-conv2", budget=30, input_shape=(1, 8, 8))
    with pytest.raises(InputError, match="only apply to an ONNX"):
        audit(root / "victim", input_shape=(1, 8, 8), out=tmp_path / "dir", **AUDIT_TINY)
    assert not (tmp_path / "no").exists() and not (tmp_path / "dir").exists()


@pytest.mark.slow
def test_input_shape_is_honoured_for_a_file_victim(digits_victim, tmp_path):
    root = digits_victim
    pool, x, y = _arrays(root)
    path = _torchscript(root, tmp_path / "plain.pt")
    run = steal(path, budget=30, input_shape=(1, 8, 8), pool=pool, test=(x, y), out=tmp_path / "yes", **TINY)
    assert run.config["victim"] == f"{path}?input_shape=1,8,8" and run.queries["predict"] == 30
    assert run.victim_accuracy == pytest.approx(_owner_accuracy(root), abs=1e-6)
    result = audit(path, input_shape=(1, 8, 8), pool=str(root / "pool.npz"), test=(x, y), out=tmp_path / "audit",
                   **AUDIT_TINY)
    assert result.summary["queries"] == 40  # two attackers, 20 each
    assert json.loads((tmp_path / "audit" / "config.json").read_text())["config"]["victim"] == \
        f"{path}?input_shape=1,8,8"


@pytest.mark.slow
def test_audit_with_arrays_is_the_npz_audit_and_its_result_is_typed(digits_victim, tmp_path):
    """Two audits at the same seed, one from .npz files and one from arrays: the same headline, serving table,
    query count and digests; the typed result gives Q90/Q95 per serving choice, the tables, the verdict and the
    report, and the victim's accuracy is the one on the owner's test split."""
    from stealkit.audit.results import ServingRow, serving_rows

    root = digits_victim
    pool, x, y = _arrays(root)
    files = audit(root / "victim", pool=str(root / "pool.npz"), test_data=str(root / "test.npz"),
                  out=tmp_path / "files", **AUDIT_TINY)
    arrays = audit(root / "victim", pool=pool, test=(x, y), out=tmp_path / "arrays", **AUDIT_TINY)
    assert arrays.summary["queries"] == files.summary["queries"] == 40
    assert arrays.tables["headline"] == files.tables["headline"]
    assert arrays.serving == files.serving and arrays.verdict == files.verdict and arrays.verdict
    config = json.loads((tmp_path / "arrays" / "config.json").read_text())["config"]["own_data"]
    want = json.loads((tmp_path / "files" / "config.json").read_text())["config"]["own_data"]
    assert config["test_data"]["source"] == config["pool"]["source"] == "array"
    assert config["test_data"]["sha256"] == want["test_data"]["sha256"]
    assert config["pool"]["sha256"] == want["pool"]["sha256"]
    assert arrays.victim_accuracy == pytest.approx(_owner_accuracy(root), abs=1e-6)
    row = arrays.serving[0]
    assert isinstance(row, ServingRow) and row.serving == "top-1 label"
    headline = arrays.tables["headline"][0]
    assert (row.q90, row.q95) == (headline["Q90"], headline["Q95"])
    assert row.served_accuracy == pytest.approx(_owner_accuracy(root), abs=1e-4)
    assert set(arrays.tables) >= {"headline", "serving"} and arrays.report.exists()
    assert str(arrays).splitlines()[-1] == f"report: {arrays.report}"
    # the rows read back from the audit's own summary.json are the same
    assert serving_rows(json.loads((tmp_path / "arrays" / "summary.json").read_text())) == arrays.serving
    # the same arrays resume the audit (their name is their content's): nothing is run again
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "arrays" / "parts").glob("*.json")}
    again = audit(root / "victim", pool=pool.copy(), test=(x.copy(), y.copy()), out=tmp_path / "arrays",
                  **AUDIT_TINY)
    assert again.summary["queries"] == 40 and again.serving == arrays.serving
    assert stamps and {p.name: p.stat().st_mtime_ns for p in (tmp_path / "arrays" / "parts").glob("*.json")} == stamps


def test_serving_rows_take_q95_over_the_attackers_q90_is_taken_over():
    """A served choice's Q95 is the best Q95 among the attackers that can use it: from probabilities, the label
    recipe on the argmax may be the best at 95 % while the probability recipe is best at 90 %."""
    from stealkit.audit.results import serving_rows

    headline = [
        {"answers": "probs", "attacker": "like", "defence": "none", "Q90": 100, "Q95": "not reached within 200"},
        {"answers": "label", "attacker": "like", "defence": "none", "Q90": 200, "Q95": 200},
        {"answers": "label", "attacker": "unrelated", "defence": "none", "Q90": 50, "Q95": 50},
        {"answers": "probs", "attacker": "like", "defence": "noise:sigma=0.05", "Q90": None, "Q95": None},
    ]
    serving = [{"serving": "probabilities", "attacker Q90": 100, "best attacker": "probability recipe"},
               {"serving": "top-1 label", "attacker Q90": 200, "best attacker": "label recipe"},
               {"serving": "probabilities through noise:sigma=0.05", "attacker Q90": None}]
    rows = serving_rows({"headline": headline, "serving": serving})
    assert [(r.serving, r.q90, r.q95) for r in rows] == [("probabilities", 100, 200), ("top-1 label", 200, 200),
                                                         ("probabilities through noise:sigma=0.05", None, None)]


def test_array_data_is_a_frozen_copy_named_by_its_content_and_survives_pickling():
    """The spec an array becomes: a copy (later changes to the caller's array do not reach it), named by its
    content (equal arrays, equal names; any change, another name), pickled with its arrays (an audit's worker
    processes read them) and read through the checks a file's go through."""
    import pickle

    from stealkit.data.own import ArrayData, read_images

    rng = np.random.default_rng(0)
    x, y = rng.random((6, 64)).astype(np.float32), np.arange(6) % 3
    a = ArrayData(x, y, what="test")
    assert a == ArrayData(x.copy(), y.copy()) and str(a).startswith("array:") and len(str(a)) == 22
    x[0, 0] = 0.5
    assert not np.array_equal(a.x, x) and a != ArrayData(x, y)
    with pytest.raises(ValueError):
        a.x[0, 0] = 1.0  # read-only
    b = pickle.loads(pickle.dumps(a))
    assert isinstance(b, ArrayData) and b == a and np.array_equal(b.x, a.x) and b.what == "test"
    got = read_images(b, input_shape=(1, 8, 8), with_labels=True, num_classes=3)
    assert got.source == "array" and got.y.tolist() == y.tolist() and got.x.shape == (6, 1, 8, 8)
    assert got.record() == {"source": "array", "size": 6, "sha256": got.digest, "pixel_scale": "float [0, 1]"}


def test_an_attack_parts_rerun_command_names_a_file_for_test_arrays(tmp_path):
    """The report's command that reruns an attack part cannot carry arrays: it names the .npz to save them in."""
    from types import SimpleNamespace

    from stealkit.audit.kinds.attacks import _command
    from stealkit.audit.parts import Part
    from stealkit.data.own import ArrayData

    test = ArrayData(np.zeros((2, 64), np.float32), np.array([0, 1]), what="test")
    part = Part("label", "copy", "", 20, 1.0, kind="transfer", n=10)
    for given, want in ((test, f"--test-data TEST.npz (the {test} arrays, saved with numpy.savez)"),
                        ("my/test.npz", "--test-data my/test.npz")):
        options = SimpleNamespace(seed=0, device="cpu", dataset=None, data_dir=None, test_data=given)
        ctx = SimpleNamespace(options=options, target=SimpleNamespace(location="v.pt"))
        assert _command(["pgd"], part, ctx, tmp_path).endswith(want)


def test_arrays_and_their_npz_files_give_one_record_and_one_test_split(digits_victim):
    """At the runners' level (no training): the owner's arrays, as tensors too, and the .npz files holding them
    give the same test split and the same config.json records but the source; the overlap warning alike."""
    from stealkit.data.own import own_spec
    from stealkit.oracle.victim import Target, own_data, victim_test

    root = digits_victim
    pool, x, y = _arrays(root)
    given = {"files": (str(root / "pool.npz"), str(root / "test.npz")),
             "arrays": (own_spec(pool, "pool"), own_spec((x, y), "test")),
             "tensors": (own_spec(torch.from_numpy(pool), "pool"),
                         own_spec((torch.from_numpy(x), torch.from_numpy(y)), "test"))}
    seen = {}
    for name, (p, t) in given.items():
        v = Target(str(root / "victim"), test_data=t).open(mode="label", budget=0)
        test = victim_test(v)
        records, notes = own_data(v, {"--pool": p})
        seen[name] = (test.x, test.y, records, notes)
    fx, fy, frecords, fnotes = seen["files"]
    for name in ("arrays", "tensors"):
        ax, ay, records, notes = seen[name]
        assert torch.equal(ax, fx) and torch.equal(ay, fy)
        for which in ("pool", "test_data"):
            assert records[which]["source"] == "array"
            assert {**records[which], "source": "-"} == {**frecords[which], "source": "-"}
        assert len(notes) == len(fnotes) and any(n.startswith("5 of the 150 test items") for n in notes)
