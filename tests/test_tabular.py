"""Feature-vector (tabular) victims: the feature ranges, the map at the oracle boundary, the mlp student, query
sources, and a scikit-learn pipeline (StandardScaler + MLPClassifier on breast cancer, 30 raw features) converted
by skl2onnx and attacked from the owner's own arrays."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from stealkit.data.features import FeatureRange, load_ranges, ranges_from_data, read_own
from stealkit.errors import InputError
from stealkit.oracle.victim import Target, victim_test

D = 30


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def bc(tmp_path_factory):
    """The owner's breast-cancer split as .npz files, its scaler + MLP pipeline as ONNX (zipmap off and on), and
    the pipeline's accuracy on the test split computed by hand."""
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    d = tmp_path_factory.mktemp("bc")
    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), MLPClassifier((16,), max_iter=2000, random_state=0))
    model.fit(x_train[:200], y_train[:200])
    clf = model.steps[-1][1]
    (d / "bc.onnx").write_bytes(to_onnx(model, x_train[:1], options={id(clf): {"zipmap": False}}).SerializeToString())
    (d / "bc_zipmap.onnx").write_bytes(to_onnx(model, x_train[:1]).SerializeToString())
    np.savez(d / "pool.npz", x=x_train[200:])
    np.savez(d / "test.npz", x=x_test, y=y_test)
    accuracy = float((model.predict(x_test) == y_test).mean())
    return {"dir": d, "onnx": str(d / "bc.onnx"), "zipmap": str(d / "bc_zipmap.onnx"), "pool": str(d / "pool.npz"),
            "test": str(d / "test.npz"), "accuracy": accuracy, "x_test": x_test, "proba": model.predict_proba(x_test)}


# --- the feature ranges -----------------------------------------------------------------------------------------

def test_feature_range_maps_both_ways_and_records_a_digest(tmp_path):
    r = FeatureRange((0.0, -2.0), (10.0, 2.0), source="declared")
    u = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.25]])
    x = r.to_model(u)
    assert torch.allclose(x, torch.tensor([[0.0, -2.0], [10.0, 2.0], [5.0, -1.0]]))
    assert torch.allclose(r.from_model(x), u)
    rec = r.record()
    assert rec["features"] == 2 and len(rec["sha256"]) == 64 and rec["lo"] == [0.0, -2.0]
    r.save(tmp_path / "r.json")
    assert load_ranges(tmp_path / "r.json", 2) == r.__class__(r.lo, r.hi, source=str(tmp_path / "r.json"))
    with pytest.raises(InputError) as exc:
        FeatureRange((1.0,), (1.0,))
    assert "hi > lo" in _one_line(exc)
    with pytest.raises(InputError) as exc:
        load_ranges(tmp_path / "r.json", 3)
    assert "takes 3 features" in _one_line(exc)


def test_ranges_from_data_add_the_margin_on_each_side(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.array([[0.0, 5.0], [10.0, 5.0]]))
    r = ranges_from_data([tmp_path / "a.npz"], 2, margin=0.05)
    assert r.lo[0] == pytest.approx(-0.5) and r.hi[0] == pytest.approx(10.5)
    assert r.lo[1] < 5.0 < r.hi[1]  # a constant feature still gets a positive width
    assert "a.npz" in r.source


def test_the_owner_s_arrays_read_as_their_npz_file(tmp_path):
    from stealkit.data.own import own_spec

    rng = np.random.default_rng(0)
    x = rng.normal(100.0, 50.0, size=(12, 3))  # raw features far outside any pixel scale
    y = np.arange(12) % 2
    np.savez(tmp_path / "a.npz", x=x, y=y)
    spec = own_spec((x, y), "test")
    from_file = ranges_from_data([tmp_path / "a.npz"], 3)
    from_arrays = ranges_from_data([spec], 3)
    assert (from_arrays.lo, from_arrays.hi) == (from_file.lo, from_file.hi)
    a = read_own(spec, input_shape=(3,), features=from_file, with_labels=True, num_classes=2, what="test")
    f = read_own(tmp_path / "a.npz", input_shape=(3,), features=from_file, with_labels=True, num_classes=2)
    assert torch.equal(a.x, f.x) and torch.equal(a.y, f.y) and a.digest == f.digest and a.source == "array"
    with pytest.raises(InputError) as exc:
        read_own(own_spec(x, "test"), input_shape=(3,), features=from_file, with_labels=True, what="test")
    assert "labels are needed" in _one_line(exc)


def test_no_data_for_the_ranges_is_one_line_naming_what_to_pass():
    with pytest.raises(InputError) as exc:
        Target(nn.Linear(D, 2), input_shape=(D,)).open(budget=0)
    line = _one_line(exc)
    assert "--test-data" in line and "--pool" in line and "feature_ranges" in line


def test_an_array_of_the_wrong_width_is_one_line(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, D + 1)), y=np.zeros(4, dtype=np.int64))
    r = FeatureRange((0.0,) * D, (1.0,) * D)
    with pytest.raises(InputError) as exc:
        read_own(tmp_path / "bad.npz", input_shape=(D,), features=r, with_labels=True, what="--test-data")
    line = _one_line(exc)
    assert "fits neither" in line and f"[N, {D}]" in line and line.startswith("--test-data")
    with pytest.raises(InputError) as exc:  # a folder of images for a feature-vector victim
        read_own(tmp_path, input_shape=(D,), features=r, with_labels=False)
    assert "folder" in _one_line(exc)


# --- the oracle boundary ----------------------------------------------------------------------------------------

class Recorder(nn.Module):
    """A 2-class linear model that keeps the raw features it was called on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.lin(x)


def test_the_oracle_answers_points_of_the_unit_box_as_the_model_s_features():
    model = Recorder()
    ranges = FeatureRange((100.0, -1.0, 0.0), (200.0, 1.0, 0.5))
    v = Target(model, input_shape=(3,), num_classes=2, features=ranges).open(mode="probs", budget=4)
    assert v.input_shape == (3,) and v.features == ranges
    model.seen.clear()
    v.oracle.query(torch.tensor([[0.0, 0.5, 1.0], [1.0, 0.0, 0.0]]))
    assert torch.allclose(model.seen[-1], torch.tensor([[100.0, 0.0, 0.5], [200.0, -1.0, 0.0]]))
    assert v.oracle.ledger.total == 2
    with pytest.raises(InputError):  # raw features are not points of [0, 1]^d: refused, nothing charged
        v.oracle.query(torch.tensor([[150.0, 0.0, 0.2]]))
    assert v.oracle.ledger.total == 2


def test_the_mlp_family_takes_feature_vectors_and_image_networks_refuse_them():
    from stealkit.models import build_model
    from stealkit.models.zoo import student_for

    m = build_model("mlp", input_shape=(D,), num_classes=2, hidden=[8, 4])
    assert m(torch.rand(5, D)).shape == (5, 2)
    assert student_for("conv2", (D,)) == "mlp" and student_for("mlp2", (D,)) == "mlp2"
    assert student_for("conv2", (1, 8, 8)) == "conv2"
    with pytest.raises(InputError) as exc:
        build_model("conv2", input_shape=(D,), num_classes=2)
    assert "image network" in _one_line(exc)


def test_feature_query_sources_stay_in_the_unit_box_and_image_sources_are_refused():
    from stealkit.data import load_query_source

    x = load_query_source("uniform", input_shape=(D,), n=7, seed=0)
    assert x.shape == (7, D) and float(x.min()) >= 0 and float(x.max()) <= 1
    g = load_query_source("gaussian:std=0.2", input_shape=(D,), n=7, seed=0)
    assert g.shape == (7, D) and float(g.min()) >= 0 and float(g.max()) <= 1
    with pytest.raises(InputError) as exc:
        load_query_source("patches", input_shape=(D,), n=7, seed=0)
    assert "--unrelated uniform" in _one_line(exc)


# --- a scikit-learn pipeline converted by skl2onnx --------------------------------------------------------------

def test_an_skl2onnx_pipeline_opens_as_a_victim_of_30_features(bc):
    t = Target(bc["onnx"], test_data=bc["test"], feature_data=(bc["pool"],))
    v = t.open(mode="probs", budget=None)
    assert v.input_shape == (D,) and v.num_classes == 2
    test = victim_test(v)
    probs = v.oracle.query(test.x)
    assert np.allclose(probs.numpy(), bc["proba"], atol=1e-4)  # the map undoes itself: the owner's own answers
    raw = v.features.to_model(test.x.double()).numpy()
    assert np.allclose(raw, bc["x_test"], rtol=1e-5, atol=1e-3)


def test_the_zipmap_output_reads_the_same_answers(bc):
    plain = Target(bc["onnx"], test_data=bc["test"]).open(mode="probs")
    zipped = Target(bc["zipmap"], test_data=bc["test"]).open(mode="probs")
    x = victim_test(plain).x
    assert torch.allclose(plain.oracle.query(x), zipped.oracle.query(x), atol=1e-5)


@pytest.mark.slow
def test_surrogate_extraction_reports_the_owner_s_accuracy_and_fidelity(bc, tmp_path):
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate

    t = Target(bc["onnx"], test_data=bc["test"], feature_data=(bc["pool"],))
    run = run_surrogate(t, 60, SurrogateOptions(pool=bc["pool"], epochs=5, settings={"min_steps": 0}),
                        out=tmp_path / "s", report=False)
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["victim_accuracy"] == pytest.approx(bc["accuracy"], abs=1e-6)
    assert 0.0 <= run.fidelity <= 1.0
    config = json.loads((tmp_path / "s" / "config.json").read_text())["config"]
    assert config["student"] == "mlp"
    assert config["feature_ranges"]["features"] == D and len(config["feature_ranges"]["sha256"]) == 64
    assert run.queries["predict"] <= 60
    copy = Target(str(tmp_path / "s" / "student"), test_data=bc["test"]).open(mode="label")  # no map in front
    ranges = t.open(mode="label").features
    assert (copy.features.lo, copy.features.hi) == (ranges.lo, ranges.hi)  # the ranges kept in its model.json
    test = victim_test(copy)
    assert float((copy.oracle.query(test.x) == test.y).float().mean()) == pytest.approx(run.accuracy, abs=1e-6)


@pytest.mark.slow
def test_pgd_transfer_runs_in_the_mapped_space_inside_the_feature_ranges(bc, tmp_path):
    from stealkit.evade.run import run_transfer
    from stealkit.extract.surrogate_data.run import SurrogateOptions, run_surrogate

    t = Target(bc["onnx"], test_data=bc["test"], feature_data=(bc["pool"],))
    run_surrogate(t, 100, SurrogateOptions(pool=bc["pool"], epochs=20, settings={"min_steps": 0}),
                  out=tmp_path / "s", report=False)
    eps = 0.1
    r = run_transfer(t, "pgd", tmp_path / "s", n=40, eps=eps, out=tmp_path / "t")
    assert "[0, 1]^30" in r.summary["space"]
    ranges = t.open(mode="label").features
    with np.load(tmp_path / "t" / "adversarial.npz") as a:
        x, x_adv, raw = a["x"], a["x_adv"], a["x_adv_features"]
    assert np.abs(x_adv - x).max() <= eps + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1
    lo, hi = np.array(ranges.lo), np.array(ranges.hi)
    assert (raw >= lo - 1e-6).all() and (raw <= hi + 1e-6).all()
    assert r.summary["victim_queries"]["predict"] == r.summary["clean_queries"] + r.summary["adversarial_queries"]


@pytest.mark.slow
def test_hopskipjump_and_certification_work_on_the_mapped_victim(bc, tmp_path):
    from stealkit.certify.smoothing import SmoothingConfig, certify
    from stealkit.evade.run import run_decision

    t = Target(bc["onnx"], test_data=bc["test"], feature_data=(bc["pool"],))
    r = run_decision(t, "hopskipjump", max_queries=60, n=3, out=tmp_path / "d")
    assert r.attempts and r.queries["predict"] <= 3 + r.attempts * 60 + 5 * r.attempts
    v = t.open(mode="label")
    certs = certify(v.model, victim_test(v).x[:3], SmoothingConfig(sigma=0.1, n0=10, n=50, alpha=0.01))
    assert len(certs) == 3 and all(c.radius["cohen"] >= 0 or c.label == -1 for c in certs)


@pytest.mark.slow
def test_the_audit_of_an_skl2onnx_pipeline_from_the_owner_s_arrays(bc, tmp_path):
    from stealkit.cli import cli

    out = tmp_path / "audit"
    args = ["audit", "--victim", bc["onnx"], "--pool", bc["pool"], "--test-data", bc["test"], "--quick",
            "--answers", "probs", "--budgets", "50", "--seeds", "1", "--defence", "none", "--transfer-images", "20",
            "--decision-images", "2", "--decision-queries", "40", "--set", "min_steps=0", "--set", "epochs=5",
            "--jobs", "1", "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    audit = json.loads((out / "audit.json").read_text())
    assert audit["victim_accuracy"] == pytest.approx(bc["accuracy"], abs=1e-6)
    assert audit["audit"]["feature_ranges"]["features"] == D
    assert audit["audit"]["unrelated"] == "uniform"
    assert any("data-free attacker not measured" in n for n in audit["notes"])
    extractions = [p for p in audit["parts"] if str(p.get("id", "")).startswith("extract-probs-like")]
    assert extractions and all(0 <= p["fidelity"] <= 1 for p in extractions)
    assert all(p["victim_accuracy"] == pytest.approx(bc["accuracy"], abs=1e-6) for p in extractions)


def test_a_test_split_of_the_wrong_width_stops_the_audit_with_one_line_and_writes_nothing(bc, tmp_path, capsys):
    from stealkit.cli import main

    np.savez(tmp_path / "wide.npz", x=np.zeros((5, D + 2), dtype=np.float32), y=np.zeros(5, dtype=np.int64))
    out = tmp_path / "audit"
    code = main(["-q", "audit", "--victim", bc["onnx"], "--test-data", str(tmp_path / "wide.npz"), "--pool", bc["pool"],
                 "--quick", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    assert len(err) == 1 and "fits neither" in err[0] and f"[N, {D}]" in err[0]
    assert not out.exists()


def test_a_torchscript_model_of_d_features_opens_and_plans_gradient_matching_on_the_owner_s_rows(tmp_path, capsys):
    from stealkit.audit.options import AuditOptions
    from stealkit.audit.run import run_audit

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notices
        torch.jit.save(torch.jit.trace(net, torch.zeros(1, 4)), str(tmp_path / "m.pt"))
    rng = np.random.default_rng(0)
    x = rng.normal(50.0, 10.0, size=(60, 4)).astype(np.float32)
    np.savez(tmp_path / "test.npz", x=x[:40], y=net(torch.from_numpy(x[:40])).argmax(1).numpy())
    np.savez(tmp_path / "pool.npz", x=x[40:])
    victim = f"{tmp_path / 'm.pt'}?input_shape=4"
    v = Target(victim, test_data=str(tmp_path / "test.npz")).open(mode="probs")
    assert v.input_shape == (4,) and v.num_classes == 3
    test = victim_test(v)
    assert (v.oracle.query(test.x).argmax(1) == test.y).all()  # the map undoes itself: the model's own labels
    result = run_audit(AuditOptions(victim=victim, pool=str(tmp_path / "pool.npz"),
                                    test_data=str(tmp_path / "test.npz"), quick=True, out=str(tmp_path / "a")),
                       plan_only=True)
    gradmatch = [p for p in result.parts if p.kind == "gradmatch"]
    assert gradmatch and gradmatch[0].pool == str(tmp_path / "pool.npz")
    assert any("data-free attacker not measured" in n for n in result.notes)
    assert any("uniform" in n for n in result.notes)


def test_data_free_extraction_refuses_a_feature_vector_victim_in_one_line_and_writes_nothing(tmp_path):
    from stealkit.extract.datafree.run import run_datafree

    ranges = FeatureRange((0.0,) * 3, (1.0,) * 3)
    with pytest.raises(InputError) as exc:
        run_datafree("codfe", Target(nn.Linear(3, 2), input_shape=(3,), features=ranges), 100, mode="label",
                     out=tmp_path / "df")
    assert "generators make images" in _one_line(exc)
    assert not (tmp_path / "df").exists()
