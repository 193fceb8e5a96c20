"""An oracle over a ``stealkit serve`` HTTP API (or any server speaking the same /v1 protocol).

:class:`HttpOracle` implements :class:`~stealkit.oracle.Oracle` and :class:`~stealkit.oracle.ExplanationOracle`,
so every attack runs against a URL unchanged. Batches travel as ``.npy`` both ways. Its ledger mirrors the
server: its budget is the smaller of the ``budget`` you give and what the key had left when the oracle was
opened, and it shrinks whenever the server reports less left (another client on the same key). Each image is
charged to the ledger before it is sent and refunded if the server refuses it, so the ledger counts exactly
what the server answered to this oracle.

Retries: 429 and 503 (and connections that never opened) are retried with exponential backoff, honouring
``Retry-After``; they were not charged. Every query carries an ``Idempotency-Key``, so a dropped connection,
a timeout or a 5xx is retried too: the server answers a repeat from its log without charging it again. If
the retries run out, :meth:`HttpOracle.charges` tells whether the server billed the request, and the ledger
keeps exactly what was billed, so its count always equals the server's.

Fidelity: an HTTP victim has no local model, so ``make_evaluator`` reports fidelity as ``None``. To measure it,
run the same attack against the model directory (same seed, same answers) or compare the student with the
model offline.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
import uuid
from typing import Any

import httpx
import numpy as np
import torch

from stealkit.errors import BudgetExhausted, InputError, StealkitError
from stealkit.oracle.base import (
    ExplainMethod,
    ExplainOutput,
    OutputMode,
    check_explain_args,
    explain_price,
    validate_images,
)
from stealkit.oracle.ledger import QueryKind, QueryLedger
from stealkit.oracle.observe import notify

log = logging.getLogger(__name__)

NPY = "application/x-npy"
JSON = "application/json"


class HttpOracle:
    """A remote victim. ``mode=None`` takes the key's own mode; a mode the key may not use is refused.

    Args:
        url: ``http(s)://host:port`` of the API (with or without a trailing ``/``).
        key: the API key (sent as ``Authorization: Bearer <key>``).
        budget: at most this many images (all kinds) from this oracle; the key's remaining budget also caps it.
        batch_size: the largest batch per request (also capped by the server's ``max_batch``).
        timeout: seconds per request; retries: attempts after the first for 429/503/connection refused.
    """

    def __init__(self, url: str, *, key: str, mode: str | OutputMode | None = None, budget: int | None = None,
                 batch_size: int = 1024, timeout: float = 60.0, retries: int = 5, backoff: float = 0.25,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._connect(url, key, batch_size=batch_size, timeout=timeout, retries=retries, backoff=backoff,
                      transport=transport)
        self.info: dict[str, Any] = self._request("GET", "/v1/info").json()
        self.input_shape: tuple[int, int, int] = tuple(int(s) for s in self.info["input_shape"])  # type: ignore[assignment]
        self.num_classes = int(self.info["num_classes"])
        self.dataset: str | None = self.info.get("dataset")
        self.split_seed = int(self.info.get("split_seed") or 0)
        self.classes: list[str] = list(self.info.get("classes") or [])
        allowed = [OutputMode.parse(m) for m in self.info.get("allowed_modes", [self.info["mode"]])]
        self.mode = OutputMode.parse(mode) if mode is not None else OutputMode.parse(self.info["mode"])
        if self.mode not in allowed:
            raise InputError(f"this API key may ask for modes {[m.value for m in allowed]}, not {self.mode.value!r}; "
                             f"pass --mode {allowed[0].value}")
        self.batch_size = min(int(batch_size), int(self.info.get("max_batch") or batch_size))
        server_left = self.info.get("queries_left")
        caps = [b for b in (budget, server_left) if b is not None]
        budgets = {}
        if self.info.get("explain_left") is not None:
            budgets["explain"] = int(self.info["explain_left"])
        self._ledger = QueryLedger(budget=min(caps) if caps else None, budgets=budgets)

    _server = "`stealkit serve`"  # what "cannot reach" asks about

    def _connect(self, url: str, key: str | None, *, batch_size: int, timeout: float, retries: int, backoff: float,
                 transport: httpx.BaseTransport | None, key_required: bool = True) -> None:
        """Check the address and settings and open the HTTP client (shared by the v1 and v2 oracles)."""
        if not url.startswith(("http://", "https://")):
            raise InputError(f"an HTTP victim address starts with http:// or https://, got {url!r}")
        if key_required and not key:
            raise InputError("an HTTP victim needs an API key: pass --key KEY")
        if batch_size < 1 or retries < 0 or timeout <= 0:
            raise InputError("batch_size must be >= 1, retries >= 0 and timeout > 0")
        self.url = url.rstrip("/")
        self.retries = int(retries)
        self.backoff = float(backoff)
        headers = {"User-Agent": "stealkit-httporacle"} | ({"Authorization": f"Bearer {key}"} if key else {})
        self._client = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, headers=headers)

    @property
    def ledger(self) -> QueryLedger:
        return self._ledger

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocols ---------------------------------------------------------------------------------
    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Answer ``[B, C, H, W]`` pixels in [0, 1]; charges B ``predict`` queries (refused whole if over)."""
        x = validate_images(x, self.input_shape)
        answer = self._batched(x, QueryKind.PREDICT, "/v1/predict", {"mode": self.mode.value})
        notify(self, x, answer)
        return answer

    def explain(self, x: torch.Tensor, method: ExplainMethod = "gradient", *, target: int | torch.Tensor | None = None,
                output: ExplainOutput = "logit", n_samples: int = 10, sigma: float = 0.1) -> torch.Tensor:
        """Input gradients or SmoothGrad maps from the server, charged at the server's price
        (:func:`~stealkit.oracle.explain_price`: one ``explain`` query per image, ``n_samples`` for SmoothGrad)."""
        if not self.info.get("explain", False):
            raise InputError("this API key may not ask for explanations (the server says explain = false)")
        args = check_explain_args(method, output, n_samples, sigma)
        x = validate_images(x, self.input_shape)
        price = explain_price(args)
        params: dict[str, Any] = {"method": args.method, "output": args.output, "n_samples": args.n_samples,
                                  "sigma": args.sigma}
        if target is None or isinstance(target, int) or torch.as_tensor(target).numel() == 1:
            if target is not None:
                params["target"] = int(torch.as_tensor(target).reshape(-1)[0])
            return self._batched(x, QueryKind.EXPLAIN, "/v1/explain", params, price=price)
        t = torch.as_tensor(target).long().reshape(-1)
        if t.numel() != x.shape[0]:
            raise InputError(f"target must be one class or one per image ({x.shape[0]}), got {t.numel()}")
        bodies = [{"inputs": x[i : i + self.batch_size].tolist(), **params, "target": t[i : i + self.batch_size].tolist()}
                  for i in range(0, x.shape[0], self.batch_size)]
        return self._send(QueryKind.EXPLAIN, "/v1/explain", [(len(b["inputs"]) * price, b) for b in bodies])

    def charges(self, limit: int = 100) -> list[dict[str, Any]]:
        """The server's log of this key's recent charges (newest last), to reconcile with :attr:`ledger`."""
        return list(self._request("GET", "/v1/charges", params={"limit": limit}).json()["charges"])

    # -- plumbing --------------------------------------------------------------------------------------
    def _batched(self, x: torch.Tensor, kind: QueryKind, path: str, params: dict[str, Any],
                 price: int = 1) -> torch.Tensor:
        chunks = [x[i : i + self.batch_size] for i in range(0, x.shape[0], self.batch_size)]
        return self._send(kind, path, [(int(c.shape[0]) * price, c) for c in chunks], params)

    def _send(self, kind: QueryKind, path: str, chunks: list[tuple[int, Any]],
              params: dict[str, Any] | None = None) -> torch.Tensor:
        """Charge the whole batch (``chunks`` are ``(cost, body)``), send it chunk by chunk, refund what the
        server did not bill. Each chunk carries its own ``Idempotency-Key``, so a retry after a dropped
        connection is answered from the server's log and never paid twice."""
        n = sum(size for size, _ in chunks)
        self._ledger.charge(kind, n)  # refused whole, nothing sent, if over this oracle's budget
        done = 0
        try:
            outs = []
            for size, chunk in chunks:
                request_id = uuid.uuid4().hex
                try:
                    resp = self._post(path, chunk, params, request_id)
                except StealkitError as exc:
                    if not isinstance(exc, BudgetExhausted | InputError) and self._billed(request_id):
                        done += size  # the server billed it, the answer never arrived: count what was billed
                        raise StealkitError(f"{exc}; the server billed {size} {kind.value} queries for it "
                                            f"(Idempotency-Key {request_id}), counted in this oracle's ledger") \
                            from None
                    raise
                done += size  # answered: charged even if the answer turns out malformed below
                outs.append(self._decode(resp, path, chunk))
                left = resp.headers.get("X-Stealkit-Queries-Left")
                if left is not None:
                    self._mirror(int(left), pending=n - done)
            return torch.cat(outs) if len(outs) > 1 else outs[0]
        except BudgetExhausted as exc:
            self._ledger.refund(kind, n - done)
            done = n
            self._mirror(exc.remaining, pending=0)
            raise
        finally:
            if done < n:
                self._ledger.refund(kind, n - done)

    def _post(self, path: str, chunk: Any, params: dict[str, Any] | None, request_id: str) -> httpx.Response:
        """Send one chunk: a tensor as ``.npy`` (options in the query string) or a JSON body."""
        headers = {"Accept": NPY, "Idempotency-Key": request_id}
        if isinstance(chunk, torch.Tensor):
            buf = io.BytesIO()
            np.save(buf, chunk.numpy(), allow_pickle=False)
            kw: dict[str, Any] = {"content": buf.getvalue(), "params": params, "headers": headers | {"Content-Type": NPY}}
        else:
            kw = {"content": json.dumps(chunk).encode(), "headers": headers | {"Content-Type": JSON}}
        return self._request("POST", path, idempotent=True, **kw)

    def _decode(self, resp: httpx.Response, path: str, chunk: Any) -> torch.Tensor:
        """The answer of one chunk, from the ``.npy`` body."""
        from stealkit.oracle.npy import read_npy

        return torch.from_numpy(read_npy(resp.content))  # header parsed under a lock: clients run in threads

    def _billed(self, request_id: str) -> bool:
        """Whether the server's log holds an answered charge for this request (after a failed delivery)."""
        try:
            return any(c.get("request_id") == request_id and c.get("status") == "answered"
                       for c in self.charges(limit=1000))
        except StealkitError:
            log.warning("cannot reconcile request %s with the server; assuming it was billed", request_id)
            return True

    def _mirror(self, server_left: int, *, pending: int) -> None:
        """Shrink the ledger's budget if the server has less left than the ledger thinks (``pending``: images
        charged to the ledger but not yet answered by the server)."""
        self._ledger.cap_budget(server_left, pending=pending)

    def _request(self, method: str, path: str, *, idempotent: bool = False, **kwargs: Any) -> httpx.Response:
        """Send with retries: 429/503 and refused connections always (nothing was charged); with
        ``idempotent`` (the request carries an Idempotency-Key) also dropped connections, timeouts and 5xx
        (the server answers a repeat from its log, uncharged)."""
        attempt = 0
        while True:
            try:
                resp = self._client.request(method, path, **kwargs)
            except httpx.ConnectError as exc:
                if attempt >= self.retries:
                    raise StealkitError(f"cannot reach {self.url}: {exc}; is {self._server} running?") from None
                self._sleep(attempt, None)
                attempt += 1
                continue
            except httpx.HTTPError as exc:
                if idempotent and attempt < self.retries:
                    self._sleep(attempt, None)
                    attempt += 1
                    continue
                raise StealkitError(f"request to {self.url}{path} failed: {exc!r}") from None
            retry = (429, 503) + ((409, 500, 502, 504) if idempotent else ())
            if resp.status_code in retry and attempt < self.retries:
                self._sleep(attempt, resp.headers.get("Retry-After"))
                attempt += 1
                continue
            if resp.status_code >= 400:
                self._raise(resp, path)
            return resp

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        wait = self.backoff * 2**attempt
        if retry_after is not None:
            with contextlib.suppress(ValueError):
                wait = max(wait, float(retry_after))
        log.info("server busy; retrying in %.2f s", wait)
        time.sleep(min(wait, 60.0))

    def _raise(self, resp: httpx.Response, path: str) -> None:
        try:
            err = resp.json()
            detail = err.get("detail") or err.get("error") or resp.text  # v2 servers answer {"error": ...}
        except ValueError:
            err, detail = {}, resp.text[:300]
        if resp.status_code == 402:
            left = err.get("queries_left")
            raise BudgetExhausted(f"the server refused: {detail}", remaining=int(left or 0))
        if resp.status_code == 401:
            raise InputError(f"the server refused the API key: {detail}; check --key")
        if resp.status_code in (400, 413, 415):
            raise InputError(f"the server refused the request to {path}: {detail}")
        raise StealkitError(f"{path} answered HTTP {resp.status_code}: {detail}")


__all__ = ["HttpOracle"]
