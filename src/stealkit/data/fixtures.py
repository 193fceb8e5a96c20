"""Writers for tiny data set files in the real on-disk formats, for tests and offline demos.

Each writer takes images as ``uint8 [N, C, H, W]`` and labels as integers, and writes exactly the layout
the corresponding reader in :mod:`stealkit.data.readers` expects (and the original distributions use).
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

from stealkit.data.readers import CIFAR10_CLASSES, MNIST_FILES, SVHN_FILES

_IDX_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(np.int16): 0x0B,
    np.dtype(np.int32): 0x0C,
    np.dtype(np.float32): 0x0D,
    np.dtype(np.float64): 0x0E,
}


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` encoded as an IDX file (header, then big-endian data)."""
    array = np.asarray(array)
    code = _IDX_CODES[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: str | Path, array: np.ndarray, *, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file; gzip-compressed when ``compress`` (default: name ends in ``.gz``)."""
    path = Path(path)
    data = idx_bytes(array)
    if compress if compress is not None else path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_mnist_dir(
    directory: str | Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    compress: bool = True,
) -> Path:
    """Write the four MNIST-style IDX files (images ``[N, 1, H, W]`` or ``[N, H, W]``) into ``directory``."""
    directory = Path(directory)
    arrays = {
        "train_images": np.asarray(x_train, np.uint8).reshape(len(x_train), *np.shape(x_train)[-2:]),
        "train_labels": np.asarray(y_train, np.uint8),
        "test_images": np.asarray(x_test, np.uint8).reshape(len(x_test), *np.shape(x_test)[-2:]),
        "test_labels": np.asarray(y_test, np.uint8),
    }
    for key, stem in MNIST_FILES.items():
        write_idx(directory / (stem + (".gz" if compress else "")), arrays[key])
    return directory


def _cifar_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint8)
    if x.shape[1:] != (3, 32, 32):
        raise ValueError(f"CIFAR-10 images must be [N, 3, 32, 32], got {x.shape}")
    return x.reshape(len(x), 3 * 32 * 32)  # R plane, G plane, B plane, each row-major


def write_cifar10_python(
    directory: str | Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    meta: bool = True,
) -> Path:
    """Write ``cifar-10-batches-py``-style pickles (protocol 2, bytes keys) into ``directory``.

    The train images are divided over ``data_batch_1`` .. ``data_batch_5`` in order.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(x_train)), 5)
    batches = [
        (f"data_batch_{i + 1}", x_train[idx], np.asarray(y_train)[idx]) for i, idx in enumerate(chunks)
    ]
    for name, x, y in [*batches, ("test_batch", x_test, y_test)]:
        content = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in y],
            b"data": _cifar_rows(x),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(len(x))],
        }
        with open(directory / name, "wb") as fh:
            pickle.dump(content, fh, protocol=2)
    if meta:
        content = {
            b"label_names": [c.encode() for c in CIFAR10_CLASSES],
            b"num_cases_per_batch": 10000,
            b"num_vis": 3072,
        }
        with open(directory / "batches.meta", "wb") as fh:
            pickle.dump(content, fh, protocol=2)
    return directory


def write_cifar10_binary(
    directory: str | Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
) -> Path:
    """Write ``cifar-10-batches-bin``-style files (rows of 1 label byte + 3072 pixel bytes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(x_train)), 5)
    parts = [
        (f"data_batch_{i + 1}.bin", x_train[idx], np.asarray(y_train)[idx]) for i, idx in enumerate(chunks)
    ]
    for name, x, y in [*parts, ("test_batch.bin", x_test, y_test)]:
        rows = np.concatenate([np.asarray(y, np.uint8)[:, None], _cifar_rows(x)], axis=1)
        (directory / name).write_bytes(rows.tobytes())
    (directory / "batches.meta.txt").write_text("\n".join(CIFAR10_CLASSES) + "\n")
    return directory


def write_svhn_dir(
    directory: str | Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
) -> Path:
    """Write ``train_32x32.mat`` / ``test_32x32.mat`` (X ``[H, W, 3, N]``, y ``[N, 1]`` with 10 for digit 0)."""
    from scipy.io import savemat

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for part, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        mat_x = np.ascontiguousarray(np.asarray(x, np.uint8).transpose(2, 3, 1, 0))
        labels = np.asarray(y, np.uint8).copy()
        labels[labels == 0] = 10
        savemat(directory / SVHN_FILES[part], {"X": mat_x, "y": labels.reshape(-1, 1)})
    return directory
