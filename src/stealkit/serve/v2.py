"""The Open Inference Protocol (v2 REST, as KServe, Triton and MLServer speak it) for ``stealkit serve --protocol v2``.

Routes, beside the /v1 API, over the same keys (``Authorization: Bearer KEY``), store, budgets, log, defences,
limits and metrics (a query costs the same through either protocol):

- ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2`` (server metadata), ``GET /v2/models/NAME/ready``:
  no key needed (probes);
- ``GET /v2/models/NAME``: the model's metadata for this key: one input ``input`` FP32 ``[-1, C, H, W]``
  (pixels in [0, 1]), one output per output mode the key may use, named after it (``logits``/``probs``/``topk``
  FP32 ``[-1, K]``, ``label`` INT64 ``[-1]``), platform ``stealkit``, and in ``parameters`` what ``/v1/info``
  says (classes, data set, the key's mode, allowed modes, ``queries_left``, ``max_batch``);
- ``POST /v2/models/NAME/infer``: ``{"id", "inputs": [{"name": "input", "shape": [N, C, H, W], "datatype":
  "FP32"|"FP64"|"FP16", "data": [...]}], "outputs": [{"name": MODE}]}``; without ``outputs`` the key's mode
  answers. At most one output per request (each is one answer, charged one query per image);
- explanations are the second model ``NAME-explain`` (keys with ``explain = true``): the same ``input``, an
  optional ``target`` INT64 ``[N]`` (or ``parameters.target``), ``parameters`` ``method`` (gradient,
  smoothgrad), ``output`` (logit, prob), ``n_samples``, ``sigma``; output ``explanation`` FP32 ``[N, C, H, W]``.

Tensor data is JSON (flat row-major or nested) or the binary tensor extension (``Inference-Header-Content-Length``
and ``parameters.binary_data_size``, what ``tritonclient`` sends by default); a requested output with
``parameters.binary_data`` (or the request's ``binary_data_output``) is answered in binary. Responses carry
``parameters.queries_left`` and the ``X-Stealkit-*`` headers; errors are ``{"error": MESSAGE, "code": ...}`` with
the /v1 status codes (402 budget, 401 key, 413 size, 429 rate, ...). Bodies are bounded as for /v1.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.oracle import OutputMode, check_explain_args
from stealkit.serve import jsonscan, payloads
from stealkit.serve.keys import KeyConfig
from stealkit.serve.service import ApiError, Query, Service, check_finite, check_request_id, parse_target
from stealkit.serve.store import Reservation

INPUT, TARGET, EXPLANATION = "input", "target", "explanation"
EXPLAIN_SUFFIX = "-explain"
HEADER_LENGTH = "inference-header-content-length"
PREDICT_PARAMETERS = frozenset({"binary_data_output"})
EXPLAIN_PARAMETERS = frozenset({"binary_data_output", "method", "output", "n_samples", "sigma", "target"})
NUMPY = {"FP32": "<f4", "FP64": "<f8", "FP16": "<f2", "INT64": "<i8", "INT32": "<i4"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_ID = 128
#: the request document's shape (:data:`stealkit.serve.jsonscan.SCALAR`): a document without it is refused at its
#: first wrong token, whatever follows (junk costs what the prefix read weighs)
_PARAMETERS = {"*": jsonscan.FLAT}
SCHEMA: dict[str, Any] = {
    "id": jsonscan.SCALAR, "parameters": _PARAMETERS,
    "inputs": [{"name": jsonscan.SCALAR, "shape": jsonscan.NUMERIC, "datatype": jsonscan.SCALAR,
                "parameters": _PARAMETERS, "data": jsonscan.NUMERIC}],
    "outputs": [{"name": jsonscan.SCALAR, "parameters": _PARAMETERS}]}


def model_name(model: str | Path, given: str | None = None) -> str:
    """The served model's name: ``given`` (``--model-name``), else the model directory's or file's stem."""
    name = given if given is not None else Path(str(model).split("?", 1)[0].rstrip("/")).stem
    if not NAME.fullmatch(name) or name.endswith(EXPLAIN_SUFFIX):
        raise InputError(f"model name {name!r}: use letters, digits, '.', '_' and '-' (not ending in "
                         f"{EXPLAIN_SUFFIX!r}, the explanation model's suffix); pass --model-name NAME")
    return name


@dataclass(frozen=True)
class Wanted:
    """What a v2 request asks back: its id, the output's name and whether in binary."""

    id: str | None
    output: str
    binary: bool


def _output_type(mode: OutputMode, num_classes: int) -> dict[str, Any]:
    if mode is OutputMode.LABEL:
        return {"name": mode.value, "datatype": "INT64", "shape": [-1]}
    return {"name": mode.value, "datatype": "FP32", "shape": [-1, num_classes]}


def metadata(service: Service, key: KeyConfig, name: str, explain: bool) -> dict[str, Any]:
    image = {"name": INPUT, "datatype": "FP32", "shape": [-1, *service.input_shape]}
    if explain:
        inputs = [image, {"name": TARGET, "datatype": "INT64", "shape": [-1], "optional": True}]
        outputs = [{"name": EXPLANATION, "datatype": "FP32", "shape": [-1, *service.input_shape]}]
    else:
        inputs = [image]
        outputs = [_output_type(m, service.num_classes) for m in key.allowed_modes]
    return {"name": name, "versions": ["1"], "platform": "stealkit", "inputs": inputs, "outputs": outputs,
            "parameters": service.info(key)}


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON part and the binary part of a request (binary tensor extension)."""
    if header_length is None:
        return body, b""
    if not (header_length.isascii() and header_length.isdigit() and len(header_length) <= 18) \
            or int(header_length) > len(body):
        raise InputError(f"Inference-Header-Content-Length {header_length[:40]!r} must be an integer no larger than "
                         f"the body ({len(body)} bytes)")
    n = int(header_length)
    return body[:n], body[n:]


def _tensor(spec: Any, binary: bytes, offset: int, where: str) -> tuple[Any, list[int], str, int]:
    """``(data, shape, datatype, bytes used)`` of one input, its data as a list or a numpy array (binary)."""
    if not isinstance(spec, dict):
        raise InputError(f"{where} must be an object with name, shape, datatype and data")
    shape, dtype = spec.get("shape"), spec.get("datatype")
    if isinstance(shape, np.ndarray) and shape.ndim == 1 and shape.dtype.kind == "i":
        shape = shape.tolist()
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise InputError(f"{where}: shape must be a list of non-negative integers, got {str(shape)[:80]}")
    if not isinstance(dtype, str) or dtype not in NUMPY:
        raise InputError(f"{where}: datatype must be one of {sorted(NUMPY)}, got {str(dtype)[:20]!r}")
    params = _absent_is_empty(spec.get("parameters"))
    if not isinstance(params, dict):
        raise InputError(f"{where}: parameters must be an object")
    size = params.get("binary_data_size")
    if size is None:
        if "data" not in spec:
            raise InputError(f"{where} has no data (nor parameters.binary_data_size)")
        return spec["data"], shape, dtype, 0
    if "data" in spec:
        raise InputError(f"{where} has both data and parameters.binary_data_size; send the tensor one way")
    itemsize = np.dtype(NUMPY[dtype]).itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != math.prod(shape) * itemsize or offset + size > len(binary):
        raise InputError(f"{where}: binary_data_size {size!r} must be {math.prod(shape) * itemsize} bytes "
                         f"({dtype} {shape}) and lie within the body")
    return np.frombuffer(binary, dtype=NUMPY[dtype], count=math.prod(shape), offset=offset), shape, dtype, size


def _array(data: Any, shape: list[int], dtype: str, where: str, binary: bool) -> np.ndarray:
    """The tensor's values as an array of ``shape``: JSON data (flat row-major or nested) must be numbers only
    (no strings, no booleans), integers for an INT datatype; binary data is copied out of the body."""
    if binary:
        return data.reshape(shape).copy()  # a writable copy of the body's bytes
    if isinstance(data, list) and not data and math.prod(shape) == 0:
        data = np.zeros(0)
    if not isinstance(data, np.ndarray):
        raise InputError(f"{where}: data must be a list (flat row-major or nested) of numbers of datatype {dtype}, "
                         "without strings or booleans")
    if dtype.startswith("INT") and data.dtype.kind != "i":
        raise InputError(f"{where}: data of datatype {dtype} must hold integers (no fractions or exponents)")
    if data.size != math.prod(shape):
        raise InputError(f"{where}: data holds {data.size} values, shape {shape} needs {math.prod(shape)}")
    return data.astype(np.float64 if dtype.startswith("FP") else np.int64, copy=False).reshape(shape)


def parse_infer(service: Service, key: KeyConfig, explain: bool, body: bytes,
                header_length: str | None) -> tuple[Query, Wanted]:
    """A v2 inference request as a :class:`Query` (checked like /v1: shape, batch bound, pixel range, mode).
    Raises :class:`InputError` / :class:`ApiError`; charges nothing."""
    head, binary = split_body(body, header_length)
    obj = payloads.parse_json_object(head, schema=SCHEMA)
    request_id = obj.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > MAX_ID):
        raise InputError(f"id must be a string of at most {MAX_ID} characters")
    params = _absent_is_empty(obj.get("parameters"))
    allowed = EXPLAIN_PARAMETERS if explain else PREDICT_PARAMETERS
    if not isinstance(params, dict) or set(params) - allowed:
        raise InputError(f"unknown request parameters {sorted(set(params) - allowed) if isinstance(params, dict) else params}"
                         f"; expected some of {sorted(allowed)}")
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InputError(f'"inputs" must be a list holding the tensor {INPUT!r}')
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    names = (INPUT, TARGET) if explain else (INPUT,)
    for i, spec in enumerate(inputs):
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in names or name in tensors:
            raise InputError(f"inputs[{i}] is named {str(name)[:40]!r}; this model's inputs are {list(names)}, "
                             "each once")
        where = f"input {name!r}"
        data, shape, dtype, used = _tensor(spec, binary, offset, where)
        offset += used
        if name == INPUT:
            if not dtype.startswith("FP"):
                raise InputError(f"{where}: datatype must be FP32, FP64 or FP16 (pixels in [0, 1]), got {dtype}")
            payloads.check_batch(tuple(shape), service.input_shape, service.config.max_batch)
        elif not dtype.startswith("INT") or len(shape) != 1:
            raise InputError(f"{where}: must be INT64 or INT32 of shape [N] (one class per image)")
        tensors[name] = _array(data, shape, dtype, where, binary=used > 0 or "data" not in spec)
    if offset != len(binary):
        raise InputError(f"the body holds {len(binary)} bytes of binary tensor data but the inputs declare {offset}")
    if INPUT not in tensors:
        raise InputError(f"the request has no input {INPUT!r} [N, {', '.join(map(str, service.input_shape))}]")
    x = payloads.images(tensors[INPUT], service.input_shape)
    binary_out = _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
    out_name, binary_out = _wanted_output(obj.get("outputs"), binary_out)
    wanted = Wanted(request_id, out_name or (EXPLANATION if explain else key.mode.value), bool(binary_out))
    if explain:
        if out_name not in (None, EXPLANATION):
            raise InputError(f"unknown output {out_name!r}; the explanation model answers {EXPLANATION!r}")
        args = check_explain_args(params.get("method", "gradient"), params.get("output", "logit"),
                                  params.get("n_samples", 10), params.get("sigma", 0.1))
        target = tensors[TARGET].tolist() if TARGET in tensors else params.get("target")
        return Query("explain", x, key.mode, explain=args,
                     target=parse_target(target, int(x.shape[0]), service.num_classes)), wanted
    if out_name is not None and out_name not in {m.value for m in OutputMode}:
        raise InputError(f"unknown output {out_name!r}; this model's outputs are the output modes "
                         f"{[m.value for m in key.allowed_modes]}")
    return Query("predict", x, service.choose_mode(key, wanted.output)), wanted


def _wanted_output(outputs: Any, binary: Any) -> tuple[str | None, bool]:
    if outputs is None:
        return None, bool(binary)
    if not isinstance(outputs, list) or len(outputs) > 1 or not all(isinstance(o, dict) for o in outputs):
        raise InputError('"outputs" must be a list of at most one {"name": ...}: one answer per request')
    if not outputs:
        return None, bool(binary)
    o = outputs[0]
    params = _absent_is_empty(o.get("parameters"))
    if not isinstance(o.get("name"), str) or not isinstance(params, dict):
        raise InputError('each requested output is {"name": NAME, "parameters": {...}}')
    return o["name"], _flag(params.get("binary_data", binary), "outputs[0].parameters.binary_data")


def _absent_is_empty(value: Any) -> Any:
    """JSON ``null`` for an optional object means no object (``[]``, ``0`` or ``""`` are refused later)."""
    return {} if value is None else value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where} must be true or false, got {str(value)[:40]}")
    return value


def respond(q: Query, wanted: Wanted, name: str, out: torch.Tensor, res: Reservation) -> Response:
    """The v2 inference response (JSON, or JSON + binary tensor), with the budget in parameters and headers."""
    check_finite(out)
    arr = payloads.to_numpy(out)
    arr = arr.astype(np.int64) if arr.dtype.kind in "iu" else arr.astype(np.float32)
    usage = res.usage
    output: dict[str, Any] = {"name": wanted.output, "datatype": "INT64" if arr.dtype.kind == "i" else "FP32",
                              "shape": list(arr.shape)}
    raw = b""
    if wanted.binary:
        raw = np.ascontiguousarray(arr, dtype=NUMPY[output["datatype"]]).tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
    else:
        output["data"] = arr.reshape(-1).tolist()
    doc: dict[str, Any] = {"model_name": name + (EXPLAIN_SUFFIX if q.explain is not None else ""),
                           "model_version": "1", "outputs": [output],
                           "parameters": {"queries_left": usage.left, "cost": q.cost, "mode": wanted.output}}
    if wanted.id is not None:
        doc["id"] = wanted.id
    headers = {"X-Stealkit-N": str(q.n), "X-Stealkit-Cost": str(q.cost),
               "X-Stealkit-Queries-Used": json.dumps(usage.as_dict())}
    if usage.left is not None:
        headers["X-Stealkit-Queries-Left"] = str(usage.left)
    if usage.explain_left is not None:
        headers["X-Stealkit-Explain-Left"] = str(usage.explain_left)
    head = json.dumps(doc, allow_nan=False).encode()
    if wanted.binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
        return Response(head + raw, media_type="application/octet-stream", headers=headers)
    return Response(head, media_type=payloads.JSON, headers=headers)


def endpoint_label(path: str, name: str) -> str | None:
    """The metrics label of a v2 path (the model name templated, so labels stay few)."""
    for model in (name, name + EXPLAIN_SUFFIX):
        prefix = f"/v2/models/{model}"
        if path in (prefix, prefix + "/ready", prefix + "/infer"):
            return path.replace(prefix, "/v2/models/{model}" + (EXPLAIN_SUFFIX if model != name else ""), 1)
    return path if path in ("/v2", "/v2/health/live", "/v2/health/ready") else None


def add_routes(app: FastAPI, service: Service, guarded: Any, name: str) -> None:
    """Add the v2 routes; ``guarded(request, endpoint, handler, v2=True)`` is the app's query path (auth,
    limits, body read, the parse ``handler`` outside any slot, a fair compute slot, the computation, errors)."""
    served = {name: False, name + EXPLAIN_SUFFIX: True}

    def unknown(model: str) -> ApiError:
        return ApiError(404, "unknown_model", f"no model {model[:80]!r}; this server serves {name!r} (and "
                        f"{name + EXPLAIN_SUFFIX!r} for explanations)")

    @app.get("/v2", summary="v2 server metadata")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "stealkit", "version": __version__, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live", summary="v2 liveness")
    async def live() -> dict[str, Any]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="v2 readiness")
    async def ready() -> dict[str, Any]:
        return {"ready": True}

    @app.get("/v2/models/{model}/ready", summary="v2 model readiness")
    async def model_ready(model: str) -> Response:
        if model not in served:
            return unknown(model).response(v2=True)
        return JSONResponse({"name": model, "ready": True})

    @app.get("/v2/models/{model}", summary="v2 model metadata (Authorization: Bearer KEY)")
    async def model_metadata(model: str, request: Request) -> Response:
        try:
            key = service.authenticate(request.headers.get("authorization"), request.client.host
                                       if request.client is not None else "unknown")
            if model not in served:
                raise unknown(model)
            if served[model] and not key.explain:
                raise ApiError(403, "explain_not_allowed", f"this key may not use {model!r} (explain = false)")
            return JSONResponse(await run_in_threadpool(metadata, service, key, name, served[model]))
        except ApiError as exc:
            return exc.response(v2=True)

    @app.post("/v2/models/{model}/infer", summary="v2 inference (Authorization: Bearer KEY)")
    async def infer(model: str, request: Request) -> Response:
        if model not in served:
            return unknown(model).response(v2=True)
        explain = served[model]
        header_length = request.headers.get(HEADER_LENGTH)
        request_id = request.headers.get("idempotency-key")

        def handle(key: KeyConfig, body: bytes) -> Callable[[], Response]:
            """The parse (outside any compute slot); returns the computation."""
            check_request_id(request_id)
            if explain and not key.explain:
                raise ApiError(403, "explain_not_allowed", f"this key may not use {model!r} (explain = false)")
            service.check_blocked(key)
            q, wanted = parse_infer(service, key, explain, body, header_length)
            form = json.dumps(["v2", model, wanted.output, wanted.binary, wanted.id])
            return lambda: service.run(key, q, request_id, lambda out, res: respond(q, wanted, name, out, res), form)

        return await guarded(request, "explain" if explain else "predict", handle, v2=True)
