"""ModelSpec: defaults, JSON round trip and validation of every field."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.models import ModelSpec, build_from_spec, build_model


@pytest.fixture(autouse=True)
def _single_thread():
    """These models are tiny: on a small, busy machine, intra-op thread syncs cost more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def full_dict() -> dict:
    return ModelSpec(
        arch="conv2",
        input_shape=(1, 28, 28),
        num_classes=3,
        kwargs={"c1": 8},
        class_names=["cat", "dog", "eel"],
        metrics={"accuracy": 0.9},
        extra={"source": "unit test", "nested": {"a": [1, 2]}},
    ).to_dict()


def test_defaults_are_filled_in():
    s = ModelSpec(arch="logistic", input_shape=[3, 32, 32], num_classes=4)
    assert s.input_shape == (3, 32, 32)
    assert s.mean == [0.5, 0.5, 0.5] and s.std == [0.5, 0.5, 0.5]
    assert s.class_names == ["0", "1", "2", "3"]
    assert s.kwargs == {} and s.metrics == {} and s.extra == {}
    assert s.stealkit_version == __version__


def test_json_round_trip_preserves_every_field():
    s = ModelSpec.from_dict(full_dict())
    text = s.to_json()
    back = ModelSpec.from_json(text)
    assert back == s
    data = json.loads(text)
    assert data["format"] == "stealkit.model/1"
    assert data["input_shape"] == [1, 28, 28] and data["class_names"] == ["cat", "dog", "eel"]
    assert data["extra"]["nested"] == {"a": [1, 2]}


def test_from_model_records_resolved_options():
    m = build_model("resnet", input_shape=(1, 8, 8), num_classes=10, width=0.25, mean=0.1307, std=0.3081)
    s = ModelSpec.from_model(m, metrics={"acc": 1.0})
    assert s.kwargs == {"depth": 18, "width": 0.25}
    assert s.mean == pytest.approx([0.1307]) and s.std == pytest.approx([0.3081])
    rebuilt = build_from_spec(s)
    assert rebuilt.state_dict().keys() == m.state_dict().keys()
    with pytest.raises(InputError, match="build_model"):
        ModelSpec.from_model(rebuilt.net)


def test_spec_is_frozen_and_copies_its_dicts():
    extra = {"a": [1]}
    s = ModelSpec(arch="logistic", input_shape=(1, 8, 8), num_classes=2, extra=extra)
    extra["a"].append(2)
    assert s.extra == {"a": [1]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.arch = "mlp2"  # type: ignore[misc]


@pytest.mark.parametrize(
    "change,match",
    [
        ({"arch": "resnet50"}, "arch"),
        ({"arch": None}, "arch"),
        ({"input_shape": [1, 28]}, "input_shape"),
        ({"input_shape": "1,28,28"}, "input_shape"),
        ({"input_shape": [1, 28, 28.5]}, "input_shape"),
        ({"num_classes": "3"}, "num_classes"),
        ({"num_classes": 1}, "num_classes"),
        ({"kwargs": [1]}, "kwargs"),
        ({"kwargs": None}, "kwargs"),
        ({"mean": [0.5, 0.5]}, "mean"),
        ({"mean": "0.5"}, "mean"),
        ({"std": [0.0]}, "std"),
        ({"std": [float("nan")]}, "std"),
        ({"class_names": ["a", "b"]}, "class_names"),
        ({"class_names": [1, 2, 3]}, "class_names"),
        ({"metrics": {"acc": object()}}, "metrics"),
        ({"metrics": {1: 2}}, "metrics"),
        ({"extra": "x"}, "extra"),
        ({"stealkit_version": 1}, "stealkit_version"),
        ({"format": "other/9"}, "format"),
        ({"weights": "x"}, "unknown field"),
    ],
)
def test_bad_fields_are_named(change, match):
    data = {**full_dict(), **change}
    with pytest.raises(InputError, match=match):
        ModelSpec.from_dict(data)


@pytest.mark.parametrize("field", ["arch", "input_shape", "num_classes"])
def test_missing_required_field(field):
    data = full_dict()
    del data[field]
    with pytest.raises(InputError, match=f"missing required field.*{field}"):
        ModelSpec.from_dict(data)


def test_optional_fields_may_be_absent():
    s = ModelSpec.from_dict({"arch": "mlp2", "input_shape": [1, 8, 8], "num_classes": 2})
    assert s.kwargs == {} and s.class_names == ["0", "1"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", b"\xff\xfe", "null"])
def test_not_a_spec(text):
    with pytest.raises(InputError):
        ModelSpec.from_json(text)


def test_bad_kwargs_fail_when_building():
    s = ModelSpec(arch="mlp2", input_shape=(1, 8, 8), num_classes=2, kwargs={"hidden": -3})
    with pytest.raises(InputError, match="hidden"):
        build_from_spec(s)
    with pytest.raises(InputError, match="ModelSpec"):
        build_from_spec({"arch": "mlp2"})  # type: ignore[arg-type]
