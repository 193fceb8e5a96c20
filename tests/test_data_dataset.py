"""The Dataset and Splits types: validation, indexing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from stealkit.data import Dataset, Splits
from stealkit.errors import InputError

CLASSES = ("a", "b", "c")


def _ds(n: int = 6, shape: tuple[int, int, int] = (1, 4, 4), name: str = "toy") -> Dataset:
    x = torch.linspace(0, 1, n * shape[0] * shape[1] * shape[2]).reshape(n, *shape)
    return Dataset(x, torch.arange(n) % 3, CLASSES, name)


def test_properties() -> None:
    ds = _ds(6, (3, 5, 4))
    assert ds.input_shape == (3, 5, 4)
    assert ds.num_classes == 3 and len(ds) == 6
    assert "toy" in repr(ds)


def test_equality_is_identity() -> None:
    a = _ds()
    assert a == a and a != _ds() and len({a, a}) == 1


def test_frozen_and_classes_become_tuple() -> None:
    ds = Dataset(torch.zeros(2, 1, 2, 2), torch.tensor([0, 1]), ["x", "y"], "t")  # type: ignore[arg-type]
    assert ds.classes == ("x", "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (torch.zeros(2, 4, 4), torch.tensor([0, 1]), "\\[N, C, H, W\\]"),
        (torch.zeros(2, 1, 4, 4, dtype=torch.float64), torch.tensor([0, 1]), "float32"),
        (torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]), "float32"),
        (torch.zeros(2, 1, 4, 4), torch.tensor([0, 1], dtype=torch.int32), "int64"),
        (torch.zeros(2, 1, 4, 4), torch.tensor([0, 1, 2]), "2 images but y has 3"),
        (torch.full((2, 1, 4, 4), 1.5), torch.tensor([0, 1]), "\\[0, 1\\]"),
        (torch.full((2, 1, 4, 4), -0.1), torch.tensor([0, 1]), "\\[0, 1\\]"),
        (torch.full((2, 1, 4, 4), float("nan")), torch.tensor([0, 1]), "NaN"),
        (torch.zeros(2, 1, 4, 4), torch.tensor([0, 3]), "labels must lie in \\[0, 2\\]"),
        (torch.zeros(2, 1, 4, 4), torch.tensor([-1, 0]), "labels"),
    ],
)
def test_validation(x: torch.Tensor, y: torch.Tensor, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Dataset(x, y, CLASSES, "bad")


def test_nan_among_valid_pixels_is_caught() -> None:
    x = torch.rand(3, 1, 4, 4)
    x[1, 0, 2, 2] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        Dataset(x, torch.tensor([0, 1, 2]), CLASSES, "bad")


def test_classes_validation() -> None:
    with pytest.raises(InputError, match="classes"):
        Dataset(torch.zeros(1, 1, 2, 2), torch.tensor([0]), (), "bad")
    with pytest.raises(InputError, match="classes"):
        Dataset(torch.zeros(1, 1, 2, 2), torch.tensor([0]), "abc", "bad")  # type: ignore[arg-type]


def test_empty_dataset_is_allowed() -> None:
    ds = Dataset(torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.int64), CLASSES, "empty")
    assert len(ds) == 0 and ds.input_shape == (3, 8, 8)


def test_subset_indices_mask_and_errors() -> None:
    ds = _ds()
    for idx in ([4, 1], np.array([4, 1]), torch.tensor([4, 1]), range(4, 0, -3)):
        sub = ds.subset(idx)
        assert torch.equal(sub.x, ds.x[[4, 1]]) and sub.y.tolist() == [1, 1]
    mask = ds.y == 2
    assert ds.subset(mask).y.tolist() == [2, 2]
    assert len(ds.subset([])) == 0
    with pytest.raises(InputError, match="out of range"):
        ds.subset([6])
    with pytest.raises(InputError, match="integers"):
        ds.subset([0.5])
    with pytest.raises(InputError, match="mask"):
        ds.subset(torch.tensor([True, False]))


def test_take() -> None:
    ds = _ds()
    assert torch.equal(ds.take(2).x, ds.x[:2])
    assert len(ds.take(100)) == 6
    assert len(ds.take(0)) == 0
    with pytest.raises(InputError):
        ds.take(-1)


def test_splits_checks_consistency() -> None:
    a, b = _ds(name="a"), _ds(name="b")
    splits = Splits(a, b, a, name="s")
    assert splits.input_shape == (1, 4, 4) and splits.num_classes == 3 and splits.classes == CLASSES
    with pytest.raises(InputError, match="image shapes"):
        Splits(a, _ds(shape=(3, 4, 4)), a, name="s")
    other = Dataset(a.x, a.y, ("p", "q", "r"), "o")
    with pytest.raises(InputError, match="class lists"):
        Splits(a, other, a, name="s")
