"""What one worker does for a query: authenticate, parse, limit, reserve, compute, encode, settle.

Order of checks for a query: client address throttled after failed keys (429), key (401), request rate
(429), the key's share of the in-flight bound (429), the worker's in-flight bound (503), body size (413), then,
outside any compute slot, blocked by PRADA (403), body and options (400/415), mode (400/403); then a fair
compute slot (waits), image rate (429). A retry whose ``Idempotency-Key`` names a kept answer skips the request
rate and budget checks and, once its body is parsed and found identical, is answered from the log, uncharged,
before the image rate and the budget are looked at (a paid answer is never lost to them). Then the charge is
**reserved** in the store (402 when the budget cannot cover it), the answer computed and encoded, the answer
sent, and only once its bytes are handed to the connection the reservation is **settled** (logged as answered;
:class:`SettleOnSend`). An answer that cannot be produced or encoded (e.g. a non-finite number), or whose
client is gone before it is sent, is refunded and logged as refunded (answered 500 if it could not be
produced). A client that leaves during the parse, the wait for a slot or the computation stops that work at
its next check (:mod:`stealkit.serve.cancel`): nothing is charged, or the reservation is refunded. Answers
are computed exactly as :class:`~stealkit.oracle.LocalOracle` computes them (same code, same chunking).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fastapi.responses import Response

from stealkit import __version__
from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import (
    ExplainArgs,
    LocalExplanationOracle,
    OutputMode,
    check_explain_args,
    explain_price,
)
from stealkit.oracle.ledger import digest_tensor
from stealkit.serve import payloads
from stealkit.serve.cancel import Cancelled, check
from stealkit.serve.detection import Prada
from stealkit.serve.keys import KeyConfig, ServerConfig
from stealkit.serve.limits import AuthThrottle, TokenBucket
from stealkit.serve.metrics import Metrics
from stealkit.serve.store import IdempotencyMismatch, InFlight, Replay, Reservation, Store

log = logging.getLogger(__name__)

API_VERSION = "v1"
PREDICT_FIELDS = frozenset({"mode"})
EXPLAIN_FIELDS = frozenset({"method", "target", "output", "n_samples", "sigma"})
#: bytes one pixel may take in a request body: 8 in .npy (float64), up to 24 in JSON ("0.12345678901234567, ")
NPY_BYTES_PER_VALUE, JSON_BYTES_PER_VALUE, BODY_SLACK = 8, 24, 64 * 1024
MAX_REQUEST_ID = 128


class ApiError(Exception):
    """An answer other than 200: status, a short code and a message saying what to do."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}
        self.extra = extra

    def response(self, *, v2: bool = False) -> Response:
        """``{"error": CODE, "detail": MESSAGE}``; for the v2 protocol ``{"error": MESSAGE, "code": CODE}``."""
        doc = {"error": self.message, "code": self.code} if v2 else {"error": self.code, "detail": self.message}
        body = json.dumps({**doc, **self.extra})
        return Response(body, status_code=self.status, headers=self.headers, media_type=payloads.JSON)


@dataclass(frozen=True)
class Query:
    """A parsed, validated request: images, mode or explanation arguments, and what it costs."""

    endpoint: str
    x: torch.Tensor
    mode: OutputMode
    explain: ExplainArgs | None = None
    target: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def cost(self) -> int:
        """Queries charged: one per image, times the explanation's price per image."""
        return self.n * (explain_price(self.explain) if self.explain is not None else 1)

    def fingerprint(self, answer_form: str) -> str:
        """A digest of everything that shapes this request's answer (as Stripe's idempotency keys compare a
        retry's parameters): endpoint, mode, explanation arguments, target, images, and ``answer_form`` (the
        protocol, route and response encoding the caller will produce)."""
        a = self.explain
        doc = {"endpoint": self.endpoint, "mode": self.mode.value, "images": digest_tensor(self.x),
               "explain": None if a is None else [a.method, a.output, a.n_samples, repr(float(a.sigma))],
               "target": None if self.target is None else self.target.tolist(), "answer": answer_form}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


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
    auth_throttle: AuthThrottle = field(default_factory=AuthThrottle)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.spec.input_shape)
        self.num_classes = int(self.spec.num_classes)
        self._oracles: dict[tuple[str, OutputMode], LocalExplanationOracle] = {}
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._prada: dict[str, Prada] = {}
        self._lock = threading.Lock()
        self.store.sync_keys(self.config.keys.values())

    def body_limit(self, content_type: str | None) -> int:
        """The largest body a request may send: the keys file's ``max_body_mb``, or what the largest legal
        batch takes in this content type."""
        if self.config.max_body_bytes is not None:
            return self.config.max_body_bytes
        per = NPY_BYTES_PER_VALUE if payloads.content_kind(content_type) == "npy" else JSON_BYTES_PER_VALUE
        return self.config.max_batch * math.prod(self.input_shape) * per + BODY_SLACK

    # -- per-key helpers ---------------------------------------------------------------------------------
    def authenticate(self, header: str | None, client: str) -> KeyConfig:
        """The request's key, or 401; from an address throttled for failed keys, 429 unless the key already
        authenticated from there (:class:`~stealkit.serve.limits.AuthThrottle`)."""
        scheme, _, token = (header or "").strip().partition(" ")
        key = self.config.lookup(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        wait = self.auth_throttle.blocked_for(client)
        if wait > 0 and not (key is not None and self.auth_throttle.known(client, key.key_id)):
            retry = str(max(1, math.ceil(wait)))
            raise ApiError(429, "auth_throttled", f"too many failed API keys from this address; retry after {retry} s",
                           {"Retry-After": retry})
        if not header:
            raise ApiError(401, "unauthorized", "missing API key: send the header 'Authorization: Bearer <key>'",
                           {"WWW-Authenticate": "Bearer"})
        if key is None:
            self.auth_throttle.failed(client)
            raise ApiError(401, "unauthorized", "unknown API key; check the 'Authorization: Bearer <key>' header",
                           {"WWW-Authenticate": "Bearer"})
        self.auth_throttle.remember(client, key.key_id)
        return key

    def known_retry(self, key: KeyConfig, request_id: str | None) -> bool:
        """Whether ``request_id`` (an ``Idempotency-Key``) names an answer kept for this key: such a retry skips
        the request rate and budget checks made before the body is read, so that a paid answer is never lost to
        them; its body must still be the identical request (else 422), and nothing else is answered free."""
        return request_id is not None and 0 < len(request_id) <= MAX_REQUEST_ID \
            and self.store.has_answer(key.key_id, request_id)

    def check_budget(self, key: KeyConfig) -> None:
        """Refuse (402), before its body is read, a request of a key with no query left: an exhausted key
        cannot hold the server's in-flight slots with bodies it never pays for."""
        if key.budget is not None and self.store.usage(key.key_id).left == 0:
            raise ApiError(402, "budget_exhausted", f"the budget of key {key.key_id!r} is used up", queries_left=0)

    def oracle(self, key: KeyConfig, mode: OutputMode) -> LocalExplanationOracle:
        with self._lock:
            o = self._oracles.get((key.key_id, mode))
            if o is None:
                o = LocalExplanationOracle(Interruptible(self.model), self.input_shape, num_classes=self.num_classes, mode=mode,
                                           temperature=key.temperature, top_k=key.top_k, defences=key.defences,
                                           device=self.device, seed=key.seed)
                self._oracles[(key.key_id, mode)] = o
            return o

    def rate_limit(self, key: KeyConfig, what: str, n: float) -> None:
        rate = key.rate if what == "requests" else key.image_rate
        if rate is None:
            return
        with self._lock:
            bucket = self._buckets.setdefault((key.key_id, what), TokenBucket(rate / self.workers))
        wait = bucket.take(n)
        if wait > 0:
            retry = "3600" if math.isinf(wait) else str(max(1, min(3600, math.ceil(wait))))
            raise ApiError(429, "rate_limited", f"rate limit of {rate:g} {what}/s exceeded; retry after {retry} s",
                           {"Retry-After": retry})

    def check_blocked(self, key: KeyConfig) -> None:
        if key.prada is not None and key.prada.block and self.store.usage(key.key_id).flagged:
            raise ApiError(403, "blocked", "this key was flagged as a model-extraction attack (PRADA) and is "
                           "blocked; contact the API owner")

    def choose_mode(self, key: KeyConfig, requested: Any) -> OutputMode:
        if requested is None:
            return key.mode
        if not isinstance(requested, str):  # before any comparison: an array would compare element by element
            raise InputError(f"mode must be a string, got {type(requested).__name__}")
        if requested == "":
            return key.mode
        mode = OutputMode.parse(requested)
        if mode not in key.allowed_modes:
            raise ApiError(403, "mode_not_allowed", f"this key may ask for {[m.value for m in key.allowed_modes]}, "
                           f"not {mode.value!r}")
        return mode

    def detect(self, key: KeyConfig, x: torch.Tensor, labels: torch.Tensor) -> None:
        if key.prada is None:
            return
        with self._lock:
            det = self._prada.setdefault(key.key_id, Prada(key.prada))
        was = det.flagged
        state = det.update(x, labels)
        if state.statistic is not None:
            self.metrics.prada_statistic(key.key_id, state.statistic)
        if state.flagged and not was:
            log.warning("PRADA flagged key %s (W=%.4f after %d distances)", key.key_id, state.statistic,
                        state.n_distances)
            self.store.set_flagged(key.key_id, True)

    # -- a query, in the thread pool -----------------------------------------------------------------------
    def parse(self, key: KeyConfig, endpoint: str, body: bytes, content_type: str | None,
              params: dict[str, str]) -> Query:
        """Every check that needs the body; raises :class:`InputError` / :class:`ApiError`, charges nothing."""
        if endpoint == "explain" and not key.explain:
            raise ApiError(403, "explain_not_allowed", "this key may not call /v1/explain (explain = false)")
        self.check_blocked(key)
        fields = PREDICT_FIELDS if endpoint == "predict" else EXPLAIN_FIELDS
        unknown = set(params) - fields
        if unknown:
            raise InputError(f"unknown {endpoint} options {sorted(unknown)}; expected some of {sorted(fields)}")
        opts: dict[str, Any] = payloads.query_options(params)
        if payloads.content_kind(content_type) == "npy":
            x = payloads.decode_npy(body, self.input_shape, max_batch=self.config.max_batch)
        else:
            x, more = payloads.decode_json(body, self.input_shape, max_batch=self.config.max_batch, fields=fields)
            opts |= more
        if endpoint == "predict":
            return Query("predict", x, self.choose_mode(key, opts.get("mode")))
        args = check_explain_args(opts.get("method", "gradient"), opts.get("output", "logit"),
                                  opts.get("n_samples", 10), opts.get("sigma", 0.1))
        target = parse_target(opts.get("target"), int(x.shape[0]), self.num_classes)
        return Query("explain", x, key.mode, explain=args, target=target)

    def reserve(self, key: KeyConfig, q: Query, request_id: str | None,
                answer_form: str = "") -> Reservation | Replay:
        """The kept answer of a retried ``request_id`` (first: whatever the budget and rates left), else the
        image rate and a reservation of the query's cost (402 when the budget cannot cover it)."""
        mode = q.mode.value if q.explain is None else q.explain.method
        try:
            if request_id is not None:  # a paid answer is replayed whatever the budget or the rates left
                kept = self.store.replay(key.key_id, q.endpoint, q.cost, input_digest=digest_tensor(q.x),
                                         request_id=request_id, fingerprint=q.fingerprint(answer_form))
                if kept is not None:
                    return kept
            self.rate_limit(key, "images", q.cost)
            return self.store.reserve(key.key_id, q.endpoint, q.cost, mode=mode, input_digest=digest_tensor(q.x),
                                      request_id=request_id,
                                      fingerprint=None if request_id is None else q.fingerprint(answer_form))
        except IdempotencyMismatch as exc:
            raise ApiError(422, "idempotency_key_reused", str(exc)) from None
        except BudgetExhausted as exc:
            raise ApiError(402, "budget_exhausted", str(exc), queries_left=exc.remaining) from None
        except InFlight:
            raise ApiError(409, "in_progress", f"a request with Idempotency-Key {request_id!r} is being answered; "
                           "retry shortly", {"Retry-After": "1"}) from None

    def answer(self, key: KeyConfig, q: Query) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model work: outputs, and the top-1 labels of a prediction (for PRADA)."""
        if q.explain is None:
            oracle = self.oracle(key, q.mode)
            logits = oracle.logits(q.x)
            return oracle.answer_from_logits(logits, x=q.x), logits.argmax(1)
        a = q.explain
        oracle = self.oracle(key, key.mode)
        return oracle.explain(q.x, a.method, target=q.target, output=a.output, n_samples=a.n_samples,
                              sigma=a.sigma), None

    def prepare(self, key: KeyConfig, endpoint: str, body: bytes, content_type: str | None,
                params: dict[str, str], accept: str | None, request_id: str | None) -> Callable[[], Response]:
        """The parse of one /v1 query (run outside any compute slot); returns its computation, which the app
        runs in a compute slot (:meth:`run`: reserve, answer, encode, settle on send)."""
        check_request_id(request_id)
        q = self.parse(key, endpoint, body, content_type, params)
        form = f"v1 {endpoint} {'npy' if accept and payloads.NPY in accept else 'json'}"
        return lambda: self.run(key, q, request_id, lambda out, res: encode(q, out, res, accept), form)

    def query(self, key: KeyConfig, endpoint: str, body: bytes, content_type: str | None, params: dict[str, str],
              accept: str | None, request_id: str | None) -> Response:
        """One /v1 query from parse to settled answer (see the module docstring)."""
        return self.prepare(key, endpoint, body, content_type, params, accept, request_id)()

    def run(self, key: KeyConfig, q: Query, request_id: str | None,
            respond: Callable[[torch.Tensor, Reservation], Response], answer_form: str = "") -> Response:
        """Limit, reserve, answer, encode (``respond``: the protocol's response for the outputs), settle; a
        retried ``request_id`` is answered from the log, uncharged, if ``answer_form`` (the protocol, route
        and encoding of the answer) and the query are the same. Shared by the /v1 and /v2 endpoints."""
        res = self.reserve(key, q, request_id, answer_form)
        if isinstance(res, Replay):
            return Response(res.body, media_type=res.media_type,
                            headers=json.loads(res.headers) | {"X-Stealkit-Replayed": "1"})
        try:
            out, labels = self.answer(key, q)
            response = respond(out, res)
            kept = Replay(response.media_type or payloads.JSON, json.dumps(_replay_headers(response)), response.body) \
                if request_id is not None else None
            digest = digest_tensor(out)
            response = SettleOnSend(response, settle=lambda: self.store.settle(res, digest, answer=kept),
                                    refund=lambda reason: self.store.refund(res, reason))
        except Cancelled:
            self.store.refund(res, "not delivered: the client disconnected during the computation")
            log.info("refunded %d %s queries of key %s: its client left during the computation", q.cost,
                     q.endpoint, key.key_id)
            raise
        except BaseException as exc:
            self.store.refund(res, f"not delivered: {type(exc).__name__}: {str(exc)[:200]}")
            log.error("refunded %d %s queries of key %s: the answer could not be produced (%r)", q.cost, q.endpoint,
                      key.key_id, exc)
            if isinstance(exc, InputError | ApiError):
                raise
            raise ApiError(500, "internal_error", "the answer could not be produced; it was not charged (refunded)"
                           " and the failure is logged; retry or report it to the API owner") from None
        if labels is not None:
            self.detect(key, q.x, labels)
        return response

    def info(self, key: KeyConfig) -> dict[str, Any]:
        usage = self.store.usage(key.key_id)
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
            "key": key.key_id,
            "mode": key.mode.value,
            "allowed_modes": [m.value for m in key.allowed_modes],
            "top_k": key.top_k,
            "explain": key.explain,
            "explain_price": "1 explain query per image for gradient; n_samples per image for smoothgrad",
            "queries_left": usage.left,
            "explain_left": usage.explain_left,
            "queries_used": usage.as_dict(),
            "budget": key.budget,
            "max_batch": self.config.max_batch,
            "max_body_bytes": self.body_limit(payloads.NPY),
            "rate_limits": {"requests_per_s": key.rate, "images_per_s": key.image_rate},
        }


class Interruptible(torch.nn.Module):
    """The served model, checking before every forward pass whether its request's client has left
    (:func:`stealkit.serve.cancel.check`): the oracle's loops (chunks, SmoothGrad samples) stop at the next
    pass, and the charge is refunded."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check()
        return self.inner(x)


class SettleOnSend(Response):
    """An answer whose reservation is settled only once its bytes are handed to the connection, and refunded if
    the client is gone before that or the send fails: a charge is an answer the client was sent.

    The app sets :attr:`client_gone` (a callable) before the response is sent; without one, the answer is
    assumed deliverable. A server killed between the send and the settle leaves the row reserved, which
    :meth:`~stealkit.serve.store.Store.recover` refunds at the next start (the client may have had it free)."""

    def __init__(self, inner: Response, *, settle: Callable[[], None], refund: Callable[[str], None]) -> None:
        super().__init__(inner.body, status_code=inner.status_code, media_type=inner.media_type)
        self.raw_headers = inner.raw_headers
        self.settle, self.refund = settle, refund
        self.client_gone: Callable[[], Awaitable[bool]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.concurrency import run_in_threadpool

        if self.client_gone is not None and await self.client_gone():
            await run_in_threadpool(self.refund, "not delivered: the client disconnected before the answer was sent")
            return
        try:
            await super().__call__(scope, receive, send)
        except BaseException as exc:
            await run_in_threadpool(self.refund, f"not delivered: {type(exc).__name__}: {str(exc)[:200]}")
            raise
        await run_in_threadpool(self.settle)


def check_request_id(request_id: str | None) -> None:
    if request_id is not None and (not request_id or len(request_id) > MAX_REQUEST_ID
                                   or not request_id.isprintable()):
        raise InputError(f"Idempotency-Key must be 1 to {MAX_REQUEST_ID} printable characters")


def check_finite(out: torch.Tensor) -> None:
    """Refuse to send (so the charge is refunded) an answer holding NaN or Inf."""
    if out.dtype.is_floating_point and not bool(torch.isfinite(out).all()):
        raise ValueError("the model produced a non-finite number (NaN or Inf) for this request")


def encode(q: Query, out: torch.Tensor, res: Reservation, accept: str | None) -> Response:
    """The response body and headers, built before the charge is settled; a non-finite output raises."""
    check_finite(out)
    usage = res.usage
    used = usage.as_dict()
    arr = payloads.to_numpy(out)
    mode = q.mode.value if q.explain is None else q.explain.method
    if accept and payloads.NPY in accept:
        headers = {"X-Stealkit-Mode": mode, "X-Stealkit-N": str(q.n), "X-Stealkit-Cost": str(q.cost),
                   "X-Stealkit-Queries-Used": json.dumps(used)}
        if usage.left is not None:
            headers["X-Stealkit-Queries-Left"] = str(usage.left)
        if usage.explain_left is not None:
            headers["X-Stealkit-Explain-Left"] = str(usage.explain_left)
        return Response(payloads.encode_npy(arr), media_type=payloads.NPY, headers=headers)
    doc: dict[str, Any] = {"mode": mode, "outputs": arr.tolist(), "queries_left": usage.left,
                           "queries_used": used, "n": q.n, "cost": q.cost}
    if q.explain is not None:
        doc["explain_left"] = usage.explain_left
    return Response(json.dumps(doc, allow_nan=False), media_type=payloads.JSON)


def _replay_headers(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items()
            if k.lower().startswith("x-stealkit-") or k.lower() == "inference-header-content-length"}


def parse_target(value: Any, n: int, num_classes: int) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):  # a JSON array of numbers (stealkit.serve.jsonscan)
        if value.ndim != 1 or value.dtype.kind not in "iu" or value.size not in (1, n):
            raise InputError(f"target must be a class index or a list of one per image ({n}) of integers")
        value = value.tolist()
    vals = value if isinstance(value, list) else [value]
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise InputError("target must be a class index or a list of one per image")
    if len(vals) not in (1, n):
        raise InputError(f"target must be one class or one per image ({n}), got {len(vals)}")
    if min(vals) < 0 or max(vals) >= num_classes:
        raise InputError(f"target classes must lie in [0, {num_classes - 1}]")
    return torch.tensor(vals, dtype=torch.long)
