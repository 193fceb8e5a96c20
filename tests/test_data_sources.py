"""Named data sets: digits splits, file lookup, split sizes, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stealkit.data import DATASETS, FASHION_MNIST_CLASSES, candidate_dirs, load_splits
from stealkit.data.fixtures import write_cifar10_binary, write_cifar10_python, write_mnist_dir, write_svhn_dir
from stealkit.data.sources import train_split_sizes
from stealkit.errors import DataNotFoundError, InputError

FMNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEALKIT_DATA", raising=False)


def _u8(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


# ---------------------------------------------------------------------------------------------- digits


def _index_keys(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.reshape(len(x), -1)}


def test_digits_shapes_range_and_sizes() -> None:
    s = load_splits("digits")
    assert s.name == "digits" and s.input_shape == (1, 8, 8)
    assert s.classes == tuple("0123456789")
    sizes = [len(s.victim_train), len(s.attacker_pool), len(s.test)]
    assert sum(sizes) == 1797
    assert abs(sizes[0] - 1797 / 2) <= 10 and abs(sizes[1] - 1797 / 4) <= 10
    for ds in (s.victim_train, s.attacker_pool, s.test):
        assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
        assert ds.x.min() >= 0 and ds.x.max() <= 1
    assert s.victim_train.x.max() == 1.0  # pixels / 16, and some pixel is 16
    assert s.victim_train.name == "digits/victim_train"


def test_digits_splits_are_disjoint_and_cover_everything() -> None:
    from stealkit.data.sources import digits_split_indices

    victim, pool, test = digits_split_indices(0)
    everything = np.concatenate([victim, pool, test])
    assert len(everything) == len(set(everything.tolist())) == 1797
    s = load_splits("digits")
    # digits has a few duplicate images, so compare index sets, and images only loosely
    assert len(_index_keys(s.victim_train.x) & _index_keys(s.test.x)) < 10


def test_digits_deterministic_per_seed() -> None:
    a, b, c = load_splits("digits", seed=3), load_splits("digits", seed=3), load_splits("digits", seed=4)
    assert torch.equal(a.attacker_pool.x, b.attacker_pool.x) and torch.equal(a.test.y, b.test.y)
    assert not torch.equal(a.attacker_pool.x, c.attacker_pool.x)


def test_digits_is_stratified() -> None:
    s = load_splits("digits", seed=1)
    full = np.bincount(np.concatenate([s.victim_train.y, s.attacker_pool.y, s.test.y]), minlength=10)
    for ds, frac in ((s.victim_train, 0.5), (s.attacker_pool, 0.25), (s.test, 0.25)):
        counts = np.bincount(ds.y.numpy(), minlength=10)
        assert np.all(np.abs(counts - full * frac) <= 1), (ds.name, counts, full)


def test_split_arrays_are_not_shared_with_the_cache() -> None:
    a = load_splits("digits")
    a.attacker_pool.x.zero_()
    assert load_splits("digits").attacker_pool.x.max() == 1.0


# --------------------------------------------------------------------------------------- names, errors


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(InputError, match="known data sets: digits, mnist, fashion-mnist, cifar10, svhn"):
        load_splits("imagenet")
    assert DATASETS == ("digits", "mnist", "fashion-mnist", "cifar10", "svhn")


def test_aliases() -> None:
    assert candidate_dirs("Fashion_MNIST", "/d") == [Path("/d"), Path("/d/fashion-mnist")]


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, "0", True])
def test_bad_seed(seed) -> None:
    with pytest.raises(InputError, match="seed"):
        load_splits("digits", seed=seed)


def test_fashion_mnist_missing_dir_message(tmp_path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_splits("fashion-mnist", data_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and str(tmp_path / "fashion-mnist") in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "train-images-idx3-ubyte" in message


def test_missing_files_without_data_dir_names_env_and_system_dir(monkeypatch, tmp_path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_splits("mnist")
    assert "STEALKIT_DATA is not set" in str(info.value)
    assert "pass --data-dir pointing to the IDX files" in str(info.value)
    monkeypatch.setenv("STEALKIT_DATA", str(tmp_path))
    assert candidate_dirs("fashion-mnist") == [tmp_path, tmp_path / "fashion-mnist", FMNIST_SYSTEM_DIR]
    with pytest.raises(DataNotFoundError, match="cifar-10-python.tar.gz"):
        load_splits("cifar10")
    with pytest.raises(DataNotFoundError, match="train_32x32.mat"):
        load_splits("svhn")


# -------------------------------------------------------------------------------------- file-based sets


def test_mnist_from_fixture_uses_proportional_split(tmp_path) -> None:
    x_train, x_test = _u8(12, (1, 28, 28)), _u8(5, (1, 28, 28), seed=1)
    write_mnist_dir(tmp_path / "mnist", x_train, np.arange(12) % 10, x_test, np.arange(5))
    s = load_splits("mnist", data_dir=tmp_path)  # found in the <data_dir>/mnist sub-folder
    assert (len(s.victim_train), len(s.attacker_pool), len(s.test)) == (10, 2, 5)
    assert s.input_shape == (1, 28, 28) and s.classes == tuple("0123456789")
    assert torch.equal(s.victim_train.x, torch.from_numpy(x_train[:10]).float() / 255)
    assert torch.equal(s.attacker_pool.y, torch.tensor([0, 1]))
    assert s.test.x.max() <= 1 and s.test.x.dtype == torch.float32


def test_env_var_lookup_and_cache_sees_file_changes(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("STEALKIT_DATA", str(tmp_path))
    write_mnist_dir(tmp_path, _u8(6, (1, 4, 4)), np.arange(6), _u8(2, (1, 4, 4)), [0, 1], compress=False)
    first = load_splits("fashion-mnist")
    assert first.classes == FASHION_MNIST_CLASSES and len(first.test) == 2
    write_mnist_dir(tmp_path, _u8(6, (1, 4, 4)), np.arange(6), _u8(3, (1, 4, 4)), [0, 1, 2], compress=False)
    assert len(load_splits("fashion-mnist").test) == 3


@pytest.mark.parametrize(
    ("name", "n_train", "expected"),
    [
        ("mnist", 60000, (50000, 10000)),
        ("fashion-mnist", 70000, (50000, 20000)),
        ("cifar10", 50000, (40000, 10000)),
        ("svhn", 73257, (63257, 10000)),
        ("svhn", 80000, (70000, 10000)),
        ("mnist", 12, (10, 2)),
        ("cifar10", 10, (8, 2)),
        ("svhn", 10, (9, 1)),
        ("svhn", 2, (1, 1)),
    ],
)
def test_train_split_sizes(name: str, n_train: int, expected: tuple[int, int]) -> None:
    assert train_split_sizes(name, n_train) == expected


def test_train_split_needs_two_images() -> None:
    with pytest.raises(InputError, match="at least 2"):
        train_split_sizes("mnist", 1)


@pytest.mark.parametrize("writer", [write_cifar10_python, write_cifar10_binary])
def test_cifar10_splits_from_fixture(tmp_path, writer) -> None:
    x_train, x_test = _u8(10, (3, 32, 32)), _u8(3, (3, 32, 32), seed=1)
    writer(tmp_path / "cifar-10-batches-py", x_train, np.arange(10), x_test, [1, 2, 3])
    s = load_splits("cifar10", data_dir=tmp_path)
    assert (len(s.victim_train), len(s.attacker_pool), len(s.test)) == (8, 2, 3)
    assert s.input_shape == (3, 32, 32) and s.classes[0] == "airplane"
    assert torch.equal(s.attacker_pool.x, torch.from_numpy(x_train[8:]).float() / 255)


def test_svhn_splits_from_fixture(tmp_path) -> None:
    write_svhn_dir(tmp_path, _u8(10, (3, 32, 32)), np.arange(10), _u8(4, (3, 32, 32)), [0, 0, 1, 1])
    s = load_splits("svhn", data_dir=tmp_path)
    assert (len(s.victim_train), len(s.attacker_pool), len(s.test)) == (9, 1, 4)
    assert s.attacker_pool.y.tolist() == [9] and s.test.y.tolist() == [0, 0, 1, 1]


@pytest.mark.fmnist
def test_fashion_mnist_system_files() -> None:
    if not (FMNIST_SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    s = load_splits("fashion-mnist")
    assert (len(s.victim_train), len(s.attacker_pool), len(s.test)) == (50000, 10000, 10000)
    assert s.input_shape == (1, 28, 28) and s.classes == FASHION_MNIST_CLASSES
    for ds in (s.victim_train, s.attacker_pool, s.test):
        assert ds.x.min() == 0.0 and ds.x.max() == 1.0
        assert torch.bincount(ds.y, minlength=10).min() > 500


def test_load_split_matches_load_splits(tmp_path) -> None:
    from stealkit.data import load_split

    full = load_splits("digits", seed=5)
    for part in ("victim_train", "attacker_pool", "test"):
        one = load_split("digits", part, seed=5)
        assert torch.equal(one.x, getattr(full, part).x) and one.name == f"digits/{part}"
    write_mnist_dir(tmp_path, _u8(12, (1, 4, 4)), np.arange(12) % 10, _u8(2, (1, 4, 4)), [0, 1])
    assert torch.equal(
        load_split("mnist", "attacker_pool", data_dir=tmp_path).x,
        load_splits("mnist", data_dir=tmp_path).attacker_pool.x,
    )
    with pytest.raises(InputError, match="splits are victim_train, attacker_pool, test"):
        load_split("digits", "train")


def test_data_dir_that_is_a_file(tmp_path) -> None:
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"x")
    with pytest.raises(InputError, match="folder"):
        load_splits("mnist", data_dir=path)
