"""Request and response bodies of the HTTP API: ``.npy`` (binary, for real batches) and JSON (small ones).

Requests: ``Content-Type: application/x-npy`` with a float array ``[B, C, H, W]`` (never unpickled:
``allow_pickle=False``), options in the query string; or ``application/json`` with
``{"inputs": [[[[...]]]], "mode": ..., ...}``. Every malformed body becomes an :class:`InputError` that says
what is wrong; the caller turns it into a 4xx answer before anything is charged.

Responses: JSON ``{"mode", "outputs", "queries_left", ...}`` by default, or, when the client sends
``Accept: application/x-npy``, the outputs as an ``.npy`` body with the other fields in ``X-Stealkit-*``
headers (what :class:`~stealkit.oracle.http.HttpOracle` uses).
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import torch

from stealkit.errors import InputError
from stealkit.oracle import validate_images
from stealkit.serve import jsonscan

NPY = "application/x-npy"
JSON = "application/json"


def content_kind(content_type: str | None) -> str:
    """``"npy"`` or ``"json"`` from a Content-Type header; anything else is refused (415)."""
    ct = (content_type or "").split(";")[0].strip().lower()
    if ct in (NPY, "application/octet-stream", "application/npy"):
        return "npy"
    if ct in (JSON, ""):
        return "json"
    raise UnsupportedMedia(f"unsupported Content-Type {content_type!r}; send {NPY} (a .npy array) or {JSON}")


class UnsupportedMedia(InputError):
    """The request body's media type is neither .npy nor JSON."""


class TooLarge(InputError):
    """The request body or batch exceeds the server's limit."""


def decode_npy(body: bytes, input_shape: tuple[int, ...], *, max_batch: int) -> torch.Tensor:
    """Parse a ``.npy`` body into validated float32 images (refusing pickles, wrong dtypes and shapes)."""
    if not body:
        raise InputError("empty request body; send a .npy array of shape [B, C, H, W]")
    if not body.startswith(b"\x93NUMPY"):
        raise InputError("the body is not a .npy file (it lacks the \\x93NUMPY magic); write it with numpy.save")
    from stealkit.oracle.npy import read_header, read_npy

    try:
        shape, _, dtype, _ = read_header(body)  # under a lock: numpy's header parser is not thread-safe
    except Exception as exc:  # noqa: BLE001 - numpy raises many types on a corrupt header
        raise InputError(f"the .npy header is malformed: {exc}") from None
    check_batch(shape, input_shape, max_batch)
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
        raise InputError(f"inputs must be float16/32/64 pixels in [0, 1], got dtype {dtype}; divide by 255 first")
    try:
        arr = read_npy(body)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"the .npy body could not be read: {exc}") from None
    return images(arr, input_shape)


def decode_json(body: bytes | bytearray, input_shape: tuple[int, ...], *, max_batch: int,
                fields: frozenset[str] | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Parse ``{"inputs": ..., options...}``; returns the images and the other fields. A field outside
    ``fields`` (plus ``inputs``) is refused before any later value is parsed; the pixels are read without a
    Python object per number (:mod:`stealkit.serve.jsonscan`)."""
    obj = parse_json_object(body, None if fields is None else fields | {"inputs"}, numeric=frozenset({"inputs"}),
                            flat=True)  # the /v1 schema: every member a scalar or an array of numbers
    if "inputs" not in obj:
        raise InputError('the JSON body needs "inputs": a nested list [B][C][H][W] of pixels in [0, 1]')
    inputs = obj.pop("inputs")
    shape_hint = f"[B][{']['.join(map(str, input_shape))}]"
    if isinstance(inputs, list) and not inputs:
        raise InputError("inputs is an empty batch; send at least one image")
    if not isinstance(inputs, np.ndarray):
        raise InputError(f'"inputs" must be a nested list {shape_hint} of numbers (pixels in [0, 1]), got '
                         f"{type(inputs).__name__ if not isinstance(inputs, list) else 'a list of non-numbers'}")
    check_batch(inputs.shape, input_shape, max_batch)
    return images(inputs.astype(np.float64, copy=False), input_shape), obj


def parse_json_object(body: bytes | bytearray, fields: frozenset[str] | None = None, *,
                      numeric: frozenset[str] = frozenset(), flat: bool = False,
                      schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse a JSON object, refusing a name outside ``fields`` before its value is parsed (so a body padded
    with a huge unknown array costs nothing). ``fields=None`` accepts any name; ``schema`` describes the whole
    document instead (:data:`stealkit.serve.jsonscan.SCALAR`). Arrays of numbers come back as numpy arrays
    (:func:`stealkit.serve.jsonscan.loads`)."""
    if not body:
        return {}
    obj = jsonscan.loads(body, fields=fields, numeric=numeric, flat=flat, schema=schema)
    if not isinstance(obj, dict):
        raise InputError("the JSON body must be an object like {\"inputs\": [...]}")
    return obj


def check_batch(shape: tuple[int, ...], input_shape: tuple[int, ...], max_batch: int) -> None:
    if len(shape) != len(input_shape) + 1 or tuple(shape[1:]) != tuple(input_shape):
        raise InputError(f"inputs must have shape [B, {', '.join(map(str, input_shape))}], got {list(shape)}")
    if shape[0] == 0:
        raise InputError("inputs is an empty batch; send at least one image")
    if shape[0] > max_batch:
        raise TooLarge(f"a request may hold at most {max_batch} images, got {shape[0]}; split the batch")


def images(arr: np.ndarray, input_shape: tuple[int, ...]) -> torch.Tensor:
    if arr.dtype.kind != "f":
        raise InputError(f"inputs must be floating point pixels in [0, 1], got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32) if arr.dtype != np.float32 or not arr.dtype.isnative \
        else np.ascontiguousarray(arr)
    return validate_images(arr, input_shape)


def query_options(params: dict[str, Any]) -> dict[str, Any]:
    """Coerce query-string options (strings) for the explain endpoint: numbers where numbers are meant."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k in ("n_samples", "target"):
            out[k] = _int(v, k)
        elif k == "sigma":
            out[k] = _float(v, k)
        else:
            out[k] = v
    return out


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool):
        raise InputError(f"{name} must be an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    raise InputError(f"{name} must be an integer, got {v!r}")


def _float(v: Any, name: str) -> float:
    if isinstance(v, bool):
        raise InputError(f"{name} must be a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise InputError(f"{name} must be finite, got {v!r}")
    return f


def encode_npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
