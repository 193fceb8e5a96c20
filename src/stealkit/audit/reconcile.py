"""The audit's queries reconciled with the server's own count: its ledgers (summed over its parts) against what
the server counted over the audit (``stealkit serve``'s ``/v1/charges``, a v2 model's ``queries_used`` metadata,
or Triton's statistics extension), or why they cannot be reconciled."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.errors import InputError

if TYPE_CHECKING:
    from stealkit.audit.parts import Part


def server_usage(victim: str, key: str | None) -> dict[str, int] | None:
    """The key's queries used as ``stealkit serve`` counts them (``GET /v1/charges``: ``queries_used``), or
    ``None`` for a victim that is not a stealkit /v1 server (a local model; a v2 endpoint: :func:`v2_usage`)."""
    import httpx

    from stealkit.oracle.http_v2 import is_v2
    from stealkit.oracle.victim import is_url

    if not is_url(victim) or is_v2(victim):
        return None
    try:
        r = httpx.get(victim.rstrip("/") + "/v1/charges", params={"limit": 1},
                      headers={"authorization": f"Bearer {key}"} if key else {}, timeout=30)
    except httpx.HTTPError as exc:
        raise InputError(f"{victim} does not answer ({type(exc).__name__}); is the server running?") from None
    if r.status_code != 200:
        return None
    used = r.json().get("queries_used") or {}
    return {k: int(v) for k, v in used.items()}


def reconcile(before: dict[str, int] | None, after: dict[str, int] | None, spent: dict[str, int]) -> dict[str, Any]:
    """The audit's ledgers against the server's count over the audit: equal, or the difference."""
    if before is None or after is None:
        return {"server": None, "note": "the victim is not a stealkit server: no /v1/charges to reconcile with"}
    server = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    kinds = set(server) | set(spent)
    equal = all(server.get(k, 0) == spent.get(k, 0) for k in kinds)
    return {"server": server, "audit": spent, "equal": equal}


#: where each count comes from, and what it counts (the report and summary.json say which one was read)
V1_CHARGES = "GET /v1/charges: queries_used of this key"
V2_METADATA = "GET /v2/models/NAME: the model metadata's parameters.queries_used of this key (stealkit serve)"
V2_STATS = ("GET /v2/models/NAME/stats: the statistics extension's inference_count (Triton): every client's "
            "inferences of this model, not this key's only")


def server_count(victim: str, key: str | None) -> dict[str, Any]:
    """The server's own count of the queries it answered (``{"source": ..., "counts": {kind: n}}``), from the
    first of: ``stealkit serve``'s ``/v1/charges`` (a /v1 victim); for a v2 (Open Inference Protocol) victim,
    the model metadata's ``parameters.queries_used`` (what ``stealkit serve --protocol v2`` gives a key), else
    the statistics extension Triton serves (``GET /v2/models/NAME/stats``, model-wide). ``counts`` is ``None``
    where the server exposes none of them (the Open Inference Protocol itself has no count): not reconcilable."""
    from stealkit.oracle.http_v2 import is_v2

    if is_v2(victim):
        return v2_usage(victim, key)
    used = server_usage(victim, key)
    return {"source": V1_CHARGES if used is not None else None, "counts": used}


def v2_usage(victim: str, key: str | None, transport: Any = None) -> dict[str, Any]:
    """:func:`server_count` of a v2 endpoint (``transport``: an httpx transport, for a test's fake server)."""
    import urllib.parse

    import httpx

    from stealkit.oracle.http_v2 import parse_v2_address

    base, name, _ = parse_v2_address(victim)
    path = f"/v2/models/{urllib.parse.quote(str(name), safe='')}"
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30, transport=transport) as client:
            meta = client.get(path)
            params = meta.json().get("parameters") if meta.status_code == 200 else None
            used = params.get("queries_used") if isinstance(params, dict) else None
            if isinstance(used, dict) and all(isinstance(v, int) for v in used.values()):
                return {"source": V2_METADATA, "counts": {str(k): int(v) for k, v in used.items()}}
            stats = client.get(path + "/stats")
            rows = stats.json().get("model_stats") if stats.status_code == 200 else None
            if isinstance(rows, list) and rows and all(isinstance(r, dict) and isinstance(r.get("inference_count"),
                                                                                          int) for r in rows):
                return {"source": V2_STATS, "counts": {"predict": sum(int(r["inference_count"]) for r in rows)}}
    except httpx.HTTPError as exc:
        raise InputError(f"{victim} does not answer ({type(exc).__name__}); is the server running?") from None
    except ValueError:  # a body that is not JSON: no count there
        pass
    return {"source": None, "counts": None}


#: the server's count when an audit resumed, and the ledgers of the parts finished by then
RESUMED_USAGE = "server_usage_resumed.json"


def record_server_count(path: Path, parts: Sequence[Part], victim: str, key: str | None) -> None:
    """Write the server's count (:func:`server_count`) at the audit's first start, and on each resume beside the
    ledgers of the parts finished by then: what the server counted beyond them was spent by a part stopped
    midway (run again from its start), which no finished ledger holds."""
    from stealkit.fsutil import atomic_write_json

    first = path / "server_usage_before.json"
    if not first.exists():
        atomic_write_json(first, server_count(victim, key))
        return
    from stealkit.audit.execute import load_done

    done = list(load_done(path / "parts", parts).values())
    evaluation = path / "evaluation.json"
    if evaluation.exists():  # the test split's labels, bought before the stop
        done.append(json.loads(evaluation.read_text(encoding="utf-8")))
    atomic_write_json(path / RESUMED_USAGE, server_count(victim, key) | {"finished": _ledgers(done)})


def _ledgers(results: Any) -> dict[str, int]:
    spent: dict[str, int] = {}
    for r in results:
        for k, v in r["queries"].items():
            spent[k] = spent.get(k, 0) + int(v)
    return spent


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def reconcile_audit(before: dict[str, Any], after: dict[str, Any], results: Sequence[dict[str, Any]],
                    resumed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The audit's ledgers (summed over its parts) against the server's count over the audit (:func:`server_count`
    at the start and at the end), or why they cannot be reconciled. ``resumed``: the count at the last resume and
    the ledgers finished by then; the server's count then, beyond the start's and those ledgers, is ``stopped``:
    queries a part stopped midway spent before it was run again (they are in ``server``, not in ``audit``)."""
    spent = _ledgers(results)
    if before.get("counts") is None or after.get("counts") is None or before.get("source") != after.get("source"):
        return {"server": None, "audit": spent, "equal": None, "source": None,
                "note": "not reconcilable: the server exposes no count of the queries it answered (no stealkit "
                        "/v1/charges, no queries_used in its v2 model metadata, no v2 statistics extension); the "
                        "audit's ledgers are its only count"}
    stopped: dict[str, int] = {}
    if resumed is not None and resumed.get("counts") is not None and resumed.get("source") == before["source"]:
        finished = resumed.get("finished") or {}
        stopped = {k: resumed["counts"].get(k, 0) - before["counts"].get(k, 0) - finished.get(k, 0)
                   for k in set(resumed["counts"]) | set(before["counts"]) | set(finished)}
    if before["source"] == V2_STATS:  # the statistics extension counts inferences, not explanations
        spent, stopped = {"predict": spent.get("predict", 0)}, {"predict": stopped.get("predict", 0)}
    replayed = sum(int(r.get("replayed") or 0) for r in results)  # answers of stopped attempts, in the ledgers
    if replayed:
        stopped["predict"] = stopped.get("predict", 0) - replayed
    paid = {k: spent.get(k, 0) + stopped.get(k, 0) for k in set(spent) | set(stopped)}
    rec = reconcile(before["counts"], after["counts"], paid)
    return rec | {"audit": spent, "source": before["source"], "replayed": replayed,
                  "stopped": {k: v for k, v in stopped.items() if v} or None}


def reconciliation_line(rec: dict[str, Any]) -> str:
    """The reconciliation in one sentence (the terminal and the report)."""
    if rec.get("server") is None:
        return f"queries {rec.get('note', 'not reconcilable')}: {rec.get('audit')}"
    verdict = "equal" if rec["equal"] else ("NOT EQUAL (another client may share the key"
                                            + (" or the model" if rec.get("source") == V2_STATS else "") + ")")
    stopped = (f" + spent by a part stopped midway and run again: {rec['stopped']}" if rec.get("stopped") else "")
    if rec.get("replayed"):
        stopped += (f" ({rec['replayed']:,} of them paid by a part stopped midway and given back from its answer "
                    "journal)")
    return (f"server's count over the audit ({rec.get('source') or V1_CHARGES}; at the end less at the start): "
            f"{rec['server']}; the audit's ledgers: {rec['audit']}{stopped}: {verdict}")
