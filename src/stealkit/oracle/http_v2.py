"""An oracle over any server speaking the Open Inference Protocol (v2 REST: KServe, Triton, MLServer, and
``stealkit serve --protocol v2``).

Address: ``v2+http://host:port`` with the model's name given apart (``--model NAME``), or the model's own URL
``http://host:port/v2/models/NAME`` (``v2+`` optional there). :class:`V2HttpOracle` reads the model's
metadata (``GET /v2/models/NAME``): one input, an image tensor ``[-1, C, H, W]`` of datatype FP32, FP64, FP16
or UINT8 (UINT8: pixels are sent as ``round(255 x)``), and its outputs. Each query is one
``POST /v2/models/NAME/infer`` per batch of at most ``batch_size`` images, as JSON
(``{"id", "inputs": [{"name", "shape": [N, C, H, W], "datatype", "data": [...]}], "outputs": [{"name"}]}``).

Which output answers which ``--mode``:

- an output named like the mode (``logits``, ``probs``, ``topk``, ``label``: what ``stealkit serve --protocol
  v2`` offers, one per mode the key may use) is asked for by name;
- else a label-only server, one integer output ``[-1]`` or ``[-1, 1]``, answers ``--mode label`` (and only that);
- else one float output ``[-1, K]`` is read as the mode asked for (``probs`` or ``logits``: you say which the
  server returns; one named ``logits`` answers ``--mode probs`` through a softmax, one named ``probs`` never
  answers ``--mode logits``), and as its argmax for ``--mode label``. ``topk`` needs an output named ``topk``.

Budget, retries and errors are :class:`~stealkit.oracle.http.HttpOracle`'s: each image is charged to the ledger
before it is sent and refunded when the server refuses the request (any 4xx/5xx answer), so a refused request
costs nothing. An answer of the wrong shape or datatype stays charged (the server answered and logged it) and
raises one line naming the endpoint and what was expected. Against ``stealkit serve`` (metadata platform
``stealkit``) the ledger also mirrors the key's budget (``X-Stealkit-Queries-Left``), every request carries an
``Idempotency-Key`` and dropped connections are retried and reconciled with ``/v1/charges``; a generic v2
server knows neither, so only 429/503 and refused connections are retried (never a request it may have answered).
Explanations come from the second model ``NAME-explain`` that ``stealkit serve --protocol v2`` adds.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

import httpx
import torch

from stealkit.errors import InputError, StealkitError
from stealkit.oracle.base import (
    ExplainMethod,
    ExplainOutput,
    OutputMode,
    check_explain_args,
    explain_price,
    validate_images,
)
from stealkit.oracle.http import HttpOracle
from stealkit.oracle.ledger import QueryKind, QueryLedger
from stealkit.oracle.observe import notify

SCHEME = "v2+"
FLOAT_TYPES = frozenset({"FP32", "FP64", "FP16"})
INPUT_TYPES = ("FP32", "FP64", "FP16", "UINT8")
INT_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
EXPLAIN_SUFFIX = "-explain"


def is_v2(victim: str) -> bool:
    """Whether a victim string names a v2 endpoint (``v2+http(s)://...`` or ``http(s)://.../v2/models/NAME``)."""
    if victim.startswith(SCHEME):
        return True
    return victim.startswith(("http://", "https://")) and "/v2/models/" in urllib.parse.urlsplit(victim).path


def v2_address(url: str, model: str | None = None, num_classes: int | None = None) -> str:
    """The canonical victim string ``v2+http://host:port/v2/models/NAME[?num_classes=K]`` (``model`` is the
    ``--model`` flag, needed when ``url`` does not name the model)."""
    base, name, old_k = parse_v2_address(url, model, need_model=model is not None or "/v2/models/" in url)
    k = num_classes if num_classes is not None else old_k
    query = f"?num_classes={k}" if k is not None else ""
    if not name:  # no model yet: opening it says "pass --model NAME"
        return f"{SCHEME}{base}{query}"
    return f"{SCHEME}{base}/v2/models/{urllib.parse.quote(name, safe='')}{query}"


def parse_v2_address(victim: str, model: str | None = None, *, need_model: bool = True
                     ) -> tuple[str, str | None, int | None]:
    """``(base URL, model name, num_classes)`` from a victim string; one error line when it names no model."""
    url = victim[len(SCHEME):] if victim.startswith(SCHEME) else victim
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"a v2 endpoint is v2+http://host:port (or https), got {victim!r}")
    path = parts.path.rstrip("/")
    name: str | None = None
    if path:
        head, sep, tail = path.partition("/v2/models/")
        if not sep or head or not tail or "/" in tail:
            raise InputError(f"{victim}: a v2 address is v2+http://host:port or http://host:port/v2/models/NAME")
        name = urllib.parse.unquote(tail)
    if model is not None and name is not None and model != name:
        raise InputError(f"{victim} names model {name!r} but --model says {model!r}")
    name = model or name
    if need_model and not name:
        raise InputError(f"{victim}: which model? pass --model NAME (a v2 server may serve several; "
                         "GET /v2/models/NAME must answer)")
    options = dict(urllib.parse.parse_qsl(parts.query))
    unknown = sorted(set(options) - {"num_classes"})
    if unknown:
        raise InputError(f"{victim}: unknown option(s) {', '.join(unknown)}; a v2 endpoint takes only num_classes")
    k = options.get("num_classes")
    if k is not None and (not k.isdigit() or int(k) < 2):
        raise InputError(f"{victim}: num_classes must be an integer >= 2, got {k!r}")
    return f"{parts.scheme}://{parts.netloc}", name, int(k) if k is not None else None


class V2HttpOracle(HttpOracle):
    """A remote victim behind the v2 protocol (see the module docstring for outputs and modes).

    Args:
        url: ``v2+http://host:port``, ``http://host:port`` or ``http://host:port/v2/models/NAME``.
        model: the model's name (when ``url`` does not end in it).
        key: sent as ``Authorization: Bearer KEY`` when given (``stealkit serve`` needs one; others may not).
        budget: at most this many images from this oracle (with ``stealkit serve``, the key's budget caps it too).
        num_classes: only for a label-only server whose metadata does not say how many classes there are.
    """

    _server = "the v2 server"

    def __init__(self, url: str, *, model: str | None = None, key: str | None = None,
                 mode: str | OutputMode | None = None, budget: int | None = None, batch_size: int = 256,
                 num_classes: int | None = None, timeout: float = 60.0, retries: int = 5, backoff: float = 0.25,
                 transport: httpx.BaseTransport | None = None) -> None:
        base, name, k = parse_v2_address(url, model)
        self._connect(base, key, batch_size=batch_size, timeout=timeout, retries=retries, backoff=backoff,
                      transport=transport, key_required=False)
        self.model_name: str = name  # type: ignore[assignment]
        self.path = f"/v2/models/{urllib.parse.quote(self.model_name, safe='')}"
        self.endpoint = f"{self.url}{self.path}"
        meta = self._metadata(self.path)
        params = meta.get("parameters") if isinstance(meta.get("parameters"), dict) else {}
        self.info: dict[str, Any] = {**params, "name": self.model_name, "platform": meta.get("platform")}
        self.stealkit = meta.get("platform") == "stealkit"
        self.input_name, self.input_datatype, self.input_shape = self._read_input(meta)
        self.outputs = self._read_outputs(meta)
        self.num_classes = self._classes(num_classes if num_classes is not None else k, params)
        self.dataset: str | None = params.get("dataset")
        self.split_seed = int(params.get("split_seed") or 0)
        self.classes: list[str] = list(params.get("classes") or [])
        self.mode = self._choose_mode(mode, params)
        self.output_name, self.output_kind = self._choose_output(self.mode)
        self.batch_size = min(int(batch_size), int(params.get("max_batch") or batch_size))
        caps = [b for b in (budget, params.get("queries_left")) if b is not None]
        budgets = {"explain": int(params["explain_left"])} if params.get("explain_left") is not None else {}
        self._ledger = QueryLedger(budget=min(caps) if caps else None, budgets=budgets)

    # -- metadata --------------------------------------------------------------------------------------
    def _metadata(self, path: str) -> dict[str, Any]:
        where = f"{self.url}{path}"
        resp = self._request("GET", path)  # retried like a query: 429/503 and refused connections
        try:
            meta = resp.json()
        except ValueError:
            meta = None
        if not isinstance(meta, dict) or not isinstance(meta.get("inputs"), list) \
                or not isinstance(meta.get("outputs"), list):
            raise StealkitError(f"{where} answered no v2 model metadata (expected a JSON object with 'inputs' "
                                "and 'outputs' lists)")
        return meta

    def _read_input(self, meta: dict[str, Any]) -> tuple[str, str, tuple[int, int, int]]:
        inputs = meta["inputs"]
        if len(inputs) != 1:
            raise InputError(f"{self.endpoint}: the model has {len(inputs)} inputs; stealkit expects one image tensor")
        spec = inputs[0]
        shape, dtype = list(spec.get("shape") or []), str(spec.get("datatype", ""))
        if len(shape) != 4 or not all(isinstance(s, int) and s > 0 for s in shape[1:]) or dtype not in INPUT_TYPES:
            raise InputError(f"{self.endpoint}: input {spec.get('name')!r} is {dtype} {shape}; stealkit expects an "
                             f"image tensor [-1, C, H, W] of {'/'.join(INPUT_TYPES)}")
        return str(spec["name"]), dtype, (int(shape[1]), int(shape[2]), int(shape[3]))

    def _read_outputs(self, meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
        outputs = {str(o.get("name")): o for o in meta["outputs"] if isinstance(o, dict)}
        if not outputs:
            raise InputError(f"{self.endpoint}: the model lists no outputs")
        return outputs

    def _classes(self, given: int | None, params: dict[str, Any]) -> int:
        for o in self.outputs.values():
            shape = o.get("shape") or []
            if str(o.get("datatype")) in FLOAT_TYPES and len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 1:
                if given is not None and given != shape[1]:
                    raise InputError(f"{self.endpoint}: output {o.get('name')!r} has {shape[1]} classes, "
                                     f"not {given} (--num-classes)")
                return int(shape[1])
        k = given if given is not None else params.get("num_classes")
        if k is None:
            raise InputError(f"{self.endpoint}: the model's outputs {list(self.outputs)} do not say how many classes "
                             "it has; pass --num-classes K")
        return int(k)

    def _choose_mode(self, mode: str | OutputMode | None, params: dict[str, Any]) -> OutputMode:
        if self.stealkit:
            allowed = [OutputMode.parse(m) for m in params.get("allowed_modes", [params.get("mode", "probs")])]
            chosen = OutputMode.parse(mode) if mode is not None else OutputMode.parse(params.get("mode", "probs"))
            if chosen not in allowed:
                raise InputError(f"this API key may ask for modes {[m.value for m in allowed]}, not {chosen.value!r}; "
                                 f"pass --mode {allowed[0].value}")
            return chosen
        if mode is not None:
            return OutputMode.parse(mode)
        named = [m for m in OutputMode if m.value in self.outputs]
        if named:
            return named[0]
        return OutputMode.LABEL if any(_is_label(o) for o in self.outputs.values()) else OutputMode.PROBS

    def _choose_output(self, mode: OutputMode) -> tuple[str, str]:
        """The output to ask for and how to read it: ``"as-is"``, ``"label"`` (integers), ``"argmax"`` (labels
        from scores) or ``"softmax"`` (probabilities from an output named ``logits``)."""
        if mode.value in self.outputs:
            return mode.value, "label" if mode is OutputMode.LABEL else "as-is"
        labels = [n for n, o in self.outputs.items() if _is_label(o)]
        scores = [n for n, o in self.outputs.items() if _is_scores(o)]
        described = ", ".join(f"{n} {o.get('datatype')} {o.get('shape')}" for n, o in self.outputs.items())
        if mode is OutputMode.LABEL and len(labels) == 1:
            return labels[0], "label"
        if mode is OutputMode.LABEL and len(scores) == 1:
            return scores[0], "argmax"
        if mode is OutputMode.PROBS and OutputMode.LOGITS.value in scores:
            return OutputMode.LOGITS.value, "softmax"
        if mode is OutputMode.LOGITS and scores == [OutputMode.PROBS.value]:
            raise InputError(f"{self.endpoint} answers probabilities ({described}), not logits; pass --mode probs")
        if mode in (OutputMode.PROBS, OutputMode.LOGITS) and len(scores) == 1:
            return scores[0], "as-is"
        if labels and not scores:
            raise InputError(f"{self.endpoint} answers labels only ({described}); pass --mode label")
        raise InputError(f"{self.endpoint}: no output answers --mode {mode.value} (outputs: {described}); expected "
                         f"one named {mode.value!r}, or a single float [-1, K] output (probs/logits/label) or "
                         "integer [-1] output (label)")

    # -- the protocols ---------------------------------------------------------------------------------
    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Answer ``[B, C, H, W]`` pixels in [0, 1]; charges B ``predict`` queries (refused whole if over)."""
        x = validate_images(x, self.input_shape)
        answer = self._batched(x, QueryKind.PREDICT, f"{self.path}/infer", {})
        notify(self, x, answer)
        return answer

    def explain(self, x: torch.Tensor, method: ExplainMethod = "gradient", *, target: int | torch.Tensor | None = None,
                output: ExplainOutput = "logit", n_samples: int = 10, sigma: float = 0.1) -> torch.Tensor:
        """Input gradients or SmoothGrad maps from ``NAME-explain`` (``stealkit serve --protocol v2`` only),
        charged at the server's price (:func:`~stealkit.oracle.explain_price`)."""
        if not self.stealkit or not self.info.get("explain", False):
            raise InputError(f"{self.endpoint} offers no explanations: they come from the model "
                             f"{self.model_name}{EXPLAIN_SUFFIX} of `stealkit serve --protocol v2`, for keys with "
                             "explain = true")
        args = check_explain_args(method, output, n_samples, sigma)
        x = validate_images(x, self.input_shape)
        t = None if target is None else torch.as_tensor(target).long().reshape(-1)
        if t is not None and t.numel() not in (1, x.shape[0]):
            raise InputError(f"target must be one class or one per image ({x.shape[0]}), got {t.numel()}")
        if t is not None and t.numel() == 1:
            t = t.expand(x.shape[0])
        params = {"method": args.method, "output": args.output, "n_samples": args.n_samples, "sigma": args.sigma}
        price = explain_price(args)
        chunks = [(int(x[i : i + self.batch_size].shape[0]) * price,
                   (x[i : i + self.batch_size], None if t is None else t[i : i + self.batch_size]))
                  for i in range(0, x.shape[0], self.batch_size)]
        return self._send(QueryKind.EXPLAIN, f"{self.path}{EXPLAIN_SUFFIX}/infer", chunks, params)

    def charges(self, limit: int = 100) -> list[dict[str, Any]]:
        if not self.stealkit:
            raise StealkitError(f"{self.url} is not `stealkit serve`: a v2 server keeps no charges log to read")
        return super().charges(limit)

    # -- plumbing --------------------------------------------------------------------------------------
    def _post(self, path: str, chunk: Any, params: dict[str, Any] | None, request_id: str) -> httpx.Response:
        x, target = chunk if isinstance(chunk, tuple) else (chunk, None)
        inputs = [{"name": self.input_name, "shape": list(x.shape), "datatype": self.input_datatype,
                   "data": _pixels(x, self.input_datatype)}]
        if target is not None:
            inputs.append({"name": "target", "shape": [int(target.numel())], "datatype": "INT64",
                           "data": target.tolist()})
        body: dict[str, Any] = {"id": request_id, "inputs": inputs}
        if params:
            body["parameters"] = params
        if path.endswith(f"{EXPLAIN_SUFFIX}/infer"):
            body["outputs"] = [{"name": "explanation"}]
        else:
            body["outputs"] = [{"name": self.output_name}]
        headers = {"Content-Type": "application/json"}
        if self.stealkit:
            headers["Idempotency-Key"] = request_id
        return self._request("POST", path, idempotent=self.stealkit, json=body, headers=headers)

    def _decode(self, resp: httpx.Response, path: str, chunk: Any) -> torch.Tensor:
        """Check and read the one output asked for; a wrong name, shape or datatype is one error line."""
        x = chunk[0] if isinstance(chunk, tuple) else chunk
        n = int(x.shape[0])
        explain = path.endswith(f"{EXPLAIN_SUFFIX}/infer")
        name = "explanation" if explain else self.output_name
        where = f"{self.url}{path}"
        try:
            doc = resp.json()
            out = next(o for o in doc["outputs"] if o.get("name") == name)
            shape, dtype, data = [int(s) for s in out["shape"]], str(out["datatype"]), out["data"]
        except (ValueError, KeyError, TypeError, StopIteration):
            raise StealkitError(f"{where} answered no output {name!r} with shape, datatype and data (expected a v2 "
                                f"inference response; these {n} images stay charged: the server answered)") from None
        if explain:
            want = [n, *self.input_shape]
        elif self.output_kind == "label":
            want = [n] if len(shape) == 1 else [n, 1]
        else:
            want = [n, self.num_classes]
        kind_ok = dtype in INT_TYPES if self.output_kind == "label" else dtype in FLOAT_TYPES
        if shape != want or not kind_ok or not isinstance(data, list) or _flat_len(data) != math.prod(want):
            expected = "an integer" if self.output_kind == "label" else "a float"
            raise StealkitError(f"{where} answered output {name!r} as {dtype} {shape}; expected {expected} tensor "
                                f"{want} (these {n} images stay charged: the server answered)")
        values = torch.tensor(data)
        if self.output_kind == "label":
            return values.long().reshape(n)
        values = values.float().reshape(want)
        if self.output_kind == "softmax":
            return torch.softmax(values, dim=1)
        return values.argmax(1) if self.output_kind == "argmax" else values

    def _raise(self, resp: httpx.Response, path: str) -> None:
        """One line naming the endpoint and what it expected; a 402 (stealkit's budget) as BudgetExhausted."""
        where, code, detail = f"{self.url}{path}", resp.status_code, _error_text(resp)
        if code in (401, 402):
            super()._raise(resp, path)
        if code == 403:
            raise InputError(f"{where} refused this key (HTTP 403: {detail})")
        if code == 404 and path == self.path:
            raise InputError(f"{where}: the server has no model {self.model_name!r} (HTTP 404: {detail}); "
                             "check --model")
        if code == 404:
            raise InputError(f"{where}: no such model or endpoint (HTTP 404: {detail}); check --model")
        if 400 <= code < 500:
            raise InputError(f"{where} refused the request (HTTP {code}: {detail}); it expects input "
                             f"{self.input_name!r} {self.input_datatype} [N, {', '.join(map(str, self.input_shape))}]"
                             if hasattr(self, "input_name") else f"{where} refused the request (HTTP {code}: {detail})")
        raise StealkitError(f"{where} answered HTTP {code}: {detail}")

    def _billed(self, request_id: str) -> bool:
        """A generic v2 server keeps no log to ask: a failed request is taken as not answered."""
        return super()._billed(request_id) if self.stealkit else False


def _is_label(o: dict[str, Any]) -> bool:
    shape = o.get("shape") or []
    return str(o.get("datatype")) in INT_TYPES and (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1))


def _is_scores(o: dict[str, Any]) -> bool:
    shape = o.get("shape") or []
    return str(o.get("datatype")) in FLOAT_TYPES and len(shape) == 2


def _pixels(x: torch.Tensor, datatype: str) -> list[Any]:
    flat = x.detach().cpu().reshape(-1)
    if datatype == "UINT8":
        return (flat * 255).round().to(torch.uint8).tolist()
    return flat.to(torch.float64 if datatype == "FP64" else torch.float32).tolist()


def _flat_len(data: list[Any]) -> int:
    """Elements of a row-major tensor sent flat or nested (both are valid v2 ``data``)."""
    return sum(_flat_len(d) if isinstance(d, list) else 1 for d in data)


def _error_text(resp: httpx.Response) -> str:
    try:
        doc = resp.json()
        return str(doc.get("error") or doc.get("detail") or doc)[:200]
    except ValueError:
        return resp.text[:200]


__all__ = ["V2HttpOracle", "is_v2", "parse_v2_address", "v2_address"]
