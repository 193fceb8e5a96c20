"""Named data sets and their victim / attacker-pool / test splits (Milli et al. 2019, Section 4).

``digits`` is bundled with scikit-learn. The other sets are read from files found in, in order:

1. ``data_dir`` and ``data_dir/<name>`` when ``data_dir`` is given (then nowhere else, so an explicit
   folder is never silently replaced by another copy);
2. otherwise ``$STEALKIT_DATA`` and ``$STEALKIT_DATA/<name>``, then the system folder of a Debian
   package (``/usr/share/datasets/fashion-mnist`` for Fashion-MNIST).

Decoded files are cached in-process (keyed by folder, file sizes and modification times), so repeated
``load_splits`` calls cost a uint8-to-float conversion, not a decode.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from stealkit.data._checks import check_seed
from stealkit.data.dataset import Dataset, Splits
from stealkit.data.readers import (
    CIFAR10_SUBFOLDERS,
    MNIST_FILES,
    SVHN_FILES,
    find_cifar10_files,
    find_mnist_files,
    find_svhn_files,
    read_cifar10,
    read_mnist,
    read_svhn,
)
from stealkit.errors import DataNotFoundError, InputError

DATASETS: tuple[str, ...] = ("digits", "mnist", "fashion-mnist", "cifar10", "svhn")

DIGIT_CLASSES = tuple(str(i) for i in range(10))
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_ALIASES = {
    "fashion_mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "fmnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar_10": "cifar10",
}

ENV_VAR = "STEALKIT_DATA"

Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


def canonical_dataset(name: str) -> str:
    """The canonical spelling of a data set name (case and ``_``/``-`` insensitive), or ``InputError``."""
    if not isinstance(name, str):
        raise InputError(f"data set name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise InputError(f"unknown data set {name!r}; known data sets: {', '.join(DATASETS)}")
    return key


@dataclass(frozen=True)
class _FileSet:
    """How to find, read and split one file-based data set."""

    find: Callable[[Path], object]
    read: Callable[[Path], Decoded]
    needs: str  # the files, for error messages
    how_to_get: str
    system_dirs: tuple[Path, ...]
    train_total: int  # standard size of the train files
    victim_n: int | None = None  # standard split: first victim_n images are the victim's ...
    pool_n: int | None = None  # ... or the last pool_n images are the attacker's


def _read_mnist_classes(classes: tuple[str, ...]) -> Callable[[Path], Decoded]:
    def read(directory: Path) -> Decoded:
        return (*read_mnist(directory), classes)

    return read


_IDX_NEEDS = ", ".join(s + "[.gz]" for s in MNIST_FILES.values())

_FILE_SETS: dict[str, _FileSet] = {
    "mnist": _FileSet(
        find=find_mnist_files,
        read=_read_mnist_classes(DIGIT_CLASSES),
        needs=_IDX_NEEDS,
        how_to_get="pass --data-dir pointing to the IDX files (or set $STEALKIT_DATA)",
        system_dirs=(),
        train_total=60000,
        victim_n=50000,
    ),
    "fashion-mnist": _FileSet(
        find=find_mnist_files,
        read=_read_mnist_classes(FASHION_MNIST_CLASSES),
        needs=_IDX_NEEDS,
        how_to_get="install them with `apt-get install dataset-fashion-mnist`, or pass --data-dir pointing "
        "to the IDX files (or set $STEALKIT_DATA)",
        system_dirs=(Path("/usr/share/datasets/fashion-mnist"),),
        train_total=60000,
        victim_n=50000,
    ),
    "cifar10": _FileSet(
        find=find_cifar10_files,
        read=read_cifar10,
        needs="data_batch_1..5 and test_batch (python version, optionally batches.meta) or the same names "
        f"with .bin (binary version), directly or in {' or '.join(CIFAR10_SUBFOLDERS)}",
        how_to_get="download and unpack cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, "
        "then pass --data-dir pointing to it (or set $STEALKIT_DATA)",
        system_dirs=(),
        train_total=50000,
        victim_n=40000,
    ),
    "svhn": _FileSet(
        find=find_svhn_files,
        read=read_svhn,
        needs=" and ".join(SVHN_FILES.values()),
        how_to_get="download them from http://ufldl.stanford.edu/housenumbers/, then pass --data-dir "
        "pointing to them (or set $STEALKIT_DATA)",
        system_dirs=(),
        train_total=73257,
        pool_n=10000,
    ),
}


def candidate_dirs(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """The folders ``load_splits`` looks in for data set ``name``, in order (see the module docstring)."""
    name = canonical_dataset(name)
    if data_dir is not None:
        bases = [Path(data_dir).expanduser()]
    else:
        env = os.environ.get(ENV_VAR)
        bases = [Path(env).expanduser()] if env else []
    dirs = [d for base in bases for d in (base, base / name)]
    if data_dir is None and name in _FILE_SETS:
        dirs += list(_FILE_SETS[name].system_dirs)
    return dirs


def _locate(name: str, data_dir: str | Path | None) -> tuple[Path, list[Path]]:
    fileset = _FILE_SETS[name]
    if data_dir is not None and Path(data_dir).expanduser().is_file():
        raise InputError(f"data_dir must be the folder holding the {name} files, not a file: {data_dir}")
    dirs = candidate_dirs(name, data_dir)
    for d in dirs:
        found = fileset.find(d)
        if found is not None:
            files = list(found.values()) if isinstance(found, dict) else list(found)  # type: ignore[arg-type]
            return d, files
    looked = "; ".join(str(d) for d in dirs) or "nowhere"
    if data_dir is None and not os.environ.get(ENV_VAR):
        looked += f" (${ENV_VAR} is not set)"
    raise DataNotFoundError(
        f"{name} files not found. Looked in: {looked}. Need {fileset.needs}. To get them: {fileset.how_to_get}."
    )


@functools.lru_cache(maxsize=4)
def _decoded(name: str, directory: str, stamp: tuple[tuple[str, int, int], ...]) -> Decoded:
    """Decode once per (folder, file versions); the arrays are made read-only because they are shared."""
    x_train, y_train, x_test, y_test, classes = _FILE_SETS[name].read(Path(directory))
    for arr in (x_train, y_train, x_test, y_test):
        arr.flags.writeable = False
    return x_train, y_train, x_test, y_test, classes


def _stamp(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _to_float(images: np.ndarray) -> torch.Tensor:
    """uint8 -> float32 in [0, 1], in one pass, into a new (caller-owned) tensor."""
    return torch.from_numpy(np.divide(images, np.float32(255), dtype=np.float32))


def train_split_sizes(name: str, n_train: int) -> tuple[int, int]:
    """(victim_train, attacker_pool) sizes for a train file set of ``n_train`` images.

    With the standard number of images (or more) this is the standard split: MNIST and Fashion-MNIST
    50000 / rest, CIFAR-10 40000 / rest, SVHN all but the last 10000 / last 10000. Smaller file sets
    (test fixtures, subsets) are split in the same proportion, with at least one image on each side.
    """
    fileset = _FILE_SETS[canonical_dataset(name)]
    if n_train < 2:
        raise InputError(f"{name} train files hold {n_train} image(s); need at least 2 to split them")
    if n_train >= fileset.train_total:
        victim = fileset.victim_n if fileset.victim_n is not None else n_train - (fileset.pool_n or 0)
    else:
        standard_victim = fileset.victim_n or fileset.train_total - (fileset.pool_n or 0)
        victim = min(max(round(n_train * standard_victim / fileset.train_total), 1), n_train - 1)
    return victim, n_train - victim


SPLITS: tuple[str, ...] = ("victim_train", "attacker_pool", "test")


def _load_file_parts(name: str, data_dir: str | Path | None, parts: tuple[str, ...]) -> dict[str, Dataset]:
    directory, files = _locate(name, data_dir)
    x_train, y_train, x_test, y_test, classes = _decoded(name, str(directory.resolve()), _stamp(files))
    n_victim, _ = train_split_sizes(name, len(x_train))
    ranges = {
        "victim_train": (x_train[:n_victim], y_train[:n_victim]),
        "attacker_pool": (x_train[n_victim:], y_train[n_victim:]),
        "test": (x_test, y_test),
    }
    return {
        part: Dataset(
            _to_float(ranges[part][0]), torch.from_numpy(ranges[part][1].copy()), classes, f"{name}/{part}"
        )
        for part in parts
    }


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def stratified_split(labels: np.ndarray, fractions: tuple[float, ...], seed: int) -> tuple[np.ndarray, ...]:
    """Split indices ``0..len(labels)-1`` into parts of the given fractions, class by class, seeded.

    Within each class the samples are shuffled with ``numpy.random.default_rng(seed)`` and cut at the
    rounded cumulative fractions, so every part holds each class in (nearly) the same proportion.
    Returns one sorted index array per fraction.
    """
    rng = np.random.default_rng(check_seed(seed))
    cuts = np.cumsum(fractions)[:-1]
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        for i, chunk in enumerate(np.split(members, np.round(cuts * len(members)).astype(int))):
            parts[i].append(chunk)
    return tuple(np.sort(np.concatenate(p)) for p in parts)


def digits_split_indices(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted indices into ``load_digits()`` of the victim_train / attacker_pool / test splits.

    A stratified 50% / 25% / 25% split (``stratified_split``), a function of ``seed`` only.
    """
    _, y = _digits_arrays()
    victim, pool, test = stratified_split(y, (0.5, 0.25, 0.25), seed)
    return victim, pool, test


def _load_digits_parts(seed: int, parts: tuple[str, ...]) -> dict[str, Dataset]:
    x, y = _digits_arrays()
    indices = dict(zip(SPLITS, digits_split_indices(seed), strict=True))
    return {
        part: Dataset(
            torch.from_numpy(x[indices[part]]),
            torch.from_numpy(y[indices[part]]),
            DIGIT_CLASSES,
            f"digits/{part}",
        )
        for part in parts
    }


def _load_parts(
    name: str, data_dir: str | Path | None, seed: int, parts: tuple[str, ...]
) -> dict[str, Dataset]:
    name = canonical_dataset(name)
    seed = check_seed(seed)
    if name == "digits":
        return _load_digits_parts(seed, parts)
    return _load_file_parts(name, data_dir, parts)


def load_splits(name: str, *, data_dir: str | Path | None = None, seed: int = 0) -> Splits:
    """Load data set ``name`` (one of ``DATASETS``) as victim_train / attacker_pool / test splits.

    ``digits`` (scikit-learn's 8x8 digits, 1x8x8, pixels / 16) is split 50/25/25, stratified and seeded by
    ``seed``. The file-based sets have fixed splits (``seed`` is checked but unused): victim_train and
    attacker_pool partition the train files (see ``train_split_sizes``), test is the test file set.
    Missing files raise ``DataNotFoundError`` naming every folder looked in and how to get the files.
    Each call returns new tensors, which the caller may modify.
    """
    parts = _load_parts(name, data_dir, seed, SPLITS)
    return Splits(**parts, name=canonical_dataset(name))


def load_split(name: str, split: str, *, data_dir: str | Path | None = None, seed: int = 0) -> Dataset:
    """One split of ``load_splits(name, ...)`` (``victim_train``, ``attacker_pool`` or ``test``).

    Same data as the corresponding ``Splits`` field, without converting the other two splits.
    """
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
    return _load_parts(name, data_dir, seed, (split,))[split]
