"""Guarantees of the query ledger (issue 38: tests that kill the mutants that survived the older tests).

Each test states a promise of :mod:`stealkit.oracle.ledger`: budgets are validated, a negative charge is refused,
a refused charge changes nothing, a refund never goes below zero, a cap never raises a budget, and the budget
rule is exact at its edges. See docs/mutation.md.
"""

from __future__ import annotations

import json

import pytest

from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle.ledger import QueryLedger, budget_left


@pytest.mark.parametrize("bad", [-1, 1.5, "10"])
def test_a_total_budget_must_be_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(InputError):
        QueryLedger(budget=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2.0])
def test_a_per_kind_budget_must_be_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(InputError):
        QueryLedger(budgets={"explain": bad})  # type: ignore[dict-item]


def test_a_zero_budget_is_legal_and_allows_nothing() -> None:
    ledger = QueryLedger(budget=0, budgets={"explain": 0})
    assert ledger.remaining() == 0 and ledger.remaining("explain") == 0
    with pytest.raises(BudgetExhausted):
        ledger.charge("predict", 1)
    ledger.charge("predict", 0)  # an empty request costs nothing and is allowed
    assert ledger.total == 0


def test_a_per_kind_budget_for_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InputError):
        QueryLedger(budgets={"predictions": 5})


def test_a_negative_charge_is_refused_and_changes_nothing() -> None:
    ledger = QueryLedger(budget=10)
    ledger.charge("predict", 4)
    with pytest.raises(InputError):
        ledger.charge("predict", -3)  # would otherwise hand back budget
    assert ledger.as_dict()["predict"] == 4 and ledger.remaining() == 6


def test_a_charge_that_exactly_fills_the_budget_is_allowed_and_one_more_is_refused_whole() -> None:
    ledger = QueryLedger(budget=5, log=True)
    ledger.charge("predict", 3)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("predict", 3)
    assert info.value.remaining == 2 and info.value.requested == 3
    assert ledger.total == 3 and len(ledger.records) == 1  # refused whole: not counted, not logged
    ledger.charge("predict", 2)
    assert ledger.total == 5 and ledger.remaining() == 0


def test_charges_accumulate_per_kind_and_in_the_total() -> None:
    ledger = QueryLedger(budget=100, budgets={"explain": 10})
    ledger.charge("predict", 7)
    ledger.charge("predict", 5)
    ledger.charge("explain", 4)
    assert ledger.as_dict() == {"predict": 12, "explain": 4}
    assert ledger.total == 16 and ledger.remaining() == 84 and ledger.remaining("explain") == 6


def test_the_log_records_every_answered_request_and_the_file_gets_one_line_each(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    ledger = QueryLedger(log=True, log_path=path)
    ledger.charge("predict", 2, digest="aa")
    ledger.charge("explain", 1, digest="bb")
    assert [(r.kind, r.n, r.digest) for r in ledger.records] == [("predict", 2, "aa"), ("explain", 1, "bb")]
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert [(d["kind"], d["n"], d["digest"]) for d in lines] == [("predict", 2, "aa"), ("explain", 1, "bb")]


def test_a_file_log_alone_does_not_keep_records_in_memory(tmp_path) -> None:
    ledger = QueryLedger(log=False, log_path=tmp_path / "log.jsonl")
    ledger.charge("predict", 2)
    assert ledger.records == [] and len((tmp_path / "log.jsonl").read_text().splitlines()) == 1


def test_on_charge_hooks_see_each_charge_but_not_a_refused_one() -> None:
    seen: list[tuple[str, int]] = []
    ledger = QueryLedger(budget=3, on_charge=[lambda k, n: seen.append((k, n))])
    ledger.charge("predict", 2)
    with pytest.raises(BudgetExhausted):
        ledger.charge("predict", 2)
    assert seen == [("predict", 2)]


def test_a_refund_undoes_a_charge_and_never_goes_below_zero() -> None:
    ledger = QueryLedger(budget=10)
    ledger.charge("explain", 4)
    ledger.refund("explain", 3)
    assert ledger.as_dict()["explain"] == 1 and ledger.remaining() == 9
    ledger.refund("explain", 5)
    assert ledger.as_dict()["explain"] == 0 and ledger.remaining() == 10


def test_reserve_keeps_the_charge_on_success_and_refunds_it_on_failure() -> None:
    ledger = QueryLedger(budget=10)
    with ledger.reserve("predict", 3):
        assert ledger.total == 3  # charged before the work
    with pytest.raises(RuntimeError), ledger.reserve("predict", 4):
        raise RuntimeError("the answer could not be produced")
    assert ledger.total == 3


def test_cap_budget_lowers_but_never_raises_and_never_goes_negative() -> None:
    ledger = QueryLedger(budget=100)
    ledger.charge("predict", 10)
    ledger.cap_budget(50)
    assert ledger.budget == 60 and ledger.remaining() == 50
    ledger.cap_budget(80)  # a remote that reports more left never raises our budget
    assert ledger.budget == 60
    ledger.cap_budget(5, pending=4)  # 4 of our 10 are in flight: the remote's 5 count from 6 answered
    assert ledger.budget == 11
    ledger.cap_budget(-7)  # a nonsensical negative report counts as nothing left
    assert ledger.budget == 10 and ledger.remaining() == 0
    unlimited = QueryLedger()
    unlimited.charge("predict", 3)
    unlimited.cap_budget(2)
    assert unlimited.budget == 5
    unlimited.cap_budget(0, pending=9)  # never below zero
    assert unlimited.budget == 0


def test_a_checkpoint_round_trip_restores_counts_and_keeps_every_kind() -> None:
    ledger = QueryLedger(budget=50)
    ledger.charge("predict", 7)
    state = ledger.state_dict()
    assert state == {"budget": 50, "budgets": {}, "counts": {"predict": 7, "explain": 0}}
    resumed = QueryLedger(budget=50)
    resumed.load_state_dict({"counts": {"predict": 7}})
    assert resumed.as_dict() == {"predict": 7, "explain": 0} and resumed.remaining() == 43


def test_budget_left_is_the_tighter_of_the_total_and_the_kind_budget_and_never_negative() -> None:
    counts = {"predict": 30, "explain": 5}
    assert budget_left(counts, None, {}, None) is None
    assert budget_left(counts, 40, {}, None) == 5
    assert budget_left(counts, 40, {"explain": 8}, "explain") == 3
    assert budget_left(counts, 100, {"explain": 8}, "explain") == 3
    assert budget_left(counts, 36, {"explain": 8}, "explain") == 1
    assert budget_left(counts, 100, {"explain": 8}, "predict") == 65  # a kind budget binds only its kind
    assert budget_left(counts, None, {"explain": 8}, "explain") == 3
    assert budget_left(counts, None, {"explain": None}, "explain") is None
    assert budget_left(counts, 20, {}, None) == 0  # over budget (a lowered cap): 0, not negative


def test_kinds_are_checked_and_enums_accepted() -> None:
    from stealkit.oracle.ledger import QueryKind

    ledger = QueryLedger(budget=5)
    ledger.charge(QueryKind.EXPLAIN, 2)
    assert ledger.remaining(QueryKind.EXPLAIN) == 3 and ledger.as_dict()["explain"] == 2
    with pytest.raises(InputError):
        ledger.charge("gradient", 1)
    with pytest.raises(InputError):
        ledger.remaining("gradient")


def test_a_ledger_built_with_partial_counts_treats_missing_kinds_as_zero() -> None:
    ledger = QueryLedger(budget=10, counts={})
    ledger.charge("predict", 2)
    ledger.refund("explain", 0)
    assert ledger.as_dict() == {"predict": 2, "explain": 0}
    assert budget_left({"predict": 3}, None, {"explain": 8}, "explain") == 8


def test_digest_is_the_first_16_hex_digits_of_the_sha256_of_the_bytes_for_tensors_and_arrays() -> None:
    import hashlib

    import numpy as np
    import torch

    from stealkit.oracle.ledger import digest_tensor

    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = hashlib.sha256(arr.tobytes()).hexdigest()[:16]
    assert digest_tensor(arr) == want and digest_tensor(torch.from_numpy(arr)) == want
    assert digest_tensor(arr.T) == hashlib.sha256(np.ascontiguousarray(arr.T).tobytes()).hexdigest()[:16]
