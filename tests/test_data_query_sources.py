"""Query source specs: grammar, loading, adaptation, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stealkit.data import (
    QUERY_SOURCES,
    SourceSpec,
    describe_source,
    load_query_source,
    load_splits,
    parse_source,
)
from stealkit.data.fixtures import write_mnist_dir
from stealkit.errors import DataNotFoundError, InputError


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEALKIT_DATA", raising=False)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("pool", SourceSpec("pool")),
        ("digits:classes=0-4", SourceSpec("digits", classes=(0, 1, 2, 3, 4))),
        ("Digits : classes=0,2,5", SourceSpec("digits", classes=(0, 2, 5))),
        ("cifar10:classes=0-2,7,1:imbalance=0.1", SourceSpec("cifar10", classes=(0, 1, 2, 7), imbalance=0.1)),
        ("fashion_mnist:imbalance=1", SourceSpec("fashion-mnist", imbalance=1.0)),
        (
            "gaussian:mean=0.4914,0.4822,0.4465:std=0.25",
            SourceSpec("gaussian", mean=(0.4914, 0.4822, 0.4465), std=(0.25,)),
        ),
        ("uniform", SourceSpec("uniform")),
        ("PATCHES", SourceSpec("patches")),
    ],
)
def test_parse(spec: str, expected: SourceSpec) -> None:
    assert parse_source(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty query source"),
        ("imagenet", "unknown query source 'imagenet'; valid sources: pool, digits, mnist"),
        ("digits:classes", "key=value"),
        ("digits:classes=", "key=value"),
        ("digits:colour=red", "unknown option 'colour' for digits; valid options: classes, imbalance"),
        ("uniform:classes=0-4", "valid options: none"),
        ("gaussian:imbalance=0.1", "valid options: mean, std"),
        ("digits:classes=1:classes=2", "given twice"),
        ("digits:classes=4-1", "bad classes item '4-1'"),
        ("digits:classes=a", "bad classes item 'a'"),
        ("digits:classes=-1", "bad classes item"),
        ("digits:imbalance=0", "imbalance must be a number in \\(0, 1\\]"),
        ("digits:imbalance=2", "imbalance must be"),
        ("digits:imbalance=x", "imbalance must be"),
        ("gaussian:mean=a,b", "mean must be a number"),
    ],
)
def test_parse_errors(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_source(spec)


def test_all_names_parse() -> None:
    for name in QUERY_SOURCES:
        assert parse_source(name).name == name


def test_dataset_pool_is_adapted_to_the_victim_input() -> None:
    x = load_query_source("digits", input_shape=(3, 28, 28), n=20, seed=0)
    assert x.shape == (20, 3, 28, 28) and x.dtype == torch.float32
    assert x.min() >= 0 and x.max() <= 1
    assert torch.equal(x[:, 0], x[:, 2])  # grayscale repeated to RGB


def test_pool_means_the_victims_attacker_pool_shuffled() -> None:
    pool = load_splits("digits", seed=2).attacker_pool
    x = load_query_source(
        "pool", input_shape=(1, 8, 8), n=None, seed=2, split_seed=2, victim_dataset="digits"
    )
    assert x.shape == pool.x.shape and not torch.equal(x, pool.x)  # all of it, shuffled
    assert sorted(map(bytes, x.reshape(len(x), -1).numpy())) == sorted(
        map(bytes, pool.x.reshape(len(x), -1).numpy())
    )
    again = load_query_source(
        "pool", input_shape=(1, 8, 8), n=None, seed=2, split_seed=2, victim_dataset="digits"
    )
    other = load_query_source(
        "pool", input_shape=(1, 8, 8), n=None, seed=3, split_seed=2, victim_dataset="digits"
    )
    assert torch.equal(x, again) and not torch.equal(x, other)


def test_split_seed_defaults_to_zero_independent_of_seed() -> None:
    """The pool must be the victim's pool (split seed 0 by default) whatever the shuffling seed."""
    pool = load_splits("digits", seed=0).attacker_pool
    x = load_query_source("digits", input_shape=(1, 8, 8), n=None, seed=9)
    assert sorted(map(bytes, x.reshape(len(x), -1).numpy())) == sorted(
        map(bytes, pool.x.reshape(len(x), -1).numpy())
    )


def test_pool_smaller_than_n_is_returned_whole() -> None:
    pool_size = len(load_splits("digits").attacker_pool)
    x = load_query_source("digits", input_shape=(1, 8, 8), n=10**6, seed=0, split_seed=0)
    assert len(x) == pool_size


def test_classes_and_imbalance_options() -> None:
    full = load_splits("digits").attacker_pool
    x = load_query_source("digits:classes=0-4", input_shape=(1, 8, 8), n=None, seed=0)
    low = full.x[full.y < 5]
    assert len(x) == len(low)
    assert {bytes(r) for r in x.reshape(len(x), -1).numpy()} <= {
        bytes(r) for r in low.reshape(len(low), -1).numpy()
    }
    y = load_query_source("digits:classes=0,9:imbalance=0.1", input_shape=(1, 8, 8), n=None, seed=0)
    n0, n9 = int((full.y == 0).sum()), int((full.y == 9).sum())
    assert len(y) == n0 + math.floor(n9 * 0.1 + 0.5)  # class 9 of 10 keeps ratio ** (9 / 9), half rounded up


def test_file_dataset_source_with_data_dir(tmp_path) -> None:
    x_train = np.full((12, 1, 6, 6), 255, np.uint8)
    write_mnist_dir(tmp_path, x_train, np.arange(12) % 10, x_train[:2], [0, 1])
    x = load_query_source("mnist", input_shape=(3, 12, 12), n=5, seed=0, data_dir=tmp_path)
    assert x.shape == (2, 3, 12, 12) and torch.all(x == 1)  # the pool holds 2 of the 12 train images
    with pytest.raises(DataNotFoundError, match="svhn"):
        load_query_source("svhn", input_shape=(3, 32, 32), n=5, seed=0, data_dir=tmp_path)


@pytest.mark.parametrize("name", ["gaussian", "uniform", "patches"])
def test_synthetic_sources(name: str) -> None:
    x = load_query_source(name, input_shape=(3, 16, 16), n=7, seed=1)
    assert x.shape == (7, 3, 16, 16) and x.min() >= 0 and x.max() <= 1
    assert torch.equal(x, load_query_source(name, input_shape=(3, 16, 16), n=7, seed=1))


def test_gaussian_options_reach_the_generator() -> None:
    x = load_query_source("gaussian:mean=0.2:std=0", input_shape=(1, 4, 4), n=3, seed=0)
    assert torch.allclose(x, torch.full_like(x, 0.2))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"spec": "pool"}, InputError, "victim's data set is not known"),
        ({"spec": "gaussian", "n": None}, InputError, "unbounded"),
        ({"spec": "digits", "n": -2}, InputError, "non-negative"),
        ({"spec": "digits", "input_shape": (28, 28)}, InputError, "C, H, W"),
        ({"spec": "digits:classes=12"}, InputError, "class 12 is not in"),
        ({"spec": "pool", "victim_dataset": "imagenet"}, InputError, "known data sets"),
    ],
)
def test_load_errors(kwargs, error, message) -> None:
    args = {"input_shape": (1, 8, 8), "n": 4, "seed": 0} | kwargs
    with pytest.raises(error, match=message):
        load_query_source(**args)


def test_describe_source() -> None:
    assert describe_source("digits:classes=0-4,7:imbalance=0.1") == (
        "attacker pool of digits (classes 0-4,7 only; long-tailed, last class kept at ratio 0.1)"
    )
    assert (
        describe_source("pool", victim_dataset="cifar10")
        == "attacker pool of the victim's data set (cifar10)"
    )
    assert "mean 0.1/0.2/0.3" in describe_source("gaussian:mean=0.1,0.2,0.3")
    assert describe_source("uniform") == "uniform noise in [0, 1]"
    assert "photographs" in describe_source("patches")
    with pytest.raises(InputError):
        describe_source("nonsense")
