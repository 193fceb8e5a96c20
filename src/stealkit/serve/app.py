"""The prediction and explanation API: a FastAPI app over a saved model, a keys file and a SQLite store.

Endpoints (OpenAPI schema at ``/openapi.json``, docs at ``/docs``):

- ``POST /v1/predict`` -- a batch of images (``.npy`` body, or JSON ``{"inputs": ...}``) answered in the key's
  output mode (or a lower one it allows, via ``?mode=`` or ``"mode"``), with ``queries_left``.
- ``POST /v1/explain`` -- input gradients or SmoothGrad maps (keys with ``explain = true``); a SmoothGrad
  image costs ``n_samples`` explain queries (:func:`~stealkit.oracle.explain_price`).
- ``GET /v1/info`` -- input shape, classes, data set, the key's mode, allowed modes and ``queries_left``.
- ``GET /v1/charges`` -- the key's recent log rows (reserved, answered, refunded), to reconcile a client; a row's
  ``id`` is the key's own sequence number (1, 2, ...; ``?before=ID`` pages back), not the log's global row id,
  which would tell a tenant how many queries the others make.
- ``GET /healthz`` -- liveness; ``GET /metrics`` -- Prometheus text (needs ``Bearer <metrics_key>``).
- with ``protocol="v2"`` (``stealkit serve --protocol v2``), also the Open Inference Protocol's ``/v2/...``
  routes over the same keys, store and budgets (:mod:`stealkit.serve.v2`).

Queries may carry an ``Idempotency-Key`` header: a retry with the same key is answered from the log (the
same bytes) and not charged again. The query path itself is :mod:`stealkit.serve.service`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.oracle import OutputMode
from stealkit.oracle.base import MAX_SMOOTHGRAD_SAMPLES, MAX_SMOOTHGRAD_SIGMA
from stealkit.serve import metrics as prom
from stealkit.serve import payloads
from stealkit.serve.asgi import CountResponses, RefuseAmbiguousFraming, disconnect_watch, read_body
from stealkit.serve.authshare import SharedAuthThrottle
from stealkit.serve.cancel import Cancelled, scope
from stealkit.serve.conn import ENV, fold_repeated_logs, return_freed_memory, trim_memory
from stealkit.serve.keys import KeyConfig, ServerConfig, load_keys
from stealkit.serve.limits import BodyReads, FairScheduler, KeyQuota
from stealkit.serve.service import ApiError, Service, SettleOnSend
from stealkit.serve.store import Store

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/predict", "/v1/explain", "/v1/info", "/v1/charges", "/healthz", "/metrics")
MAX_CHARGES_PAGE = 1000
#: seconds a request body may take to arrive (``stealkit serve --body-timeout``)
BODY_TIMEOUT_S = 30.0
#: after a body this large, the worker hands its freed memory back to the system (at most once a second)
TRIM_AFTER_BYTES = 1 << 20


def _respond(result: dict[str, Any], accept: str | None) -> Response:
    outputs: torch.Tensor = result.pop("outputs")
    arr = payloads.to_numpy(outputs)
    if accept and payloads.NPY in accept:
        headers = {"X-Stealkit-Mode": str(result["mode"]), "X-Stealkit-N": str(result["n"]),
                   "X-Stealkit-Queries-Used": json.dumps(result["queries_used"])}
        if result.get("queries_left") is not None:
            headers["X-Stealkit-Queries-Left"] = str(result["queries_left"])
        if result.get("explain_left") is not None:
            headers["X-Stealkit-Explain-Left"] = str(result["explain_left"])
        return Response(payloads.encode_npy(arr), media_type=payloads.NPY, headers=headers)
    return JSONResponse({**result, "outputs": arr.tolist()})


def _schemas(input_shape: tuple[int, ...], max_batch: int) -> dict[str, Any]:
    """The request bodies the server accepts, as OpenAPI (so schema-driven clients generate valid ones)."""
    shape = "[B][" + "][".join(map(str, input_shape)) + "]"
    leaf: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
    for i, side in enumerate(reversed(input_shape)):
        leaf = {"type": "array", "minItems": side, "maxItems": side, "items": leaf}
        if i == len(input_shape) - 1:
            leaf["description"] = f"one image: nested {'x'.join(map(str, input_shape))} pixels in [0, 1]"
    inputs = {"type": "array", "minItems": 1, "maxItems": max_batch, "items": leaf,
              "description": f"a batch {shape} of 1 to {max_batch} images, pixels in [0, 1]"}
    npy = {"type": "string", "format": "binary",
           "description": f"a .npy float array [B, {', '.join(map(str, input_shape))}] (numpy.save), "
                          f"1 <= B <= {max_batch}; options in the query string"}
    predict = {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "inputs": inputs, "mode": {"type": "string", "enum": [m.value for m in OutputMode]}}}
    explain = {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "inputs": inputs,
        "method": {"type": "string", "enum": ["gradient", "smoothgrad"]},
        "output": {"type": "string", "enum": ["logit", "prob"]},
        "target": {"oneOf": [{"type": "integer", "minimum": 0},
                             {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}]},
        "n_samples": {"type": "integer", "minimum": 1, "maximum": MAX_SMOOTHGRAD_SAMPLES},
        "sigma": {"type": "number", "minimum": 0, "maximum": MAX_SMOOTHGRAD_SIGMA}}}
    return {name: {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema}, payloads.NPY: {"schema": npy}}}}
        for name, schema in (("predict", predict), ("explain", explain))}


_ERRORS = {s: {"description": d} for s, d in (
    (400, "malformed input"), (401, "missing or unknown key"), (402, "budget exhausted"),
    (403, "not allowed for this key, or blocked"), (409, "this Idempotency-Key is being answered"),
    (413, "body or batch too large"), (415, "unsupported Content-Type"), (429, "rate limited"),
    (500, "the answer could not be produced (not charged)"), (503, "busy; retry"))}


def _refund_unsent(response: Any) -> Any:
    """An answer computed just as its client left (after the stop was asked): its charge is refunded."""
    if isinstance(response, SettleOnSend):
        return run_in_threadpool(response.refund, "not delivered: the client disconnected before the answer was sent")
    return None


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def check_explain_keys(spec: Any, config: ServerConfig, model: str | Path) -> None:
    """Refuse, before serving, keys with ``explain = true`` on a model without gradients (ONNX)."""
    from stealkit.models.locate import has_gradients

    explainers = [k.key_id for k in config.keys.values() if k.explain]
    if explainers and not has_gradients(spec):
        raise InputError(f"{model} is ONNX: onnxruntime gives no gradients, so it cannot explain; set explain = false "
                         f"for key(s) {', '.join(explainers)} or serve a TorchScript file or model directory")


def create_app(model_dir: str | Path, keys: str | Path | ServerConfig, db: str | Path, *, workers: int = 1,
               device: str = "cpu", max_inflight: int = 64, compute_slots: int = 4, protocol: str = "v1",
               model_name: str | None = None, body_timeout: float = BODY_TIMEOUT_S) -> FastAPI:
    """Build the API over a saved model directory, a keys file (or parsed config) and a SQLite file.

    ``protocol="v2"`` adds the Open Inference Protocol routes (:mod:`stealkit.serve.v2`) beside /v1, serving the
    model as ``model_name`` (default: the model directory's or file's stem).

    ``max_inflight`` bounds the requests a worker holds at once (body reads included; more are answered 503),
    a quarter of it for one key (more are answered 429, before the body is read), so a few hostile keys cannot
    fill it; body reads are bounded apart, at half of it, with a quarter of those kept for keys reading no
    body (:class:`~stealkit.serve.limits.BodyReads`), so keys that trickle bodies leave room for the others; ``body_timeout`` is the seconds a request's body may take to arrive (408 and the connection closed
    after); ``compute_slots`` bounds the model computations it runs at once, shared fairly between keys.
    """
    from stealkit.models.locate import load_any_model
    from stealkit.serve import v2 as v2_routes

    if protocol not in ("v1", "v2"):
        raise InputError(f"protocol must be v1 or v2, got {protocol!r}")
    name = v2_routes.model_name(model_dir, model_name)
    model, spec = load_any_model(model_dir, device=device)
    model.eval()
    config = keys if isinstance(keys, ServerConfig) else load_keys(keys)
    check_explain_keys(spec, config, model_dir)
    store = Store(db)
    service = Service(model=model, spec=spec, config=config, store=store, workers=max(1, workers), device=device,
                      auth_throttle=SharedAuthThrottle(store.path))  # failed keys counted across workers
    docs = _schemas(service.input_shape, config.max_batch)
    app = FastAPI(title="stealkit prediction API", version=__version__,
                  description="A classifier behind a pay-per-query API, as in the model-extraction threat model.")
    app.state.service = service
    inflight = app.state.inflight = threading.BoundedSemaphore(max_inflight)
    quota = app.state.quota = KeyQuota(max(1, max_inflight // 4))  # a few keys never hold the whole bound
    body_reads = app.state.body_reads = BodyReads(max(1, max_inflight // 2))  # bodies that trickle neither
    scheduler = app.state.scheduler = FairScheduler(compute_slots)

    def endpoint_of(path: str) -> str:
        return path if path in ENDPOINTS else (protocol == "v2" and v2_routes.endpoint_label(path, name)) or "other"

    app.add_middleware(RefuseAmbiguousFraming)
    app.add_middleware(CountResponses, observe=service.metrics.observe, endpoint_of=endpoint_of)  # outermost

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        detail = f"no endpoint {request.method} {request.url.path}; see /openapi.json for {list(ENDPOINTS)}" \
            if exc.status_code in (404, 405) else str(exc.detail)
        v2_path = protocol == "v2" and request.url.path.startswith("/v2")
        if protocol == "v2" and exc.status_code in (404, 405):
            detail += f" and the v2 routes under /v2/models/{name}"
        doc = {"error": detail, "code": code} if v2_path else {"error": code, "detail": detail}
        return JSONResponse(doc, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "bad_input", "detail": str(exc.errors())[:500]}, status_code=400)

    async def guarded(request: Request, endpoint: str, handler: Any = None, *, v2: bool = False) -> Response:
        """The query path of both protocols: key, request rate, in-flight bounds, body, then in the thread pool
        ``handler(key, body)`` (the parse, default: the /v1 query's; it returns the computation), a fair compute
        slot, the computation in the thread pool; errors as one answer. A client that leaves stops the step it
        is in (the parse and the computation at their next check, :mod:`stealkit.serve.cancel`)."""
        key: KeyConfig | None = None
        try:
            key = service.authenticate(request.headers.get("authorization"), _client(request))
            if not service.known_retry(key, request.headers.get("idempotency-key")):
                service.rate_limit(key, "requests", 1)  # a retry of a kept answer is replayed whatever these say
                service.check_budget(key)
            if not quota.try_acquire(key.key_id):
                raise ApiError(429, "too_many_in_flight", f"this key already has {quota.per_key} requests in flight; "
                               "wait for some to finish", {"Retry-After": "1"})
            if not inflight.acquire(blocking=False):
                quota.release(key.key_id)
                raise ApiError(503, "busy", "the server is busy; retry shortly", {"Retry-After": "1"})
            try:
                ctype = request.headers.get("content-type")
                if not body_reads.try_acquire(key.key_id):
                    raise ApiError(503, "busy", "the server is reading too many request bodies; retry shortly",
                                   {"Retry-After": "1"})
                try:
                    body = await read_body(request, service.body_limit(ctype), body_timeout)
                finally:
                    body_reads.release(key.key_id)
                prepare = handler or (lambda k, b: service.prepare(
                    k, endpoint, b, ctype, dict(request.query_params), request.headers.get("accept"),
                    request.headers.get("idempotency-key")))
                gone, response, cancel = disconnect_watch(request), None, threading.Event()
                try:  # the parse holds no compute slot; each step stops when the client leaves
                    compute = await gone.unless_gone(run_in_threadpool(scope, cancel, prepare, key, body), cancel)
                    del body
                    await gone.unless_gone(scheduler.acquire(key.key_id),
                                           undo=lambda _: scheduler.release(key.key_id))
                    try:
                        response = await gone.unless_gone(run_in_threadpool(scope, cancel, compute), cancel,
                                                          undo=_refund_unsent)
                    finally:
                        scheduler.release(key.key_id)
                finally:
                    if isinstance(response, SettleOnSend):
                        response.client_gone = gone  # asked just before the answer is sent
                    else:
                        gone.stop()
                return response
            finally:
                inflight.release()
                quota.release(key.key_id)
                declared = request.headers.get("content-length", "")
                if declared.isascii() and declared.isdigit() and len(declared) >= 7 \
                        and int(declared) >= TRIM_AFTER_BYTES:
                    asyncio.get_running_loop().call_later(1.0, trim_memory)
        except (ClientDisconnect, Cancelled):
            return Response(status_code=400)  # nobody reads it; nothing was charged (or it was refunded)
        except payloads.UnsupportedMedia as exc:
            error = ApiError(415, "unsupported_media_type", str(exc))
        except payloads.TooLarge as exc:
            error = ApiError(413, "too_large", str(exc))
        except InputError as exc:
            error = ApiError(400, "bad_input", str(exc))
        except sqlite3.OperationalError as exc:
            log.warning("database busy: %s", exc)
            error = ApiError(503, "busy", "the query database is busy; retry shortly", {"Retry-After": "1"})
        except ApiError as exc:
            error = exc
        except Exception as exc:  # a bug: one line to the client (not a reset connection), the traceback logged
            log.error("unexpected error answering %s %s: %r", request.method, request.url.path, exc, exc_info=True)
            error = ApiError(500, "internal_error", "the request could not be handled; it was not charged")
        if error.status < 500:
            service.metrics.refuse(key.key_id if key is not None else "-", error.code)
        return error.response(v2=v2)

    @app.post("/v1/predict", openapi_extra=docs["predict"], responses=_ERRORS,
              summary="Classify a batch of images in the key's output mode")
    async def predict(request: Request) -> Response:
        return await guarded(request, "predict")

    @app.post("/v1/explain", openapi_extra=docs["explain"], responses=_ERRORS,
              summary="Input gradients or SmoothGrad maps for a batch of images")
    async def explain(request: Request) -> Response:
        return await guarded(request, "explain")

    @app.get("/v1/info", responses={401: _ERRORS[401]}, summary="The model's interface and this key's budget")
    async def info(request: Request) -> Response:
        try:
            key = service.authenticate(request.headers.get("authorization"), _client(request))
            return JSONResponse(await run_in_threadpool(service.info, key))
        except ApiError as exc:
            return exc.response()

    @app.get("/v1/charges", responses={401: _ERRORS[401]},
             summary="This key's recent charges (newest last): reserved, answered or refunded")
    async def charges(request: Request, limit: int = 100, before: int | None = None) -> Response:
        try:
            key = service.authenticate(request.headers.get("authorization"), _client(request))
            if not 1 <= limit <= MAX_CHARGES_PAGE:
                raise ApiError(400, "bad_input", f"limit must lie in [1, {MAX_CHARGES_PAGE}]")
            if before is not None and not 1 <= before <= 2**62:
                raise ApiError(400, "bad_input", "before must be a charge id (a positive integer)")
            rows = await run_in_threadpool(service.store.log_rows, key.key_id, limit=limit, before_seq=before)
            usage = await run_in_threadpool(service.store.usage, key.key_id)
            return JSONResponse({"key": key.key_id, "queries_used": usage.as_dict(), "queries_left": usage.left,
                                 "charges": [{"id": r["seq"]} | {k: r[k] for k in ("time", "kind", "n", "mode",
                                                                                  "status", "request_id", "note")}
                                             for r in rows]})
        except ApiError as exc:
            return exc.response()

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "pid": os.getpid(), "version": __version__}

    @app.get("/metrics", summary="Prometheus metrics (Authorization: Bearer <metrics_key>)")
    async def metrics(request: Request) -> Response:
        try:
            header = request.headers.get("authorization") or ""
            scheme, _, token = header.strip().partition(" ")
            if config.metrics_digest is None:
                raise ApiError(403, "metrics_disabled", "metrics are off: set metrics_key in the keys file's [model] "
                               "table and scrape with 'Authorization: Bearer <metrics_key>'")
            wait = service.auth_throttle.blocked_for(_client(request))
            if wait > 0:
                raise ApiError(429, "auth_throttled", "too many failed keys from this address; retry later",
                               {"Retry-After": str(max(1, int(wait)))})
            if scheme.lower() != "bearer" or not config.is_metrics_key(token.strip()):
                service.auth_throttle.failed(_client(request))
                raise ApiError(401, "unauthorized", "/metrics needs 'Authorization: Bearer <metrics_key>'",
                               {"WWW-Authenticate": "Bearer"})
        except ApiError as exc:
            return exc.response()
        text = await run_in_threadpool(service.metrics.render, service.store.all_usage)
        return Response(text, media_type=prom.CONTENT_TYPE)

    if protocol == "v2":
        v2_routes.add_routes(app, service, guarded, name)
    return app


def app_from_env() -> FastAPI:
    """The uvicorn factory (``stealkit.serve.app:app_from_env``) used by ``stealkit serve``'s workers."""
    from stealkit.serve.lifeline import exit_with_parent

    cfg = json.loads(os.environ[ENV])
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fold_repeated_logs()
    return_freed_memory()
    if cfg.get("supervisor_pid"):
        exit_with_parent(int(cfg["supervisor_pid"]))
    return create_app(cfg["model"], cfg["keys"], cfg["db"], workers=int(cfg.get("workers", 1)),
                      device=cfg.get("device", "cpu"), max_inflight=int(cfg.get("max_inflight", 64)),
                      compute_slots=int(cfg.get("compute_slots", 4)), protocol=cfg.get("protocol", "v1"),
                      model_name=cfg.get("model_name"), body_timeout=float(cfg.get("body_timeout", BODY_TIMEOUT_S)))


__all__ = ["ApiError", "Service", "app_from_env", "create_app"]
