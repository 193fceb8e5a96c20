"""Reading a ``.npy`` body safely from many threads at once.

numpy parses a ``.npy`` header with :func:`ast.literal_eval`, whose recursion-depth bookkeeping is not safe
across threads in CPython 3.11: two threads parsing at once can fail with "AST constructor recursion depth
mismatch". The server decodes request bodies and the HTTP oracle response bodies in many threads, so every
header is parsed under one lock (a few microseconds); the array data is read outside it.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any

import numpy as np

_HEADER = threading.Lock()


def read_header(body: bytes) -> tuple[tuple[int, ...], bool, Any, int]:
    """``(shape, fortran_order, dtype, data offset)`` of a ``.npy`` body (format 1.0 or 2.0); numpy's errors
    as they are (``ValueError`` and others) for a corrupt header."""
    buf = io.BytesIO(body)
    with _HEADER:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(buf)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(buf)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    return tuple(shape), bool(fortran), dtype, buf.tell()


def read_npy(body: bytes) -> np.ndarray:
    """The array a ``.npy`` body holds, as a writable copy (never unpickled: object dtypes are refused)."""
    shape, fortran, dtype, offset = read_header(body)
    if dtype.hasobject:
        raise ValueError("object arrays are not read (no pickle)")
    count = math.prod(shape)
    if len(body) - offset < count * dtype.itemsize:
        raise ValueError(f"the body holds fewer bytes than its header's {list(shape)} {dtype} array needs")
    flat = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
    arr = flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
    return np.array(arr)
