"""File readers on tiny fixture files written into tmp_path: IDX, CIFAR-10 (python and binary), SVHN."""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stealkit.data import UnsafePickleError, load_data_pickle, read_cifar10, read_idx, read_mnist, read_svhn
from stealkit.data.fixtures import (
    idx_bytes,
    write_cifar10_binary,
    write_cifar10_python,
    write_idx,
    write_mnist_dir,
    write_svhn_dir,
)
from stealkit.errors import DataNotFoundError, InputError, UnsafeFileError


def _images(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


# ------------------------------------------------------------------------------------------------ IDX


def test_idx_header_layout_is_big_endian() -> None:
    data = idx_bytes(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8))
    assert data[:4] == b"\x00\x00\x08\x02"
    assert data[4:12] == b"\x00\x00\x00\x02\x00\x00\x00\x03"
    assert data[12:] == bytes([1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("name", ["raw-idx3-ubyte", "gz-idx3-ubyte.gz"])
def test_read_idx_raw_and_gzip(tmp_path, name: str) -> None:
    images = _images(7, (5, 4))
    path = write_idx(tmp_path / name, images)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    out = read_idx(path)
    assert out.dtype == np.uint8 and out.shape == (7, 5, 4)
    np.testing.assert_array_equal(out, images)
    out[0, 0, 0] = 1  # writable, native order


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_read_idx_other_dtypes_come_back_native(tmp_path, dtype) -> None:
    values = (np.arange(12).reshape(3, 4) - 5).astype(dtype)
    out = read_idx(write_idx(tmp_path / "a.idx", values))
    assert out.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(out, values)


def test_read_idx_detects_gzip_by_content_not_name(tmp_path) -> None:
    labels = np.arange(10, dtype=np.uint8)
    path = tmp_path / "labels-idx1-ubyte"  # no .gz suffix, gzip content
    path.write_bytes(gzip.compress(idx_bytes(labels)))
    np.testing.assert_array_equal(read_idx(path), labels)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not an IDX file"),
        (b"\x01\x02\x08\x01\x00\x00\x00\x02\x05\x06", "not an IDX file"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x05", "dtype code"),
        (b"\x00\x00\x08\x00", "zero dimensions"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x02", "header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "truncated"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x01\x01\x02", "unexpected bytes"),
    ],
)
def test_read_idx_malformed_raises_input_error(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "bad-idx-ubyte"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_idx(path)


def test_read_idx_truncated_images_and_gzip(tmp_path) -> None:
    full = idx_bytes(_images(10, (28, 28)))
    cut = tmp_path / "cut-idx3-ubyte"
    cut.write_bytes(full[:-100])
    with pytest.raises(InputError, match="truncated"):
        read_idx(cut)
    cut_gz = tmp_path / "cut-idx3-ubyte.gz"
    cut_gz.write_bytes(gzip.compress(full)[:-50])
    with pytest.raises(InputError, match="gzip"):
        read_idx(cut_gz)


def test_read_idx_missing_file(tmp_path) -> None:
    with pytest.raises(DataNotFoundError, match="does not exist"):
        read_idx(tmp_path / "nope")


@pytest.mark.parametrize("compress", [True, False])
def test_read_mnist_dir(tmp_path, compress: bool) -> None:
    x_train, x_test = _images(12, (1, 6, 5)), _images(4, (1, 6, 5), seed=1)
    y_train, y_test = np.arange(12) % 10, np.arange(4)
    write_mnist_dir(tmp_path, x_train, y_train, x_test, y_test, compress=compress)
    xa, ya, xb, yb = read_mnist(tmp_path)
    assert xa.shape == (12, 1, 6, 5) and ya.dtype == np.int64
    np.testing.assert_array_equal(xa, x_train)
    np.testing.assert_array_equal(ya, y_train)
    np.testing.assert_array_equal(xb, x_test)
    np.testing.assert_array_equal(yb, y_test)


def test_read_mnist_mismatched_counts(tmp_path) -> None:
    write_mnist_dir(tmp_path, _images(5, (1, 4, 4)), np.arange(5), _images(3, (1, 4, 4)), np.arange(3))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(2, dtype=np.uint8))
    with pytest.raises(InputError, match="3 images but .* 2 labels"):
        read_mnist(tmp_path)


def test_read_mnist_missing_files(tmp_path) -> None:
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte"):
        read_mnist(tmp_path)


# ------------------------------------------------------------------------------------------- CIFAR-10


def _cifar_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return _images(10, (3, 32, 32)), np.arange(10) % 10, _images(3, (3, 32, 32), seed=2), np.array([3, 1, 4])


def test_cifar_python_batch_layout(tmp_path) -> None:
    """A row is 1024 red, 1024 green, 1024 blue bytes, each plane row-major, as CIFAR documents."""
    x_train, y_train, x_test, y_test = _cifar_arrays()
    folder = write_cifar10_python(tmp_path / "cifar-10-batches-py", x_train, y_train, x_test, y_test)
    with open(folder / "data_batch_1", "rb") as fh:
        batch = pickle.load(fh, encoding="bytes")  # our own trusted fixture; checks the writer's layout
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (2, 3072)
    assert batch[b"data"][0, 1024 + 32 * 5 + 7] == x_train[0, 1, 5, 7]

    for where in (folder, tmp_path):  # the batches folder or its parent
        xa, ya, xb, yb, classes = read_cifar10(where)
        np.testing.assert_array_equal(xa, x_train)
        np.testing.assert_array_equal(ya, y_train)
        np.testing.assert_array_equal(xb, x_test)
        np.testing.assert_array_equal(yb, y_test)
        assert classes[0] == "airplane" and len(classes) == 10


def test_cifar_python_without_meta_uses_standard_names(tmp_path) -> None:
    write_cifar10_python(tmp_path, *_cifar_arrays(), meta=False)
    assert read_cifar10(tmp_path)[4][-1] == "truck"


def test_cifar_python2_pickle_names_are_accepted(tmp_path) -> None:
    """Files pickled under numpy 1 / Python 2 name ``numpy.core.multiarray._reconstruct``."""
    write_cifar10_python(tmp_path, *_cifar_arrays())
    path = tmp_path / "data_batch_1"
    legacy = path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in legacy
    path.write_bytes(legacy)
    assert read_cifar10(tmp_path)[0].shape == (10, 3, 32, 32)


def test_cifar_binary_version(tmp_path) -> None:
    x_train, y_train, x_test, y_test = _cifar_arrays()
    write_cifar10_binary(tmp_path / "cifar-10-batches-bin", x_train, y_train, x_test, y_test)
    xa, ya, xb, yb, classes = read_cifar10(tmp_path)
    np.testing.assert_array_equal(xa, x_train)
    np.testing.assert_array_equal(ya, y_train)
    np.testing.assert_array_equal(xb, x_test)
    np.testing.assert_array_equal(yb, y_test)
    assert classes[1] == "automobile"


def test_cifar_binary_truncated(tmp_path) -> None:
    write_cifar10_binary(tmp_path, *_cifar_arrays())
    path = tmp_path / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(InputError, match="truncated"):
        read_cifar10(tmp_path)


def test_cifar_missing_batch(tmp_path) -> None:
    write_cifar10_python(tmp_path, *_cifar_arrays())
    (tmp_path / "data_batch_4").unlink()
    with pytest.raises(DataNotFoundError, match="data_batch_1..5"):
        read_cifar10(tmp_path)


def test_cifar_wrong_content(tmp_path) -> None:
    write_cifar10_python(tmp_path, *_cifar_arrays())
    with open(tmp_path / "data_batch_2", "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, fh, protocol=2)
    with pytest.raises(InputError, match="uint8 \\[N, 3072\\]"):
        read_cifar10(tmp_path)
    with open(tmp_path / "data_batch_2", "wb") as fh:
        pickle.dump([1, 2, 3], fh, protocol=2)
    with pytest.raises(InputError, match="not a CIFAR-10 python batch"):
        read_cifar10(tmp_path)
    (tmp_path / "data_batch_2").write_bytes(b"garbage")
    with pytest.raises(InputError, match="not a readable pickle"):
        read_cifar10(tmp_path)


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_cifar_batch_is_refused_without_running(tmp_path) -> None:
    write_cifar10_python(tmp_path, *_cifar_arrays())
    marker = tmp_path / "pwned"
    with open(tmp_path / "data_batch_3", "wb") as fh:
        pickle.dump({b"data": _Exploit(str(marker)), b"labels": [0]}, fh, protocol=2)
    with pytest.raises(UnsafePickleError, match="system") as info:
        read_cifar10(tmp_path)
    assert isinstance(info.value, InputError) and isinstance(info.value, UnsafeFileError)
    assert "data_batch_3" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [eval, getattr, pickle.loads, _Exploit])
def test_restricted_unpickler_refuses_other_globals(tmp_path, payload) -> None:
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({b"f": payload}, protocol=2))
    with pytest.raises(UnsafePickleError):
        load_data_pickle(path)


def test_restricted_unpickler_round_trips_plain_data(tmp_path) -> None:
    content = {b"a": [1, 2.5, "s", b"b", (3,)], "arr": np.arange(6, dtype=np.int32).reshape(2, 3), "e": b""}
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pkl"
        path.write_bytes(pickle.dumps(content, protocol=protocol))
        out = load_data_pickle(path)
        assert out[b"a"] == content[b"a"] and out["e"] == b""
        np.testing.assert_array_equal(out["arr"], content["arr"])


# ----------------------------------------------------------------------------------------------- SVHN


def test_svhn_mat_round_trip_and_label_ten_is_zero(tmp_path) -> None:
    x_train, x_test = _images(6, (3, 32, 32)), _images(2, (3, 32, 32), seed=3)
    y_train, y_test = np.array([0, 1, 2, 9, 0, 5]), np.array([0, 7])
    write_svhn_dir(tmp_path, x_train, y_train, x_test, y_test)
    from scipy.io import loadmat

    raw = loadmat(tmp_path / "train_32x32.mat")
    assert raw["X"].shape == (32, 32, 3, 6) and raw["y"].reshape(-1).tolist() == [10, 1, 2, 9, 10, 5]
    xa, ya, xb, yb, classes = read_svhn(tmp_path)
    np.testing.assert_array_equal(xa, x_train)
    np.testing.assert_array_equal(ya, y_train)
    np.testing.assert_array_equal(xb, x_test)
    np.testing.assert_array_equal(yb, y_test)
    assert classes == tuple("0123456789")


def test_svhn_damaged_and_missing(tmp_path) -> None:
    with pytest.raises(DataNotFoundError, match="train_32x32.mat"):
        read_svhn(tmp_path)
    write_svhn_dir(tmp_path, _images(2, (3, 32, 32)), [1, 2], _images(1, (3, 32, 32)), [3])
    (tmp_path / "test_32x32.mat").write_bytes(b"not a mat file at all" * 20)
    with pytest.raises(InputError, match="test_32x32.mat"):
        read_svhn(tmp_path)


# ------------------------------------------------------------------------------ robustness (hypothesis)

_ROBUST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_ROBUST
@given(cut=st.integers(min_value=0, max_value=4 + 4 * 3 + 2 * 5 * 4 - 1), compress=st.booleans())
def test_any_truncated_idx_raises_input_error(tmp_path, cut: int, compress: bool) -> None:
    full = idx_bytes(_images(2, (5, 4)))
    path = tmp_path / "t-idx3-ubyte"
    path.write_bytes(gzip.compress(full[:cut]) if compress else full[:cut])
    with pytest.raises(InputError):
        read_idx(path)


@_ROBUST
@given(position=st.integers(min_value=0, max_value=4 + 4 * 2 + 12 - 1), value=st.integers(0, 255))
def test_corrupted_idx_reads_or_raises_input_error(tmp_path, position: int, value: int) -> None:
    data = bytearray(idx_bytes(_images(3, (2, 2))))
    data[position] = value
    path = tmp_path / "c-idx3-ubyte"
    path.write_bytes(bytes(data))
    try:
        out = read_idx(path)
    except InputError:
        return
    assert out.size * out.itemsize == len(data) - 4 - 4 * out.ndim


@_ROBUST
@given(data=st.binary(max_size=200))
def test_random_bytes_never_unpickle_to_anything_but_input_error(tmp_path, data: bytes) -> None:
    path = tmp_path / "random.pkl"
    path.write_bytes(data)
    with contextlib.suppress(InputError):  # a few random strings are valid pickles of plain values
        load_data_pickle(path)


@_ROBUST
@given(cut=st.integers(min_value=0, max_value=2000))
def test_truncated_cifar_pickle_raises_input_error(tmp_path, cut: int) -> None:
    content = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [1]}, protocol=2)
    path = tmp_path / "cut.pkl"
    path.write_bytes(content[: min(cut, len(content) - 1)])
    with pytest.raises(InputError):
        load_data_pickle(path)
