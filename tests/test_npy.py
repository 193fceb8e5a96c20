"""``.npy`` bodies read from many threads: the header under one lock, the data as numpy writes it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from stealkit.oracle import npy


def _body(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
@pytest.mark.parametrize("fortran", [False, True])
def test_read_npy_equals_numpys_own_reader(dtype: str, fortran: bool) -> None:
    arr = np.arange(2 * 3 * 4 * 5, dtype=dtype).reshape(2, 3, 4, 5)
    arr = np.asfortranarray(arr) if fortran else arr
    got = npy.read_npy(_body(arr))
    assert got.dtype == arr.dtype and np.array_equal(got, arr) and got.flags.writeable


def test_a_short_or_object_body_is_refused() -> None:
    body = _body(np.zeros((4, 1, 2, 2), dtype="float32"))
    with pytest.raises(ValueError, match="fewer bytes"):
        npy.read_npy(body[:-4])
    with pytest.raises(ValueError):
        npy.read_npy(b"\x93NUMPY\x01\x00" + b"\x00" * 8)  # a header that is not one


def test_the_header_is_parsed_under_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's header parser (ast.literal_eval) is not thread-safe in CPython 3.11 ("AST constructor recursion
    depth mismatch" under 16 concurrent clients): every parse holds the module's lock."""
    seen: list[bool] = []
    real = np.lib.format.read_array_header_1_0

    def watched(fp, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(npy._HEADER.locked())
        return real(fp, *a, **k)

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", watched)
    npy.read_npy(_body(np.zeros((1, 1, 2, 2), dtype="float32")))
    assert seen == [True]
