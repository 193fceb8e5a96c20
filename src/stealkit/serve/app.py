"""The prediction and explanation API: a FastAPI app over a saved model, a keys file and a SQLite store.

Endpoints (OpenAPI schema at ``/openapi.json``, docs at ``/docs``):

- ``POST /v1/predict`` -- a batch of images (``.npy`` body, or JSON ``{"inputs": ...}``) answered in the key's
  output mode (or a lower one it allows, via ``?mode=`` or ``"mode"``), with ``queries_left``.
- ``POST /v1/explain`` -- input gradients or SmoothGrad maps (keys with ``explain = true``).
- ``GET /v1/info`` -- input shape, classes, data set, the key's mode, allowed modes and ``queries_left``.
- ``GET /healthz`` -- liveness; ``GET /metrics`` -- Prometheus text.

Order of checks for a query: key (401), request rate (429), body size (413), blocked by PRADA (403), body
(400/415), mode (400/403), image rate (429), budget (402), then the answer is computed, charged and logged
in one transaction (402 if a concurrent request took the budget meanwhile) and sent. Nothing refused is
charged. Answers are computed exactly as :class:`~stealkit.oracle.LocalOracle` computes them (same code,
same chunking), so an attack gets the same numbers over HTTP as in process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from stealkit import __version__
from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import LocalExplanationOracle, OutputMode
from stealkit.oracle.ledger import digest_tensor
from stealkit.serve import payloads
from stealkit.serve.detection import Prada
from stealkit.serve.keys import KeyConfig, ServerConfig, load_keys
from stealkit.serve.metrics import Metrics
from stealkit.serve.store import Store

log = logging.getLogger(__name__)

API_VERSION = "v1"
ENDPOINTS = ("/v1/predict", "/v1/explain", "/v1/info", "/healthz", "/metrics")
MAX_SMOOTHGRAD_SAMPLES = 256
ENV = "STEALKIT_SERVE_CONFIG"


class ApiError(Exception):
    """An answer other than 200: status, a short code and a message saying what to do."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "detail": self.message, **self.extra}, status_code=self.status,
                            headers=self.headers)


class TokenBucket:
    """``rate`` tokens per second, burst of one second's worth; a large request may overdraw it once."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = max(rate, 1.0)
        self.tokens = self.burst
        self.last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: float = 1.0) -> float:
        """Take ``n`` tokens; returns 0 on success or the seconds to wait before retrying."""
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.rate <= 0:
                return math.inf
            need = min(n, self.burst)
            if self.tokens >= need:
                self.tokens -= n
                return 0.0
            return (need - self.tokens) / self.rate


@dataclass
class Service:
    """Everything one worker process holds: the model, the keys, the store, oracles, limiters, detectors."""

    model: torch.nn.Module
    spec: Any
    config: ServerConfig
    store: Store
    workers: int = 1
    device: str = "cpu"
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.spec.input_shape)
        self.num_classes = int(self.spec.num_classes)
        self._oracles: dict[tuple[str, OutputMode], LocalExplanationOracle] = {}
        self._explain_locks: dict[str, threading.Lock] = {}
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._prada: dict[str, Prada] = {}
        self._lock = threading.Lock()
        self.store.sync_keys(self.config.keys.values())

    # -- per-key helpers ---------------------------------------------------------------------------------
    def authenticate(self, header: str | None) -> KeyConfig:
        from stealkit.serve.keys import hash_key

        if not header:
            raise ApiError(401, "unauthorized", "missing API key: send the header 'Authorization: Bearer <key>'",
                           {"WWW-Authenticate": "Bearer"})
        scheme, _, token = header.strip().partition(" ")
        key = self.config.keys.get(hash_key(token.strip())) if scheme.lower() == "bearer" and token.strip() else None
        if key is None:
            raise ApiError(401, "unauthorized", "unknown API key; check the 'Authorization: Bearer <key>' header",
                           {"WWW-Authenticate": "Bearer"})
        return key

    def oracle(self, key: KeyConfig, mode: OutputMode) -> LocalExplanationOracle:
        with self._lock:
            o = self._oracles.get((key.key_hash, mode))
            if o is None:
                o = LocalExplanationOracle(self.model, self.input_shape, num_classes=self.num_classes, mode=mode,
                                           temperature=key.temperature, top_k=key.top_k, defences=key.defences,
                                           device=self.device, seed=key.seed)
                self._oracles[(key.key_hash, mode)] = o
                self._explain_locks.setdefault(key.key_hash, threading.Lock())
            return o

    def rate_limit(self, key: KeyConfig, what: str, n: float) -> None:
        rate = key.rate if what == "requests" else key.image_rate
        if rate is None:
            return
        with self._lock:
            bucket = self._buckets.setdefault((key.key_hash, what), TokenBucket(rate / self.workers))
        wait = bucket.take(n)
        if wait > 0:
            self.metrics.refuse(key.name, "rate_limited")
            retry = "3600" if math.isinf(wait) else str(max(1, math.ceil(wait)))
            raise ApiError(429, "rate_limited", f"rate limit of {rate:g} {what}/s exceeded; retry after {retry} s",
                           {"Retry-After": retry})

    def check_blocked(self, key: KeyConfig) -> None:
        if key.prada is not None and key.prada.block and self.store.usage(key.key_hash).flagged:
            self.metrics.refuse(key.name, "blocked")
            raise ApiError(403, "blocked", "this key was flagged as a model-extraction attack (PRADA) and is "
                           "blocked; contact the API owner")

    def choose_mode(self, key: KeyConfig, requested: Any) -> OutputMode:
        if requested is None or requested == "":
            return key.mode
        if not isinstance(requested, str):
            raise InputError(f"mode must be a string, got {requested!r}")
        mode = OutputMode.parse(requested)
        if mode not in key.allowed_modes:
            self.metrics.refuse(key.name, "mode_not_allowed")
            raise ApiError(403, "mode_not_allowed", f"this key may ask for {[m.value for m in key.allowed_modes]}, "
                           f"not {mode.value!r}")
        return mode

    def precheck_budget(self, key: KeyConfig, kind: str, n: int) -> None:
        usage = self.store.usage(key.key_hash)
        left = [v for v in (usage.left, usage.explain_left if kind == "explain" else None) if v is not None]
        if left and n > min(left):
            self.metrics.refuse(key.name, "budget_exhausted")
            raise ApiError(402, "budget_exhausted", f"query budget exhausted: this request needs {n} {kind} "
                           f"queries but only {min(left)} remain; send a smaller batch or ask for a larger budget",
                           queries_left=min(left))

    def charge(self, key: KeyConfig, kind: str, x: torch.Tensor, out: torch.Tensor, mode: str) -> Any:
        try:
            return self.store.charge(key.key_hash, kind, int(x.shape[0]), mode=mode,
                                     input_digest=digest_tensor(x), output_digest=digest_tensor(out))
        except BudgetExhausted as exc:
            self.metrics.refuse(key.name, "budget_exhausted")
            raise ApiError(402, "budget_exhausted", str(exc), queries_left=exc.remaining) from None

    def detect(self, key: KeyConfig, x: torch.Tensor, labels: torch.Tensor) -> None:
        if key.prada is None:
            return
        with self._lock:
            det = self._prada.setdefault(key.key_hash, Prada(key.prada))
        was = det.flagged
        state = det.update(x, labels)
        if state.statistic is not None:
            self.metrics.prada_stat[key.name] = state.statistic
        if state.flagged and not was:
            log.warning("PRADA flagged key %s (W=%.4f after %d distances)", key.name, state.statistic,
                        state.n_distances)
            self.store.set_flagged(key.key_hash, True)

    # -- endpoints (run in the thread pool) --------------------------------------------------------------
    def predict(self, key: KeyConfig, body: bytes, content_type: str | None, params: dict[str, str]) -> dict:
        self.check_blocked(key)
        kind = payloads.content_kind(content_type)
        if kind == "npy":
            x = payloads.decode_npy(body, self.input_shape, max_batch=self.config.max_batch)
            opts: dict[str, Any] = dict(params)
        else:
            x, opts = payloads.decode_json(body, self.input_shape, max_batch=self.config.max_batch)
            opts = {**params, **opts}
        unknown = set(opts) - {"mode"}
        if unknown:
            raise InputError(f"unknown predict options {sorted(unknown)}; the only option is 'mode'")
        mode = self.choose_mode(key, opts.get("mode"))
        n = int(x.shape[0])
        self.rate_limit(key, "images", n)
        self.precheck_budget(key, "predict", n)
        oracle = self.oracle(key, mode)
        logits = oracle.logits(x)
        out = oracle._answer(logits)  # the LocalOracle's own answer path: identical numbers in and out of HTTP
        usage = self.charge(key, "predict", x, out, mode.value)
        self.detect(key, x, logits.argmax(1))
        return {"mode": mode.value, "outputs": out, "queries_left": usage.left, "queries_used": usage.as_dict(),
                "n": n}

    def explain(self, key: KeyConfig, body: bytes, content_type: str | None, params: dict[str, str]) -> dict:
        if not key.explain:
            self.metrics.refuse(key.name, "explain_not_allowed")
            raise ApiError(403, "explain_not_allowed", "this key may not call /v1/explain (explain = false)")
        self.check_blocked(key)
        kind = payloads.content_kind(content_type)
        if kind == "npy":
            x = payloads.decode_npy(body, self.input_shape, max_batch=self.config.max_batch)
            opts: dict[str, Any] = payloads.query_options(dict(params))
        else:
            x, opts = payloads.decode_json(body, self.input_shape, max_batch=self.config.max_batch)
            opts = {**payloads.query_options(dict(params)), **opts}
        unknown = set(opts) - {"method", "target", "output", "n_samples", "sigma"}
        if unknown:
            raise InputError(f"unknown explain options {sorted(unknown)}; expected method, target, output, "
                             "n_samples, sigma")
        method = opts.get("method", "gradient")
        output = opts.get("output", "logit")
        n_samples = payloads._int(opts.get("n_samples", 10), "n_samples")
        sigma = payloads._float(opts.get("sigma", 0.1), "sigma")
        if method not in ("gradient", "smoothgrad"):
            raise InputError(f"unknown explanation method {method!r}; expected 'gradient' or 'smoothgrad'")
        if output not in ("logit", "prob"):
            raise InputError(f"unknown explanation output {output!r}; expected 'logit' or 'prob'")
        if not 1 <= n_samples <= MAX_SMOOTHGRAD_SAMPLES or sigma < 0:
            raise InputError(f"n_samples must lie in [1, {MAX_SMOOTHGRAD_SAMPLES}] and sigma >= 0")
        target = _target(opts.get("target"), int(x.shape[0]), self.num_classes)
        n = int(x.shape[0])
        self.rate_limit(key, "images", n * (n_samples if method == "smoothgrad" else 1))
        self.precheck_budget(key, "explain", n)
        oracle = self.oracle(key, key.mode)
        with self._explain_locks[key.key_hash]:
            grads = oracle.explain(x, method, target=target, output=output, n_samples=n_samples, sigma=sigma)
        usage = self.charge(key, "explain", x, grads, method)
        return {"mode": method, "outputs": grads, "queries_left": usage.left,
                "explain_left": usage.explain_left, "queries_used": usage.as_dict(), "n": n}

    def info(self, key: KeyConfig) -> dict[str, Any]:
        usage = self.store.usage(key.key_hash)
        extra = self.spec.extra or {}
        return {
            "api_version": API_VERSION,
            "stealkit_version": __version__,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "classes": list(self.spec.class_names or []),
            "dataset": extra.get("dataset"),
            "split_seed": extra.get("split_seed", 0),
            "arch": self.spec.arch,
            "key": key.name,
            "mode": key.mode.value,
            "allowed_modes": [m.value for m in key.allowed_modes],
            "top_k": key.top_k,
            "explain": key.explain,
            "queries_left": usage.left,
            "explain_left": usage.explain_left,
            "queries_used": usage.as_dict(),
            "budget": key.budget,
            "max_batch": self.config.max_batch,
            "max_body_bytes": self.config.max_body_bytes,
            "rate_limits": {"requests_per_s": key.rate, "images_per_s": key.image_rate},
        }


def _target(value: Any, n: int, num_classes: int) -> torch.Tensor | None:
    if value is None:
        return None
    vals = value if isinstance(value, list) else [value]
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise InputError("target must be a class index or a list of one per image")
    if len(vals) not in (1, n):
        raise InputError(f"target must be one class or one per image ({n}), got {len(vals)}")
    if min(vals) < 0 or max(vals) >= num_classes:
        raise InputError(f"target classes must lie in [0, {num_classes - 1}]")
    return torch.tensor(vals, dtype=torch.long)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiError(400, "bad_input", f"invalid Content-Length {length!r}")
        if int(length) > limit:
            raise ApiError(413, "too_large", f"request body of {int(length)} bytes exceeds the limit of {limit}; "
                           "send smaller batches")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, "too_large", f"request body exceeds the limit of {limit} bytes; send smaller batches")
        chunks.append(chunk)
    return b"".join(chunks)


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


_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {
                "type": "object", "required": ["inputs"],
                "properties": {
                    "inputs": {"type": "array", "description": "nested list [B][C][H][W] of pixels in [0, 1]",
                               "items": {"type": "array", "items": {"type": "array", "items": {
                                   "type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}}}}},
                    "mode": {"type": "string", "enum": [m.value for m in OutputMode]},
                    "method": {"type": "string", "enum": ["gradient", "smoothgrad"]},
                    "output": {"type": "string", "enum": ["logit", "prob"]},
                    "target": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
                    "n_samples": {"type": "integer", "minimum": 1, "maximum": MAX_SMOOTHGRAD_SAMPLES},
                    "sigma": {"type": "number", "minimum": 0},
                },
            }},
            payloads.NPY: {"schema": {"type": "string", "format": "binary",
                                      "description": "a .npy float array [B, C, H, W] (numpy.save)"}},
        },
    },
}
_ERRORS = {s: {"description": d} for s, d in (
    (400, "malformed input"), (401, "missing or unknown key"), (402, "budget exhausted"),
    (403, "not allowed for this key, or blocked"), (413, "body or batch too large"),
    (415, "unsupported Content-Type"), (429, "rate limited"), (503, "busy; retry"))}


def create_app(model_dir: str | Path, keys: str | Path | ServerConfig, db: str | Path, *, workers: int = 1,
               device: str = "cpu", max_inflight: int = 64) -> FastAPI:
    """Build the API over a saved model directory, a keys file (or parsed config) and a SQLite file."""
    from stealkit.models import load_model

    model, spec = load_model(model_dir, device=device)
    model.eval()
    config = keys if isinstance(keys, ServerConfig) else load_keys(keys)
    service = Service(model=model, spec=spec, config=config, store=Store(db), workers=max(1, workers),
                      device=device)
    app = FastAPI(title="stealkit prediction API", version=__version__,
                  description="A classifier behind a pay-per-query API, as in the model-extraction threat model.")
    app.state.service = service
    inflight = threading.BoundedSemaphore(max_inflight)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        detail = f"no endpoint {request.method} {request.url.path}; see /openapi.json for {list(ENDPOINTS)}" \
            if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse({"error": code, "detail": detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "bad_input", "detail": str(exc.errors())[:500]}, status_code=400)

    async def guarded(request: Request, endpoint: str) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            key = service.authenticate(request.headers.get("authorization"))
            try:
                service.rate_limit(key, "requests", 1)
                body = await _read_body(request, config.max_body_bytes)
                if not inflight.acquire(blocking=False):
                    raise ApiError(503, "busy", "the server is busy; retry shortly", {"Retry-After": "1"})
                try:
                    fn = service.predict if endpoint == "predict" else service.explain
                    result = await run_in_threadpool(fn, key, body, request.headers.get("content-type"),
                                                     dict(request.query_params))
                finally:
                    inflight.release()
            except payloads.UnsupportedMedia as exc:
                raise ApiError(415, "unsupported_media_type", str(exc)) from None
            except payloads.TooLarge as exc:
                raise ApiError(413, "too_large", str(exc)) from None
            except InputError as exc:
                service.metrics.refuse(key.name, "bad_input")
                raise ApiError(400, "bad_input", str(exc)) from None
            except sqlite3.OperationalError as exc:
                log.warning("database busy: %s", exc)
                raise ApiError(503, "busy", "the query database is busy; retry shortly", {"Retry-After": "1"}) \
                    from None
            response = _respond(result, request.headers.get("accept"))
        except ApiError as exc:
            response = exc.response()
        status = response.status_code
        service.metrics.observe(f"/v1/{endpoint}", status, time.perf_counter() - start)
        return response

    @app.post("/v1/predict", openapi_extra=_BODY_DOC, responses=_ERRORS,
              summary="Classify a batch of images in the key's output mode")
    async def predict(request: Request) -> Response:
        return await guarded(request, "predict")

    @app.post("/v1/explain", openapi_extra=_BODY_DOC, responses=_ERRORS,
              summary="Input gradients or SmoothGrad maps for a batch of images")
    async def explain(request: Request) -> Response:
        return await guarded(request, "explain")

    @app.get("/v1/info", responses={401: _ERRORS[401]}, summary="The model's interface and this key's budget")
    async def info(request: Request) -> Response:
        try:
            key = service.authenticate(request.headers.get("authorization"))
            return JSONResponse(await run_in_threadpool(service.info, key))
        except ApiError as exc:
            return exc.response()

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "pid": os.getpid(), "version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    async def metrics() -> PlainTextResponse:
        usage = await run_in_threadpool(service.store.all_usage)
        text = service.metrics.render(sorted(usage.values(), key=lambda t: t[0]))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return app


def app_from_env() -> FastAPI:
    """The uvicorn factory (``stealkit.serve.app:app_from_env``) used by ``stealkit serve``'s workers."""
    cfg = json.loads(os.environ[ENV])
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return create_app(cfg["model"], cfg["keys"], cfg["db"], workers=int(cfg.get("workers", 1)),
                      device=cfg.get("device", "cpu"), max_inflight=int(cfg.get("max_inflight", 64)))


__all__ = ["ApiError", "Service", "app_from_env", "create_app"]
