"""Readers for the image file formats of the named data sets: IDX (MNIST family), CIFAR-10, SVHN.

Every reader returns numpy arrays: images ``uint8 [N, C, H, W]`` and labels ``int64 [N]``. Malformed,
truncated or unsafe files raise ``InputError``; missing ones ``DataNotFoundError``. The ``find_*``
functions say whether a folder holds a format's files (``None`` when it does not) and never raise.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from stealkit.data.safe_pickle import load_data_pickle
from stealkit.errors import DataNotFoundError, InputError

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

# ---------------------------------------------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataNotFoundError(f"{path} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{path} is a damaged gzip file ({exc}); download it again") from None
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed, detected from its content).

    IDX layout: two zero bytes, a dtype code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
    0x0E float64), the number of dimensions, each dimension as a big-endian uint32, then the big-endian data.
    Returns a writable array in native byte order with the stored shape.
    """
    path = Path(path)
    raw = _read_maybe_gzip(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise InputError(f"{path} is not an IDX file (bad magic number); pass the MNIST-style *-ubyte files")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise InputError(f"{path}: unknown IDX dtype code 0x{code:02X}; the file is damaged or not IDX")
    if ndim == 0:
        raise InputError(f"{path}: IDX header declares zero dimensions; the file is damaged")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise InputError(f"{path} is truncated inside its header; download it again")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header
    if got < expected:
        raise InputError(
            f"{path} is truncated: header declares shape {dims} ({expected} data bytes) but only {got} follow; "
            "download it again"
        )
    if got > expected:
        raise InputError(
            f"{path} has {got - expected} unexpected bytes after shape {dims}; the file is damaged"
        )
    data = np.frombuffer(raw, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return data.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def _idx_path(directory: Path, stem: str) -> Path | None:
    variants = (stem, stem.replace("-idx", ".idx"))  # some mirrors write train-images.idx3-ubyte
    for base in variants:
        for name in (base, base + ".gz"):
            if (directory / name).is_file():
                return directory / name
    return None


def find_mnist_files(directory: str | Path) -> dict[str, Path] | None:
    """The four IDX files (``train-images-idx3-ubyte[.gz]`` ...) in ``directory``, or ``None`` if any is missing."""
    found = {key: _idx_path(Path(directory), stem) for key, stem in MNIST_FILES.items()}
    if any(p is None for p in found.values()):
        return None
    return {key: p for key, p in found.items() if p is not None}


def read_mnist(directory: str | Path) -> Arrays:
    """Read MNIST-style IDX files from ``directory``: ``(x_train, y_train, x_test, y_test)``.

    Images come back as ``uint8 [N, 1, H, W]``, labels as ``int64 [N]``. Works for MNIST and Fashion-MNIST.
    """
    directory = Path(directory)
    files = find_mnist_files(directory)
    if files is None:
        raise DataNotFoundError(
            f"{directory} lacks MNIST-style IDX files; need {', '.join(s + '[.gz]' for s in MNIST_FILES.values())}"
        )
    out: list[np.ndarray] = []
    for part in ("train", "test"):
        images, labels = read_idx(files[f"{part}_images"]), read_idx(files[f"{part}_labels"])
        if images.ndim != 3 or images.dtype != np.uint8:
            raise InputError(
                f"{files[f'{part}_images']}: expected uint8 images [N, H, W], got {images.dtype} {images.shape}"
            )
        if labels.ndim != 1:
            raise InputError(
                f"{files[f'{part}_labels']}: expected a label vector [N], got shape {labels.shape}"
            )
        if len(images) != len(labels):
            raise InputError(
                f"{files[f'{part}_images'].name} has {len(images)} images but {files[f'{part}_labels'].name} "
                f"has {len(labels)} labels; the files do not belong together"
            )
        out += [images[:, None], labels.astype(np.int64)]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise InputError(
            f"{directory}: train images {out[0].shape[2:]} and test images {out[2].shape[2:]} differ in size"
        )
    return out[0], out[1], out[2], out[3]


# ----------------------------------------------------------------------------------------------- CIFAR-10

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_SUBFOLDERS = ("cifar-10-batches-py", "cifar-10-batches-bin")
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_ROW = 3 * 32 * 32


def find_cifar10_files(directory: str | Path) -> list[Path] | None:
    """The CIFAR-10 batch files under ``directory`` (or its ``cifar-10-batches-py``/``-bin`` folder).

    Prefers the python version when both are present. ``None`` when no complete set is found.
    """
    directory = Path(directory)
    for folder in (directory, *(directory / s for s in CIFAR10_SUBFOLDERS)):
        for suffix in ("", ".bin"):
            files = [folder / f"{stem}{suffix}" for stem in (*_CIFAR_TRAIN, "test_batch")]
            if all(f.is_file() for f in files):
                return files
    return None


def _get(batch: dict[Any, Any], key: str) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def _read_cifar_python_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = load_data_pickle(path, what="CIFAR-10 batch")
    try:
        if not isinstance(batch, dict):
            raise TypeError(f"a {type(batch).__name__} instead of a dict")
        data, labels = _get(batch, "data"), _get(batch, "labels")
    except (KeyError, TypeError) as exc:
        raise InputError(
            f"{path} is not a CIFAR-10 python batch (no data/labels: {exc}); download it again"
        ) from None
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != _CIFAR_ROW
    ):
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise InputError(f"{path}: expected data as uint8 [N, {_CIFAR_ROW}], got {got}; is this CIFAR-100?")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise InputError(f"{path}: labels are not a list of integers") from None
    if y.shape != (len(data),):
        raise InputError(f"{path}: {len(data)} images but labels of shape {y.shape}")
    return data.reshape(-1, 3, 32, 32), y


def _read_cifar_binary_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if raw.size == 0 or raw.size % (_CIFAR_ROW + 1):
        raise InputError(
            f"{path} holds {raw.size} bytes, not a whole number of {_CIFAR_ROW + 1}-byte CIFAR-10 records; "
            "the file is truncated or not the binary version"
        )
    rows = raw.reshape(-1, _CIFAR_ROW + 1)
    return rows[:, 1:].reshape(-1, 3, 32, 32).copy(), rows[:, 0].astype(np.int64)


def _cifar_classes(folder: Path, binary: bool) -> tuple[str, ...]:
    if binary:
        meta = folder / "batches.meta.txt"
        if meta.is_file():
            names = [line.strip() for line in meta.read_text(encoding="utf-8", errors="replace").splitlines()]
            return tuple(n for n in names if n) or CIFAR10_CLASSES
        return CIFAR10_CLASSES
    meta = folder / "batches.meta"
    if not meta.is_file():
        return CIFAR10_CLASSES
    content = load_data_pickle(meta, what="CIFAR-10 meta file")
    try:
        names = _get(content, "label_names")
        return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)
    except (KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise InputError(
            f"{meta} has no readable label_names; delete it to use the standard class names"
        ) from None


def read_cifar10(
    directory: str | Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """Read CIFAR-10 from ``directory``: ``(x_train, y_train, x_test, y_test, classes)``.

    ``directory`` may be the ``cifar-10-batches-py`` (or ``-bin``) folder or its parent. The python version
    (pickled ``data_batch_1`` ... ``test_batch``, optional ``batches.meta``) is read with a restricted
    unpickler that only rebuilds numpy arrays; the binary version (``data_batch_1.bin`` ...) is read as
    rows of one label byte and 3072 pixel bytes. Images come back as ``uint8 [N, 3, 32, 32]``.
    """
    files = find_cifar10_files(directory)
    if files is None:
        raise DataNotFoundError(
            f"{directory} lacks CIFAR-10 batches; need data_batch_1..5 and test_batch (python version) or "
            f"data_batch_1.bin..test_batch.bin (binary version), there or in {' or '.join(CIFAR10_SUBFOLDERS)}"
        )
    binary = files[0].suffix == ".bin"
    read = _read_cifar_binary_batch if binary else _read_cifar_python_batch
    train = [read(f) for f in files[:-1]]
    x_test, y_test = read(files[-1])
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    classes = _cifar_classes(files[0].parent, binary)
    for part, y in (("train", y_train), ("test", y_test)):
        if y.size and (y.min() < 0 or y.max() >= len(classes)):
            raise InputError(
                f"{files[0].parent}: {part} labels outside [0, {len(classes) - 1}]; the files are damaged"
            )
    return x_train, y_train, x_test, y_test, classes


# --------------------------------------------------------------------------------------------------- SVHN

SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}
SVHN_CLASSES = tuple(str(i) for i in range(10))


def find_svhn_files(directory: str | Path) -> dict[str, Path] | None:
    """``train_32x32.mat`` and ``test_32x32.mat`` in ``directory``, or ``None`` if either is missing."""
    found = {part: Path(directory) / name for part, name in SVHN_FILES.items()}
    return found if all(p.is_file() for p in found.values()) else None


def _read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    try:
        mat = loadmat(path, variable_names=["X", "y"])
    except NotImplementedError:
        raise InputError(f"{path} is a MATLAB v7.3 (HDF5) file; SVHN's own 32x32 .mat files are v5") from None
    except Exception as exc:  # scipy raises ValueError/TypeError/OSError/... on damaged files
        raise InputError(
            f"{path} is not a readable .mat file ({type(exc).__name__}: {exc}); download it again"
        ) from None
    if "X" not in mat or "y" not in mat:
        raise InputError(f"{path} lacks the X and y variables of an SVHN cropped-digits file")
    x, y = mat["X"], np.asarray(mat["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[2] != 3 or x.dtype != np.uint8:
        raise InputError(f"{path}: expected X as uint8 [32, 32, 3, N], got {x.dtype} {x.shape}")
    if y.shape[0] != x.shape[3]:
        raise InputError(f"{path}: X holds {x.shape[3]} images but y holds {y.shape[0]} labels")
    y = y.astype(np.int64)
    if y.size and (y.min() < 1 or y.max() > 10):
        raise InputError(
            f"{path}: SVHN labels must lie in 1..10 (10 meaning digit 0), found {y.min()}..{y.max()}"
        )
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y % 10


def read_svhn(
    directory: str | Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """Read SVHN cropped digits from ``directory``: ``(x_train, y_train, x_test, y_test, classes)``.

    Reads ``train_32x32.mat`` and ``test_32x32.mat`` (X ``[32, 32, 3, N]`` uint8, y in 1..10 with 10
    meaning the digit 0). Images come back as ``uint8 [N, 3, 32, 32]``, labels as digits 0..9.
    """
    files = find_svhn_files(directory)
    if files is None:
        raise DataNotFoundError(f"{directory} lacks SVHN files; need {' and '.join(SVHN_FILES.values())}")
    x_train, y_train = _read_svhn_mat(files["train"])
    x_test, y_test = _read_svhn_mat(files["test"])
    return x_train, y_train, x_test, y_test, SVHN_CLASSES
