"""Guarantees of the server's charge path (issue 38, mutation testing; report: docs/mutation.md).

In-process, on a temporary SQLite file: a reservation charges exactly ``n`` or refuses having changed nothing,
it is settled once or refunded once, a crash's reservations are refunded at the next start, an idempotency key
replays the kept answer uncharged and refuses a different request, the audit sees any drift between counters
and log; and :class:`~stealkit.serve.service.Service` prices, reserves, refunds, encodes and settles (only when
the answer's bytes were handed to the connection) as its docstring says.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.responses import Response

from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import OutputMode, check_explain_args
from stealkit.oracle.ledger import digest_tensor
from stealkit.serve import payloads
from stealkit.serve import store as store_mod
from stealkit.serve.keys import parse_keys
from stealkit.serve.service import (
    MAX_REQUEST_ID,
    ApiError,
    Query,
    Service,
    SettleOnSend,
    _replay_headers,
    check_finite,
    check_request_id,
    encode,
)
from stealkit.serve.store import (
    ANSWER_RETENTION_S,
    IdempotencyMismatch,
    InFlight,
    Replay,
    Reservation,
    Store,
    Usage,
)

SECRET = "guarantee-Zx81QpLw6RtV3mNb7Yc4"
OTHER = "other-Zx81QpLw6RtV3mNb7Yc4Ab"
RATED = "rated-Zx81QpLw6RtV3mNb7Yc4Ab"
FREE = "free-Zx81QpLw6RtV3mNb7Yc4Abcd"


def make_store(tmp_path: Path, budget: int | None = 20, explain_budget: int | None = 6) -> Store:
    entry: dict[str, Any] = {"key": SECRET, "name": "k", "explain": True}
    if budget is not None:
        entry["budget"] = budget
    if explain_budget is not None:
        entry["explain_budget"] = explain_budget
    store = Store(tmp_path / "db.sqlite")
    store.sync_keys(parse_keys({"key": [entry, {"key": OTHER, "name": "o", "budget": 100}]}).keys.values())
    return store


def rows(store: Store, key: str = "k") -> list[dict[str, Any]]:
    return store.log_rows(key)


def counters(store: Store, key: str = "k") -> tuple[int, int]:
    u = store.usage(key)
    return u.predict, u.explain


# -- Usage: the budget rule on the stored counters ------------------------------------------------------


def test_usage_left_and_explain_left() -> None:
    u = Usage(predict=3, explain=2, budget=10, explain_budget=4, flagged=False)
    assert u.as_dict() == {"predict": 3, "explain": 2}
    assert u.left == 5 and u.remaining("predict") == 5
    assert u.explain_left == 2 and u.remaining("explain") == 2  # min(10 - 5, 4 - 2)
    assert Usage(0, 0, None, None, False).left is None and Usage(0, 0, None, None, False).explain_left is None
    assert Usage(1, 1, None, 3, False).explain_left == 2 and Usage(1, 1, None, 3, False).left is None


def test_usage_ledger_holds_the_counters_and_both_budgets() -> None:
    ledger = Usage(predict=3, explain=2, budget=10, explain_budget=4, flagged=False).ledger()
    assert ledger.as_dict() == {"predict": 3, "explain": 2}
    with pytest.raises(BudgetExhausted):
        ledger.charge("explain", 3)  # the explanation budget has 2 left
    ledger.charge("explain", 2)
    with pytest.raises(BudgetExhausted):
        ledger.charge("predict", 4)  # the total has 3 left
    unlimited = Usage(predict=3, explain=2, budget=None, explain_budget=None, flagged=False).ledger()
    unlimited.charge("explain", 10**6)
    assert unlimited.as_dict() == {"predict": 3, "explain": 10**6 + 2}


def test_usage_of_a_known_and_an_unknown_key(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    assert store.usage("k") == Usage(0, 0, 20, 6, False)
    store.set_flagged("k")
    assert store.usage("k").flagged is True and store.usage("o").flagged is False
    with pytest.raises(KeyError):
        store.usage("nobody")


# -- reserve / settle / refund ----------------------------------------------------------------------------


def test_reserve_charges_n_logs_a_reserved_row_and_returns_its_id(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    res = store.reserve("k", "predict", 4, mode="probs", input_digest="in1")
    assert isinstance(res, Reservation)
    assert res.usage == Usage(4, 0, 20, 6, False)
    assert counters(store) == (4, 0) and counters(store, "o") == (0, 0)
    (row,) = rows(store)
    assert row["id"] == res.row_id and row["status"] == "reserved" and row["n"] == 4 and row["kind"] == "predict"
    assert row["input_digest"] == "in1" and row["mode"] == "probs" and row["request_id"] is None
    res2 = store.reserve("k", "explain", 2, mode="gradient", input_digest="in2")
    assert isinstance(res2, Reservation) and res2.row_id == res.row_id + 1
    assert res2.usage == Usage(4, 2, 20, 6, False) and res2.usage.left == 14 and res2.usage.explain_left == 4
    assert store.audit()["k"]["consistent"]


def test_reserve_reports_flagged_and_budgets_of_the_key(tmp_path: Path) -> None:
    store = make_store(tmp_path, budget=30, explain_budget=7)
    store.set_flagged("k")
    res = store.reserve("k", "explain", 1, mode="gradient", input_digest="d")
    assert isinstance(res, Reservation) and res.usage == Usage(0, 1, 30, 7, True)


def test_reserve_over_budget_refuses_and_changes_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.reserve("k", "predict", 15, mode="probs", input_digest="a")
    with pytest.raises(BudgetExhausted):
        store.reserve("k", "predict", 6, mode="probs", input_digest="b")
    with pytest.raises(BudgetExhausted):
        store.reserve("k", "explain", 6, mode="gradient", input_digest="b")  # 5 left in total
    assert counters(store) == (15, 0) and len(rows(store)) == 1
    store.reserve("k", "explain", 5, mode="gradient", input_digest="c")
    assert store.usage("k").left == 0


def test_reserve_and_charge_an_unknown_key(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(KeyError):
        store.reserve("nobody", "predict", 1, mode="probs", input_digest="a")
    with pytest.raises(KeyError):
        store.charge("nobody", "predict", 1, mode="probs", input_digest="a", output_digest="b")


def test_settle_marks_answered_once(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    res = store.reserve("k", "predict", 2, mode="probs", input_digest="a")
    assert isinstance(res, Reservation)
    store.settle(res, "out-digest")
    (row,) = rows(store)
    assert row["status"] == "answered" and row["output_digest"] == "out-digest"
    store.refund(res, "too late")  # a settled row is never refunded
    assert counters(store) == (2, 0) and rows(store)[0]["status"] == "answered"


def test_settle_without_an_answer_to_keep(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    res = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="r1", fingerprint="f")
    assert isinstance(res, Reservation)
    store.settle(res, "o")  # an idempotency key, nothing to keep
    res2 = store.reserve("k", "predict", 1, mode="probs", input_digest="a")
    assert isinstance(res2, Reservation)
    store.settle(res2, "o", answer=Replay("application/json", "{}", b"x"))  # kept only under a request id
    assert rows(store)[1]["status"] == "answered"
    assert sqlite3.connect(tmp_path / "db.sqlite").execute("SELECT COUNT(*) FROM answers").fetchone() == (0,)


def test_refund_restores_the_counter_of_its_kind_and_keeps_the_reason(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    a = store.reserve("k", "predict", 3, mode="probs", input_digest="a")
    b = store.reserve("k", "explain", 4, mode="gradient", input_digest="b")
    o = store.reserve("o", "predict", 5, mode="probs", input_digest="c")
    assert isinstance(a, Reservation) and isinstance(b, Reservation) and isinstance(o, Reservation)
    store.refund(b, "x" * 400)
    assert counters(store) == (3, 0) and counters(store, "o") == (5, 0)
    assert rows(store)[1]["status"] == "refunded" and rows(store)[1]["note"] == "x" * 300
    store.refund(a.row_id, "by id")
    assert counters(store) == (0, 0) and rows(store)[0]["note"] == "by id"
    store.refund(a, "twice")  # refunded once only
    assert counters(store) == (0, 0) and rows(store)[0]["note"] == "by id"
    assert all(v["consistent"] for v in store.audit().values())


def test_recover_refunds_every_reservation_left_in_flight(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.charge("k", "predict", 2, mode="probs", input_digest="a", output_digest="b")
    store.reserve("k", "predict", 3, mode="probs", input_digest="c")
    store.reserve("k", "explain", 1, mode="gradient", input_digest="d")
    store.reserve("o", "predict", 7, mode="probs", input_digest="e")
    store.close()
    store = make_store(tmp_path)
    assert store.recover() == 3
    assert counters(store) == (2, 0) and counters(store, "o") == (0, 0)
    assert [r["status"] for r in rows(store)] == ["answered", "refunded", "refunded"]
    assert rows(store)[1]["note"].startswith("in flight")
    assert store.recover() == 0


def test_charge_reserves_settles_and_returns_the_usage(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    usage = store.charge("k", "predict", 6, mode="label", input_digest="i", output_digest="o")
    assert usage == Usage(6, 0, 20, 6, False)
    (row,) = rows(store)
    assert row["status"] == "answered" and row["output_digest"] == "o" and row["n"] == 6


# -- idempotency -----------------------------------------------------------------------------------------


def test_replay_of_a_kept_answer_is_uncharged(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    res = store.reserve("k", "predict", 2, mode="probs", input_digest="a", request_id="r1", fingerprint="f1")
    assert isinstance(res, Reservation)
    store.settle(res, "o", answer=Replay("application/x-npy", '{"x-stealkit-n": "2"}', b"body1"))
    again = store.reserve("k", "predict", 2, mode="probs", input_digest="a", request_id="r1", fingerprint="f1")
    assert again == Replay("application/x-npy", '{"x-stealkit-n": "2"}', b"body1")
    assert counters(store) == (2, 0) and len(rows(store)) == 1
    # the same request id of another key is another request
    other = store.reserve("o", "predict", 2, mode="probs", input_digest="a", request_id="r1", fingerprint="f1")
    assert isinstance(other, Reservation) and counters(store, "o") == (2, 0)


def test_replays_of_two_request_ids_both_kept(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for rid in ("r1", "r2"):
        res = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id=rid, fingerprint="f")
        assert isinstance(res, Reservation)
        store.settle(res, "o", answer=Replay("application/json", "{}", rid.encode()))
    for rid in ("r1", "r2"):
        again = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id=rid, fingerprint="f")
        assert again == Replay("application/json", "{}", rid.encode())
    assert counters(store) == (2, 0)


def test_answers_older_than_the_retention_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(tmp_path)
    now = [1_000_000.0]
    monkeypatch.setattr(store_mod.time, "time", lambda: now[0])
    res = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="old", fingerprint="f")
    assert isinstance(res, Reservation)
    store.settle(res, "o", answer=Replay("application/json", "{}", b"old"))
    now[0] += ANSWER_RETENTION_S + 1
    res = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="new", fingerprint="f")
    assert isinstance(res, Reservation)
    store.settle(res, "o", answer=Replay("application/json", "{}", b"new"))
    kept = sqlite3.connect(tmp_path / "db.sqlite").execute("SELECT request_id FROM answers").fetchall()
    assert kept == [("new",)]


def test_a_request_id_in_flight_raises_in_flight(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="r1", fingerprint="f")
    with pytest.raises(InFlight):
        store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="r1", fingerprint="f")
    assert counters(store) == (1, 0)


def test_a_refunded_request_id_may_be_retried_and_is_charged(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    res = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="r1", fingerprint="f")
    store.refund(res, "failed")  # type: ignore[arg-type]
    again = store.reserve("k", "predict", 1, mode="probs", input_digest="a", request_id="r1", fingerprint="f")
    assert isinstance(again, Reservation) and counters(store) == (1, 0)


@pytest.mark.parametrize("change", [{"kind": "explain"}, {"n": 3}, {"input_digest": "b"}, {"fingerprint": "g"},
                                    {"fingerprint": None}])
def test_a_request_id_reused_for_another_request_is_refused(tmp_path: Path, change: dict[str, Any]) -> None:
    store = make_store(tmp_path)
    first: dict[str, Any] = {"kind": "predict", "n": 2, "input_digest": "a", "fingerprint": "f"}
    rid = "r" * 50
    res = store.reserve("k", first["kind"], first["n"], mode="probs", input_digest=first["input_digest"],
                        request_id=rid, fingerprint=first["fingerprint"])
    assert isinstance(res, Reservation)
    store.settle(res, "o", answer=Replay("application/json", "{}", b"kept"))
    second = first | change
    with pytest.raises(IdempotencyMismatch) as info:
        store.reserve("k", second["kind"], second["n"], mode="probs", input_digest=second["input_digest"],
                      request_id=rid, fingerprint=second["fingerprint"])
    assert repr("r" * 40) in str(info.value) and repr("r" * 41) not in str(info.value)
    assert counters(store) == (2, 0) and len(rows(store)) == 1


# -- audit -----------------------------------------------------------------------------------------------


def test_audit_reports_counters_log_sums_and_drift(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.charge("k", "predict", 3, mode="probs", input_digest="a", output_digest="b")
    store.charge("o", "explain", 2, mode="gradient", input_digest="a", output_digest="b")
    res = store.reserve("k", "predict", 4, mode="probs", input_digest="a")
    store.refund(res, "x")  # type: ignore[arg-type]
    audit = store.audit()
    assert audit == {
        "k": {"predict_used": 3, "explain_used": 0, "log_predict": 3, "log_explain": 0, "consistent": True},
        "o": {"predict_used": 0, "explain_used": 2, "log_predict": 0, "log_explain": 2, "consistent": True}}
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    conn.execute("UPDATE keys SET predict_used = 4 WHERE key_id='k'")
    conn.execute("UPDATE keys SET explain_used = 1 WHERE key_id='o'")
    conn.commit()
    audit = store.audit()
    assert audit["k"]["consistent"] is False and audit["o"]["consistent"] is False
    assert audit["k"]["predict_used"] == 4 and audit["k"]["log_predict"] == 3


# -- the service ---------------------------------------------------------------------------------------


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def make_service(tmp_path: Path, budget: int = 50) -> Service:
    config = parse_keys({"key": [
        {"key": SECRET, "name": "k", "budget": budget, "explain": True, "explain_budget": 30},
        {"key": RATED, "name": "rated", "image_rate": 2.0},
        {"key": FREE, "name": "free", "mode": "label", "explain": True}]})
    spec = SimpleNamespace(input_shape=(1, 4, 4), num_classes=3, class_names=None, extra={}, arch="tiny")
    return Service(model=Tiny().eval(), spec=spec, config=config, store=Store(tmp_path / "db.sqlite"))


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


def predict(n: int, seed: int = 0) -> Query:
    return Query("predict", images(n, seed), OutputMode.PROBS)


def smoothgrad(n: int, n_samples: int = 4, target: torch.Tensor | None = None) -> Query:
    return Query("explain", images(n), OutputMode.PROBS,
                 explain=check_explain_args("smoothgrad", "logit", n_samples, 0.1), target=target)


def json_respond(q: Query) -> Any:
    return lambda out, res: encode(q, out, res, None)


def deliver(response: Response, *, gone: bool = False, fail: bool = False) -> list[dict[str, Any]]:
    """Run a (SettleOnSend) response as the ASGI server would; the messages it sent."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if fail:
            raise OSError("connection reset")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def client_gone() -> bool:
        return gone

    if isinstance(response, SettleOnSend):
        response.client_gone = client_gone
    asyncio.run(response({"type": "http", "method": "POST", "headers": []}, receive, send))
    return sent


def test_query_size_and_cost() -> None:
    assert predict(3).n == 3 and predict(3).cost == 3
    assert smoothgrad(3, n_samples=4).n == 3 and smoothgrad(3, n_samples=4).cost == 12
    gradient = Query("explain", images(5), OutputMode.PROBS, explain=check_explain_args("gradient"))
    assert gradient.cost == 5


def test_fingerprint_covers_everything_that_shapes_the_answer() -> None:
    base = smoothgrad(2, target=torch.tensor([1]))
    fp = base.fingerprint("v1 explain json")
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert fp == smoothgrad(2, target=torch.tensor([1])).fingerprint("v1 explain json")
    assert fp != base.fingerprint("v1 explain npy")
    assert fp != smoothgrad(2, n_samples=5, target=torch.tensor([1])).fingerprint("v1 explain json")
    assert fp != smoothgrad(2, target=torch.tensor([2])).fingerprint("v1 explain json")
    assert fp != smoothgrad(2).fingerprint("v1 explain json")
    p = predict(2)
    assert p.fingerprint("f") != Query("predict", images(2), OutputMode.LABEL).fingerprint("f")
    assert p.fingerprint("f") != predict(2, seed=1).fingerprint("f")
    # stable across processes and versions (a database keeps fingerprints across restarts): canonical JSON
    doc = {"endpoint": "predict", "mode": "probs", "images": digest_tensor(p.x), "explain": None, "target": None,
           "answer": "f"}
    assert p.fingerprint("f") == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def test_check_budget_refuses_an_exhausted_key_only(tmp_path: Path) -> None:
    service = make_service(tmp_path, budget=2)
    key, free = service.config.keys["k"], service.config.keys["free"]
    service.check_budget(key)
    service.check_budget(free)
    service.store.charge("k", "predict", 1, mode="probs", input_digest="a", output_digest="b")
    service.check_budget(key)  # one left
    service.store.charge("k", "predict", 1, mode="probs", input_digest="a", output_digest="b")
    with pytest.raises(ApiError) as info:
        service.check_budget(key)
    assert info.value.status == 402 and info.value.code == "budget_exhausted"
    assert info.value.extra == {"queries_left": 0}


def test_service_reserve_logs_mode_and_maps_refusals(tmp_path: Path) -> None:
    service = make_service(tmp_path, budget=20)
    key = service.config.keys["k"]
    res = service.reserve(key, predict(2), None)
    assert isinstance(res, Reservation) and res.usage.predict == 2
    res = service.reserve(key, smoothgrad(2, n_samples=3), None)
    assert isinstance(res, Reservation) and res.usage.explain == 6
    assert [(r["mode"], r["n"], r["fingerprint"]) for r in service.store.log_rows("k")] == [
        ("probs", 2, None), ("smoothgrad", 6, None)]
    with pytest.raises(ApiError) as info:
        service.reserve(key, predict(13), None)
    assert (info.value.status, info.value.code, info.value.extra) == (402, "budget_exhausted", {"queries_left": 12})
    service.reserve(key, predict(1), "rid", "form-a")
    with pytest.raises(ApiError) as info:
        service.reserve(key, predict(1), "rid", "form-a")
    assert (info.value.status, info.value.code, info.value.headers) == (409, "in_progress", {"Retry-After": "1"})
    with pytest.raises(ApiError) as info:
        service.reserve(key, predict(1), "rid", "form-b")  # same images, another answer form
    assert (info.value.status, info.value.code) == (422, "idempotency_key_reused")
    assert service.store.log_rows("k")[-1]["fingerprint"] == predict(1).fingerprint("form-a")


def test_run_charges_settles_on_send_and_replays(tmp_path: Path) -> None:
    service = make_service(tmp_path)
    key = service.config.keys["k"]
    q = predict(3)
    response = service.run(key, q, "rid-1", lambda out, res: encode(q, out, res, payloads.NPY), "form")
    assert isinstance(response, SettleOnSend)
    assert service.store.log_rows("k")[-1]["status"] == "reserved"  # not settled before it is sent
    sent = deliver(response)
    assert sent[0]["status"] == 200 and sent[1]["body"] == response.body
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    assert headers["x-stealkit-n"] == "3" and headers["content-type"] == payloads.NPY
    (row,) = service.store.log_rows("k")
    outputs = service.answer(key, q)[0]
    assert row["status"] == "answered" and row["output_digest"] == digest_tensor(outputs)
    assert row["input_digest"] == digest_tensor(q.x) and service.store.usage("k").predict == 3
    again = service.run(key, q, "rid-1", lambda out, res: encode(q, out, res, payloads.NPY), "form")
    assert not isinstance(again, SettleOnSend) and again.body == response.body
    assert again.media_type == payloads.NPY and again.headers["x-stealkit-replayed"] == "1"
    assert again.headers["x-stealkit-n"] == "3" and service.store.usage("k").predict == 3


def test_run_without_request_id_keeps_nothing(tmp_path: Path) -> None:
    service = make_service(tmp_path)
    key = service.config.keys["k"]
    q = predict(2)
    response = service.run(key, q, None, json_respond(q))
    deliver(response)
    assert json.loads(response.body)["n"] == 2 and service.store.log_rows("k")[-1]["status"] == "answered"
    assert sqlite3.connect(tmp_path / "db.sqlite").execute("SELECT COUNT(*) FROM answers").fetchone() == (0,)


def test_run_refunds_a_client_gone_or_a_failed_send(tmp_path: Path) -> None:
    service = make_service(tmp_path)
    key = service.config.keys["k"]
    q = predict(2)
    assert deliver(service.run(key, q, None, json_respond(q)), gone=True) == []
    row = service.store.log_rows("k")[-1]
    assert row["status"] == "refunded" and "disconnected" in row["note"]
    with pytest.raises(OSError, match="connection reset"):
        deliver(service.run(key, q, None, json_respond(q)), fail=True)
    row = service.store.log_rows("k")[-1]
    assert row["status"] == "refunded" and row["note"] == "not delivered: OSError: connection reset"
    assert service.store.usage("k").predict == 0 and service.store.audit()["k"]["consistent"]


def test_settle_on_send_refund_note_is_cut_at_200_characters() -> None:
    notes: list[str] = []
    response = SettleOnSend(Response(b"x"), settle=lambda: notes.append("settled"), refund=notes.append)

    async def send(message: dict[str, Any]) -> None:
        raise RuntimeError("e" * 300)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(RuntimeError):
        asyncio.run(response({"type": "http", "method": "POST", "headers": []}, receive, send))
    assert notes == ["not delivered: RuntimeError: " + "e" * 200]


def test_settle_on_send_without_client_check_sends_headers_and_settles() -> None:
    calls: list[str] = []
    inner = Response(b"payload", status_code=201, media_type="application/json", headers={"X-Stealkit-N": "4"})
    response = SettleOnSend(inner, settle=lambda: calls.append("settle"), refund=calls.append)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    asyncio.run(response({"type": "http", "method": "POST", "headers": []}, receive, send))
    assert calls == ["settle"] and sent[0]["status"] == 201 and sent[1]["body"] == b"payload"
    assert (b"x-stealkit-n", b"4") in sent[0]["headers"]


def test_run_refunds_and_logs_an_answer_it_cannot_produce(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    service = make_service(tmp_path)
    key = service.config.keys["k"]
    q = predict(2)

    def broken(out: torch.Tensor, res: Reservation) -> Response:
        raise ValueError("v" * 300)

    with caplog.at_level(logging.ERROR, logger="stealkit.serve.service"), pytest.raises(ApiError) as info:
        service.run(key, q, "rid", broken)
    assert info.value.status == 500 and info.value.code == "internal_error"
    assert "refunded 2 predict queries of key k" in caplog.text
    row = service.store.log_rows("k")[-1]
    assert row["status"] == "refunded" and row["note"] == "not delivered: ValueError: " + "v" * 200
    assert service.store.usage("k").predict == 0

    def bad_input(out: torch.Tensor, res: Reservation) -> Response:
        raise InputError("bad request")

    with pytest.raises(InputError, match="bad request"):
        service.run(key, q, None, bad_input)
    nan = torch.full((2, 3), float("nan"))
    with pytest.raises(ApiError) as info:
        service.run(key, q, None, lambda out, res: encode(q, nan, res, None))
    assert info.value.status == 500 and service.store.usage("k").predict == 0


def test_run_limits_images_and_runs_detection_for_predictions(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    service = make_service(tmp_path)
    seen: list[int] = []
    monkeypatch.setattr(service, "detect", lambda key, x, labels: seen.append(len(labels)))
    rated = service.config.keys["rated"]
    q = predict(2)
    service.run(rated, q, None, json_respond(q))
    assert seen == [2]
    with pytest.raises(ApiError) as info:
        service.run(rated, q, None, json_respond(q))
    assert info.value.status == 429 and service.store.usage("rated").predict == 2
    e = smoothgrad(1, n_samples=2)
    service.run(service.config.keys["free"], e, None, json_respond(e))
    assert seen == [2]  # explanations carry no labels


def test_encode_json_and_npy_answers(tmp_path: Path) -> None:
    service = make_service(tmp_path)
    out = torch.tensor([[0.25, 0.75, 0.0], [0.5, 0.5, 0.0]])
    q = predict(2)
    res = service.store.reserve("k", "predict", 2, mode="probs", input_digest="a")
    assert isinstance(res, Reservation)
    doc = json.loads(encode(q, out, res, None).body)
    assert doc == {"mode": "probs", "outputs": out.tolist(), "queries_left": 48,
                   "queries_used": {"predict": 2, "explain": 0}, "n": 2, "cost": 2}
    assert json.loads(encode(q, out, res, "application/json").body) == doc
    r = encode(q, out, res, payloads.NPY)
    assert r.media_type == payloads.NPY
    np.testing.assert_array_equal(np.load(io.BytesIO(r.body)), out.numpy())
    assert {k: v for k, v in r.headers.items() if k.startswith("x-stealkit")} == {
        "x-stealkit-mode": "probs", "x-stealkit-n": "2", "x-stealkit-cost": "2",
        "x-stealkit-queries-used": '{"predict": 2, "explain": 0}', "x-stealkit-queries-left": "48",
        "x-stealkit-explain-left": "30"}
    e = smoothgrad(1, n_samples=3)
    res = service.store.reserve("k", "explain", 3, mode="smoothgrad", input_digest="b")
    assert isinstance(res, Reservation)
    doc = json.loads(encode(e, out[:1], res, None).body)
    assert doc["mode"] == "smoothgrad" and doc["cost"] == 3 and doc["n"] == 1 and doc["explain_left"] == 27
    free = service.store.reserve("free", "predict", 2, mode="label", input_digest="c")
    assert isinstance(free, Reservation)
    r = encode(q, out, free, payloads.NPY)
    assert "x-stealkit-queries-left" not in r.headers and "x-stealkit-explain-left" not in r.headers
    assert "explain_left" not in json.loads(encode(q, out, free, None).body)
    with pytest.raises(ValueError, match="non-finite"):
        encode(q, torch.tensor([[float("inf"), 0.0, 0.0]]), res, None)


def test_check_finite() -> None:
    check_finite(torch.zeros(2, 3))
    check_finite(torch.tensor([[1, 2]], dtype=torch.long))
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="non-finite"):
            check_finite(torch.tensor([[0.0, bad]]))


def test_check_request_id() -> None:
    check_request_id(None)
    check_request_id("a")
    check_request_id("x" * MAX_REQUEST_ID)
    for bad in ("", "x" * (MAX_REQUEST_ID + 1), "tab\there", "new\nline"):
        with pytest.raises(InputError, match="Idempotency-Key"):
            check_request_id(bad)


def test_replay_headers_keep_only_the_api_headers() -> None:
    r = Response(b"{}", media_type="application/json",
                 headers={"X-Stealkit-N": "2", "Inference-Header-Content-Length": "17", "X-Other": "no"})
    assert _replay_headers(r) == {"x-stealkit-n": "2", "inference-header-content-length": "17"}
