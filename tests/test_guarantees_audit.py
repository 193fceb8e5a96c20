"""A test per guarantee of ``stealkit audit`` (issue 52), each one failing when its guarantee is removed
(``tools/mutation.py`` modules ``copies``, ``qat``, ``gate``, ``plan``, ``reconcile``; report: docs/mutation.md).

- Q90/Q95 (``audit/copies.py``, ``parts.q_at``): the fewest *measured* queries (from the ledger, not the budget)
  whose copy reached the level, float32 rounding tolerated and nothing more; "not reached within N" only where
  measured; the spread over seeds counts an unreached seed as above its top rung.
- The gate (``report.decide_gates``, ``exit_code``): fail only on a measured cell below N, pass only where every
  covered cell was measured and decided, undecided otherwise; exit 1 over 3 over 0.
- The plan's budget cap (``plan.make_plan``): the planned total never exceeds ``--max-queries``; what is dropped to
  fit goes in the documented order.
- The reconciliation (``reconcile.py``): the server's count over the audit against the ledgers, kind by kind,
  with the queries of a stopped part and the replayed answers accounted for.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from stealkit.audit.copies import NOT_MEASURED, best_copy, headline, measured, q_value, seed_spread
from stealkit.audit.parts import TOLERANCE, q_at
from stealkit.audit.reconcile import V1_CHARGES, V2_STATS, _ledgers, reconcile, reconcile_audit
from stealkit.audit.report import EXIT_FAIL, EXIT_PASS, EXIT_UNDECIDED, Gate, decide_gates, exit_code
from stealkit.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _pt(b: int, f: float | None, *, answers: str = "label", attacker: str = "like", defence: str = "",
        queries: int | None = None, seed: int = 0, kind: str = "extract") -> dict[str, Any]:
    part = {"kind": kind, "answers": answers, "attacker": attacker, "budget": b, "defence": defence}
    if seed:
        part["seed_offset"] = seed
    return {"part": part, "total_queries": b if queries is None else queries, "fidelity": f, "id": f"p{b}-{seed}"}


# -- Q90 / Q95 ------------------------------------------------------------------------------------------------


def test_q_at_is_the_ledgers_count_of_the_lowest_budget_that_reached_the_level() -> None:
    # the ledger's count, not the budget (a pool smaller than the rung spends less)
    pts = [_pt(400, 0.97, queries=380), _pt(100, 0.91, queries=99), _pt(50, 0.85)]
    assert q_at(pts, 0.90) == 99 and isinstance(q_at(pts, 0.90), int)
    assert q_at(pts, 0.95) == 380
    assert q_at(pts, 0.98) is None
    # ordered by budget, not by the order given or by the queries
    assert q_at([_pt(200, 0.95, queries=10), _pt(100, 0.95, queries=20)], 0.9) == 20
    # a point without a fidelity is skipped, never taken as reached
    assert q_at([_pt(50, None), _pt(100, 0.92)], 0.9) == 100
    assert q_at([_pt(50, None)], 0.9) is None


def test_q_at_tolerates_float32_rounding_and_no_more() -> None:
    assert q_at([_pt(50, 0.9 - TOLERANCE / 2)], 0.9) == 50  # 405/450 in float32 reads 0.89999998
    assert q_at([_pt(50, 0.9)], 0.9) == 50
    assert q_at([_pt(50, 0.9 - 2 * TOLERANCE)], 0.9) is None  # one image short is never "reached"
    assert q_at([_pt(50, 0.9 - 1 / 450)], 0.9) is None
    assert 0 < TOLERANCE <= 1e-6


def test_q_value_reached_not_reached_or_not_measured() -> None:
    assert not measured([]) and not measured([_pt(50, 0.5), _pt(100, None)]) and measured([_pt(50, 0.5)])
    assert q_value([_pt(50, 0.8), _pt(100, 0.93)], 0.9) == 100
    # not reached: N is the top rung's queries from the ledger
    assert q_value([_pt(50, 0.8), _pt(1000, 0.85, queries=449)], 0.9) == "not reached within 449"
    assert q_value([_pt(50, 0.8), _pt(100, 0.85)], 0.9) == "not reached within 100"
    # one point not measured: the cell is not measured, never "not reached"
    assert q_value([_pt(50, 0.95), _pt(100, None)], 0.9) == NOT_MEASURED
    assert q_value([], 0.9) == NOT_MEASURED


def test_headline_one_row_per_cell_with_both_levels() -> None:
    rows = headline([_pt(100, 0.91), _pt(50, 0.8), _pt(200, 0.96),
                     _pt(50, 0.93, answers="probs"), _pt(100, 0.97, answers="probs"),
                     _pt(50, 0.7, attacker="unrelated")])
    assert [(r["answers"], r["attacker"]) for r in rows] == [("label", "like"), ("probs", "like"),
                                                            ("label", "unrelated")]
    label, probs, unrelated = rows
    assert (label["Q90"], label["Q95"]) == (100, 200)
    assert (probs["Q90"], probs["Q95"]) == (50, 100)
    assert unrelated["Q90"] == unrelated["Q95"] == "not reached within 50"
    assert label["fidelity @50"] == 0.8 and label["fidelity @200"] == 0.96 and "defence" not in label
    assert list(label) == ["answers", "attacker", "fidelity @50", "fidelity @100", "fidelity @200", "Q90", "Q95"]
    # a defended cell is its own row, with the served accuracy; the undefended row says "none"
    rows = headline([{**_pt(50, 0.92), "victim_accuracy": 0.97},
                     {**_pt(50, 0.6, defence="round:decimals=2"), "served_accuracy": 0.95}])
    assert [(r["defence"], r["served accuracy"], r["Q90"]) for r in rows] == [
        ("none", 0.97, 50), ("round:decimals=2", 0.95, "not reached within 50")]


def test_spread_over_seeds_counts_an_unreached_seed_above_its_top_rung() -> None:
    def ladder(seed: int, f50: float, f100: float, answers: str = "label") -> list[dict[str, Any]]:
        return [_pt(50, f50, seed=seed, answers=answers), _pt(100, f100, seed=seed, answers=answers)]

    (row,) = seed_spread([*ladder(0, 0.91, 0.96), *ladder(1, 0.85, 0.92), *ladder(2, 0.80, 0.97)])
    assert row["seeds"] == 3 and row["answers"] == "label" and row["attacker"] == "like"
    assert row["Q90 per seed"] == "50, 100, 100" and row["Q90 median"] == 100 and row["Q90 range"] == "50-100"
    assert row["Q95 per seed"] == "100, –, 100" and row["Q95 median"] == 100
    assert row["Q95 range"] == "100 to not reached within 100"
    # two seeds: the median of 50 and 100 is their mean; equal values give one figure
    (row,) = seed_spread([*ladder(0, 0.91, 0.96), *ladder(1, 0.85, 0.96)])
    assert row["Q90 median"] == 75 and row["Q95 range"] == "100" and row["Q95 median"] == 100
    (row,) = seed_spread([*ladder(0, 0.91, 0.96), *ladder(1, 0.92, 0.96)])
    assert row["Q90 range"] == "50" and row["Q90 median"] == 50
    # an odd median among unreached seeds is "not reached"; none reached: the range says so
    (row,) = seed_spread([*ladder(0, 0.5, 0.6), *ladder(1, 0.5, 0.6), *ladder(2, 0.91, 0.96)])
    assert row["Q90 median"] == "not reached within 100" and row["Q90 range"] == "50 to not reached within 100"
    (row,) = seed_spread([*ladder(0, 0.5, 0.6), *ladder(1, 0.5, 0.6)])
    assert row["Q90 range"] == "not reached within 100" and row["Q90 per seed"] == "–, –"
    # a half-integer median stays as it is
    (row,) = seed_spread([_pt(50, 0.91), _pt(51, 0.95), _pt(50, 0.85, seed=1), _pt(51, 0.91, seed=1)])
    assert row["Q90 median"] == 50.5
    # seeds with no rung in common (a gate's extension at one seed only): no spread rather than a guess
    assert seed_spread([*ladder(0, 0.91, 0.96), _pt(51, 0.91, seed=1)]) == []


def test_spread_needs_two_measured_seeds_of_the_undefended_like_attacker() -> None:
    base = [_pt(50, 0.91), _pt(50, 0.92, seed=1)]
    assert seed_spread(base[:1]) == []  # one seed: no spread
    assert seed_spread([_pt(50, 0.91), _pt(50, None, seed=1)]) == []  # a seed not measured
    assert seed_spread([_pt(50, 0.91, attacker="unrelated"), _pt(50, 0.92, attacker="unrelated", seed=1)]) == []
    assert seed_spread([_pt(50, 0.91, defence="noise"), _pt(50, 0.92, defence="noise", seed=1)]) == []
    assert seed_spread([_pt(50, 0.91, kind="datafree"), _pt(50, 0.92, kind="datafree", seed=1)]) == []
    assert len(seed_spread(base)) == 1
    rows = seed_spread([*base, _pt(50, 0.5, answers="probs"), _pt(50, 0.6, answers="probs", seed=1)])
    assert [r["answers"] for r in rows] == ["label", "probs"]


def test_best_copy_is_the_highest_fidelity_and_the_fewest_queries_on_a_tie(tmp_path: Path) -> None:
    res = [_pt(50, 0.90), _pt(100, 0.95), _pt(200, 0.95), _pt(400, 0.99, defence="noise"),
           _pt(400, 0.99, kind="gradmatch")]
    best = best_copy(res, tmp_path)
    assert best is not None and best.fidelity == 0.95 and best.queries == 100
    assert best.dir == str(tmp_path / "p100-0") and best.id == "p100-0"
    assert best_copy([_pt(50, 0.9, defence="noise")], tmp_path) is None
    # without fidelities: the like attacker first, then the largest budget, then the richest answers
    blind = [_pt(400, None, attacker="unrelated"), _pt(100, None, answers="probs"), _pt(200, None),
             _pt(200, None, answers="topk")]
    pick = best_copy(blind, tmp_path)
    assert pick is not None and pick.queries == 200 and pick.fidelity is None
    assert pick.dir == str(tmp_path / "p200-0")
    blind[3]["id"] = "topk"
    pick = best_copy(blind, tmp_path)
    assert pick is not None and pick.dir == str(tmp_path / "topk")  # top-k is richer than labels


# -- the gate --------------------------------------------------------------------------------------------------


def _status(results: list[dict[str, Any]], *gates: str) -> list[str]:
    return [g.status for g in decide_gates(results, gates)]


def test_a_gate_fails_only_below_n_and_passes_at_n() -> None:
    # q90<N is decided by the rung N - 1: reached there or below fails; not reached at N - 1 or above passes
    res = [_pt(50, 0.8), _pt(100, 0.91, queries=98), _pt(200, 0.96)]
    assert _status(res, "q90<99") == ["fail"]  # reached with 98 (the ledger's count) < 99
    assert _status(res, "q90<98") == ["undecided"]  # reached with 98, unknown at 97: an attacker may need fewer
    assert _status(res, "q90<51") == ["pass"]  # not reached with 50 = N - 1
    assert _status(res, "q90<52") == ["undecided"]  # 50 < N - 1 and the next rung already reaches it
    assert _status(res, "q95<201") == ["fail"] and _status(res, "q95<99") == ["pass"]
    assert _status(res, "q95<200") == ["undecided"]
    (g,) = decide_gates(res, ["label:q90<99"])
    assert g == Gate("label:q90<99", "fail", "--fail-if label:q90<99: label answers reach 90 % fidelity with 98 "
                                             "queries")
    (g,) = decide_gates(res, ["q90<51"])
    assert g.line == ("--fail-if q90<51: passed (measured): label answers do not reach 90 % fidelity within 50 "
                      "queries")


def test_a_gate_reads_fidelity_at_the_level_less_the_tolerance() -> None:
    edge = 90 / 100 - TOLERANCE  # the same float the gate computes
    assert _status([_pt(50, edge)], "q90<51") == ["fail"]  # at the edge: reached
    assert _status([_pt(50, 0.9 - TOLERANCE / 2)], "q90<51") == ["fail"]  # inside the tolerance: reached
    assert _status([_pt(50, 0.9 - 2 * TOLERANCE)], "q90<51") == ["pass"]  # below it: not reached within 50
    # reached only above the target's rung: open, whether the copy sits at the edge or at the level itself
    assert _status([_pt(100, edge)], "q90<51") == ["undecided"]
    assert _status([_pt(100, 0.9)], "q90<51") == ["undecided"]


def test_an_unreached_level_passes_only_when_the_ladder_reaches_n_minus_one() -> None:
    res = [_pt(50, 0.8), _pt(100, 0.85)]  # not reached within 100: Q90 >= 101
    assert _status(res, "q90<101") == ["pass"]
    assert _status(res, "q90<100") == ["pass"]
    (g,) = decide_gates(res, ["q90<102"])
    assert g.status == "undecided"
    assert g.line == ("--fail-if q90<102: cannot decide: label answers: not reached within 100 queries; the "
                      "ladder stops at 100, below 101 (add a rung of 101 to --budgets)")


def test_a_gate_reads_only_the_undefended_like_cells_of_its_answer_kind() -> None:
    res = [_pt(50, 0.8), _pt(100, 0.85), _pt(20, 0.99, attacker="unrelated"),
           _pt(20, 0.99, defence="noise"), _pt(20, 0.99, seed=1), _pt(20, 0.99, answers="probs", attacker="data-free",
                                                                       kind="datafree"),
           _pt(20, 0.99, answers="topk")]
    assert _status(res, "label:q90<50") == ["pass"]
    assert _status(res, "q90<50") == ["fail"]  # the top-k cell reaches it with 20
    assert _status(res, "probs:q90<50") == ["undecided"]  # only the data-free attacker had probabilities
    (g,) = decide_gates(res, ["probs:q90<50"])
    assert "no undefended cell of probs answers was audited" in g.line
    (g,) = decide_gates([], ["q90<50"])
    assert g.status == "undecided" and "no undefended cell of any answers" in g.line


def test_an_unmeasured_cell_never_passes_and_a_failure_beats_it() -> None:
    remote = [_pt(50, None), _pt(100, None)]
    (g,) = decide_gates(remote, ["q90<10"])
    assert g.status == "undecided" and "fidelity not measured" in g.line
    mixed = [*remote, _pt(50, 0.95, answers="probs")]
    assert _status(mixed, "q90<60") == ["fail"]
    assert _status(mixed, "q90<40") == ["undecided"]  # probs pass, labels unknown
    # one cell undecided, another passed: undecided
    both = [_pt(50, 0.5, answers="probs"), _pt(100, 0.95, answers="probs"), _pt(20, 0.5)]
    assert _status(both, "q90<51") == ["undecided"]  # probs pass; labels are open below 50
    assert _status(both, "q90<51", "probs:q90<51", "q90<101") == ["undecided", "pass", "fail"]


def test_exit_codes_fail_over_undecided_over_pass() -> None:
    p, f, u = Gate("a", "pass", ""), Gate("b", "fail", ""), Gate("c", "undecided", "")
    assert exit_code([]) == EXIT_PASS == 0
    assert exit_code([p]) == EXIT_PASS
    assert exit_code([p, u]) == EXIT_UNDECIDED == 3
    assert exit_code([u, f, p]) == EXIT_FAIL == 1
    assert exit_code([f]) == EXIT_FAIL


# -- the plan's budget cap -------------------------------------------------------------------------------------


_CONTEXTS: dict[tuple[Any, ...], Any] = {}


def _context(tmp_path: Path, **kw: Any) -> Any:
    """The plan's context of a small digits audit, as ``run_audit`` builds it (read once per setting)."""
    import stealkit.audit.plan as plan_module
    from stealkit.audit.run import run_audit
    from tests.audit_kit import options

    key = tuple(sorted(kw.items()))
    if key not in _CONTEXTS:
        base: dict[str, Any] = {"victim": "standard:digits-conv2", "out": str(tmp_path / "plan"), "answers": "label",
                                "budgets": "20,40,80", "gradmatch_budgets": "0", "exact_budget": 0,
                                "defences": ["none"]}
        real, seen = plan_module.make_plan, []

        def grab(ctx: Any) -> Any:
            seen.append(ctx)
            return real(ctx)

        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(ROOT)  # standard victims are cached in runs/victims (or $STEALKIT_CACHE)
            mp.setattr(plan_module, "make_plan", grab)
            run_audit(options(**{**base, **kw}), plan_only=True)
        _CONTEXTS[key] = seen[0]
    return _CONTEXTS[key]


def _plan(tmp_path: Path, max_queries: int | None = None, **kw: Any) -> Any:
    """``make_plan`` itself at ``max_queries`` (the cap ``--max-queries`` gives it)."""
    import dataclasses

    from stealkit.audit.plan import make_plan

    ctx = _context(tmp_path, **kw)
    if max_queries is not None:
        ctx = dataclasses.replace(ctx, options=dataclasses.replace(ctx.options, max_queries=max_queries))
    return make_plan(ctx)


def _ids(plan: Any) -> list[str]:
    from stealkit.audit.kinds import part_id

    return [part_id(p) for p in plan.parts]


def test_the_plan_never_exceeds_the_cap_and_drops_in_the_documented_order(tmp_path: Path) -> None:
    kw = {"answers": "label,probs", "transfer_images": 10, "decision_images": 2, "decision_queries": 20,
          "datafree_budget": 900, "seeds": 3}
    full = _plan(tmp_path, **kw)
    ladder = 2 * 2 * (20 + 40 + 80)  # two answer kinds x two attackers
    fixed = 2 * 10 + 2 * 2 * (20 + 1)  # PGD: 2 per image; HopSkipJump: images x (per image + 1), two parts
    repeat = 2 * (20 + 40 + 80)  # the like attacker's ladder at another seed
    assert sum(p.budget for p in full.parts) == ladder + fixed + 900 + 2 * repeat
    assert sum(1 for p in full.parts if p.seed_offset) == 12  # 2 kinds x 3 rungs x 2 seeds
    for cap in (80, 99, 100, 150, 183, 184, 240, 300, 343, 344, 400, 560, 663, 664, 700, 1000, 1563, 1564, 1700,
                2023, 2024, 3000):
        plan = _plan(tmp_path, max_queries=cap, **kw)
        total = sum(p.budget for p in plan.parts)
        assert total <= cap, (cap, total)
        rungs = sorted({p.budget for p in plan.parts if p.kind == "extract"})
        assert rungs == [20, 40, 80][:len(rungs)]  # rungs leave from the top
        ids = _ids(plan)
        has_decision = any(i.startswith("hopskipjump") for i in ids)
        has_transfer = any(i.startswith("transfer") for i in ids)
        assert has_transfer or not has_decision  # the decision parts leave before the transfer part
        if not (has_decision and has_transfer):
            assert rungs == [20]  # the attacks leave only once the ladder is down to one rung
    # the ladder goes first, rung by rung, while the attacks still fit
    one = 2 * 2 * 20
    plan = _plan(tmp_path, max_queries=one + fixed, **kw)
    assert sum(p.budget for p in plan.parts) == one + fixed
    assert [n.split(":")[0] for n in plan.notes if "dropped" in n] == ["rung 80 dropped", "rung 40 dropped"]
    # one query short: the decision attack leaves, the transfer part stays
    plan = _plan(tmp_path, max_queries=one + fixed - 1, **kw)
    assert any("decision attack left out" in n for n in plan.notes) and "transfer-pgd-10" in _ids(plan)
    assert not any("transfer attack left out" in n for n in plan.notes)
    assert sum(p.budget for p in plan.parts) == one + 20 + 2 * 40  # and two repeats of the like ladder (2 x 20)
    # then the transfer part
    plan = _plan(tmp_path, max_queries=one + 19, **kw)
    assert any("transfer attack left out" in n for n in plan.notes)
    assert not any(i.startswith(("transfer", "hopskipjump")) for i in _ids(plan))
    # with the ladder at 40 rungs 20 and 40 fit with the attacks: only rung 80 leaves
    plan = _plan(tmp_path, max_queries=2 * 2 * 60 + fixed, **kw)
    assert [n.split(":")[0] for n in plan.notes if "dropped" in n] == ["rung 80 dropped"]


def test_the_data_free_part_gets_the_rest_up_to_its_cap_and_is_left_out_below_500(tmp_path: Path) -> None:
    kw = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 900, "seeds": 1}
    ladder = 2 * (20 + 40 + 80)
    for room, expect in ((0, None), (499, None), (500, 500), (501, 501), (899, 899), (900, 900), (5000, 900)):
        plan = _plan(tmp_path, max_queries=ladder + room, **kw)
        got = [p.budget for p in plan.parts if p.kind == "datafree"]
        assert got == ([] if expect is None else [expect]), (room, got)
        assert sum(p.budget for p in plan.parts) <= ladder + room


def test_repeats_take_whole_ladders_of_what_is_left(tmp_path: Path) -> None:
    kw = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 0, "seeds": 4}
    ladder, like = 2 * (20 + 40 + 80), 20 + 40 + 80
    for extra, n in ((0, 0), (like - 1, 0), (like, 1), (2 * like + 5, 2), (3 * like, 3), (10 * like, 3)):
        plan = _plan(tmp_path, max_queries=ladder + extra, **kw)
        offsets = sorted({p.seed_offset for p in plan.parts if p.seed_offset})
        assert offsets == list(range(1, n + 1)), (extra, offsets)
        assert sum(p.budget for p in plan.parts) <= ladder + extra
        assert all(p.attacker == "like" and not p.defence for p in plan.parts if p.seed_offset)
    plan = _plan(tmp_path, max_queries=ladder + like, **kw)
    assert any("at 2 of --seeds 4 seeds" in n and f"needs {like:,} queries" in n for n in plan.notes)


def test_a_cap_below_the_smallest_rung_is_refused(tmp_path: Path) -> None:
    kw = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 0, "seeds": 1}
    assert sum(p.budget for p in _plan(tmp_path, max_queries=40, **kw).parts) == 40  # 20 per attacker
    with pytest.raises(InputError, match="too small for any part.*needs 40"):
        _plan(tmp_path, max_queries=39, **kw)


# -- the reconciliation ----------------------------------------------------------------------------------------


def test_reconcile_compares_the_servers_difference_kind_by_kind() -> None:
    before, after = {"predict": 100, "explain": 5}, {"predict": 142, "explain": 7}
    rec = reconcile(before, after, {"predict": 42, "explain": 2})
    assert rec == {"server": {"predict": 42, "explain": 2}, "audit": {"predict": 42, "explain": 2}, "equal": True}
    assert reconcile(before, after, {"predict": 42, "explain": 1})["equal"] is False
    assert reconcile(before, after, {"predict": 41, "explain": 2})["equal"] is False
    # a kind only one side has counts as 0 on the other
    assert reconcile({}, {"predict": 3}, {"predict": 3})["equal"] is True
    assert reconcile({"predict": 0}, {"predict": 3}, {"predict": 3, "explain": 1})["equal"] is False
    assert reconcile({"explain": 2}, {"predict": 3}, {"predict": 3})["server"] == {"predict": 3, "explain": -2}
    assert reconcile(None, after, {})["server"] is None and reconcile(before, None, {})["server"] is None


def test_the_ledgers_are_summed_over_the_parts() -> None:
    assert _ledgers([{"queries": {"predict": 3, "explain": 1}}, {"queries": {"predict": 4}}]) == \
        {"predict": 7, "explain": 1}
    assert _ledgers([]) == {}


def _v1(counts: dict[str, int] | None) -> dict[str, Any]:
    return {"source": V1_CHARGES if counts is not None else None, "counts": counts}


def test_a_stopped_part_and_replayed_answers_are_accounted_for() -> None:
    results = [{"queries": {"predict": 30, "explain": 0}}, {"queries": {"predict": 20, "explain": 4}, "replayed": 6}]
    before = _v1({"predict": 1000, "explain": 10})
    # the stopped attempt paid 6 answers the journal gave back (replayed, in the ledgers) and 5 more it lost
    resumed = _v1({"predict": 1000 + 30 + 11, "explain": 10}) | {"finished": {"predict": 30, "explain": 0}}
    after = _v1({"predict": 1000 + 30 + 20 + 5, "explain": 14})
    rec = reconcile_audit(before, after, results, resumed)
    assert rec["equal"] is True and rec["replayed"] == 6 and rec["stopped"] == {"predict": 5}
    assert rec["audit"] == {"predict": 50, "explain": 4} and rec["server"] == {"predict": 55, "explain": 4}
    assert rec["source"] == V1_CHARGES
    # one answer more on the server than the ledgers and the stopped part explain: not equal
    assert reconcile_audit(before, _v1({"predict": 1056, "explain": 14}), results, resumed)["equal"] is False
    # no resume: nothing stopped, the replayed answers are not taken off twice
    plain = [{"queries": {"predict": 30, "explain": 0}}]
    rec = reconcile_audit(before, _v1({"predict": 1030, "explain": 10}), plain)
    assert rec["equal"] is True and rec["stopped"] is None and rec["replayed"] == 0
    # a resume whose count came from another source is ignored
    other = {"source": V2_STATS, "counts": {"predict": 5000}, "finished": {}}
    assert reconcile_audit(before, _v1({"predict": 1030, "explain": 10}), plain, other)["stopped"] is None
    # a resume with no count is ignored
    assert reconcile_audit(before, _v1({"predict": 1030, "explain": 10}), plain, _v1(None))["equal"] is True


def test_a_server_without_a_count_or_a_changed_source_is_not_reconcilable() -> None:
    results = [{"queries": {"predict": 3}}]
    for before, after in ((_v1(None), _v1({"predict": 3})), (_v1({"predict": 0}), _v1(None)),
                          (_v1({"predict": 0}), {"source": V2_STATS, "counts": {"predict": 3}})):
        rec = reconcile_audit(before, after, results)
        assert rec["server"] is None and rec["equal"] is None and rec["audit"] == {"predict": 3}
        assert rec["note"].startswith("not reconcilable")


def test_the_statistics_extension_is_compared_on_predictions_only() -> None:
    before = {"source": V2_STATS, "counts": {"predict": 10}}
    results = [{"queries": {"predict": 7, "explain": 3}}]
    rec = reconcile_audit(before, {"source": V2_STATS, "counts": {"predict": 17}}, results)
    assert rec["equal"] is True and rec["audit"] == {"predict": 7}
    resumed = {"source": V2_STATS, "counts": {"predict": 14}, "finished": {"predict": 2}}
    rec = reconcile_audit(before, {"source": V2_STATS, "counts": {"predict": 19}}, results, resumed)
    assert rec["equal"] is True and rec["stopped"] == {"predict": 2}


def test_spread_median_of_infinite_values_is_not_a_number() -> None:
    """The spread's median treats an unreached seed as infinite, never as 0 or as its top rung."""
    from stealkit.audit.copies import _median

    assert _median([1.0, 3.0, 2.0]) == 2.0 and _median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert _median([1.0, math.inf, math.inf]) == math.inf and _median([5.0]) == 5.0


# -- added after the mutation run of 2026-11-28 (docs/mutation.md, "Audit"): each kills a survivor -----------------


def test_the_tolerance_is_inclusive_and_the_gate_reads_its_own_level() -> None:
    assert q_at([_pt(50, 0.9 - TOLERANCE)], 0.9) == 50  # exactly at the tolerance: reached
    res = [_pt(50, 0.895), _pt(100, 0.899)]  # above 89 %, below 90 %
    assert _status(res, "q90<200") == ["undecided"]
    assert _status(res, "q90<101") == ["pass"]


def test_the_plan_total_and_its_notes_on_the_pool_and_the_default_defences(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 0, "seeds": 1}
    plan = _plan(tmp_path, **kw)
    assert plan.queries == sum(p.budget for p in plan.parts) == 2 * (20 + 40 + 80)
    # the digits attacker pool holds 449 images: a rung above it says so, a rung at it does not
    assert not any("holds 449 images" in n for n in _plan(tmp_path, budgets="20,449", **kw).notes)
    assert any("holds 449 images: its attacker's rungs above that run at 449" in n
               for n in _plan(tmp_path, budgets="20,450", **kw).notes)
    # the default defences: the probability recipe on the lowest and middle rungs only, and a note that says so
    both = {**kw, "answers": "label,probs", "defences": ()}
    plan = _plan(tmp_path, **both)
    worn = sorted(p.budget for p in plan.parts if p.defence and p.answers == "probs")
    assert worn == [20, 20, 40, 40]
    assert any(n.startswith("the default defences (") and "(20, 40:" in n for n in plan.notes)
    one = _plan(tmp_path, **{**both, "budgets": "20"})
    assert not any(n.startswith("the default defences (") for n in one.notes)


def test_a_kind_missing_from_a_count_is_zero_there() -> None:
    # the server counted no explanations over the audit, and the ledgers hold none: equal
    assert reconcile({"explain": 5}, {"predict": 3, "explain": 5}, {"predict": 3})["equal"] is True
    assert reconcile({}, {"predict": 3}, {"predict": 3, "explain": 0})["equal"] is True
    results = [{"queries": {"predict": 30, "explain": 2}}]
    after = _v1({"predict": 1030, "explain": 12})
    # the ledgers finished at the resume hold no explanations: none was stopped
    rec = reconcile_audit(_v1({"predict": 1000, "explain": 10}), after, results,
                          _v1({"predict": 1030, "explain": 10}) | {"finished": {"predict": 30}})
    assert rec["equal"] is True and rec["stopped"] is None
    # the start's count has no explanations (none yet): none was stopped either
    rec = reconcile_audit(_v1({"predict": 1000}), _v1({"predict": 1030, "explain": 2}), results,
                          _v1({"predict": 1030, "explain": 0}) | {"finished": {"predict": 30, "explain": 0}})
    assert rec["equal"] is True and rec["stopped"] is None
    # a count at the resume without a kind the start had counts it as 0 there
    rec = reconcile_audit(_v1({"predict": 1000, "explain": 10}), after, results,
                          _v1({"predict": 1030}) | {"finished": {"predict": 30, "explain": 0}})
    assert rec["stopped"] == {"explain": -10}
    # the statistics extension: an audit of explanations only spent no prediction
    stats = {"source": V2_STATS, "counts": {"predict": 10}}
    rec = reconcile_audit(stats, stats, [{"queries": {"explain": 3}}])
    assert rec["equal"] is True and rec["audit"] == {"predict": 0}


def test_the_room_kinds_take_what_the_ladder_and_attacks_leave(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"transfer_images": 0, "decision_images": 0, "datafree_budget": 0, "seeds": 1,
                          "gradmatch_budgets": "10,30"}
    ladder = 2 * (20 + 40 + 80)
    plan = _plan(tmp_path, **kw)
    grad = [p for p in plan.parts if p.kind != "extract"]
    assert len(grad) == 1 and grad[0].budget == 60 and plan.queries == ladder + 60  # 30 predict + 30 explain
    small = _plan(tmp_path, max_queries=ladder + 59, **kw)
    assert all(p.kind == "extract" for p in small.parts) and small.queries <= ladder + 59
    assert any(n.startswith("gradient matching left out: its ladder 10,30 needs 60") for n in small.notes)
    # the data-free attacker gets what the explanation attacks leave, never more
    both = {**kw, "datafree_budget": 900}
    plan = _plan(tmp_path, max_queries=ladder + 60 + 600, **both)
    assert [p.budget for p in plan.parts if p.kind == "datafree"] == [600] and plan.queries == ladder + 660
    plan = _plan(tmp_path, max_queries=ladder + 60 + 499, **both)
    assert not any(p.kind == "datafree" for p in plan.parts)
    assert any(n.startswith("the data-free attacker left out") for n in plan.notes)


def test_replayed_answers_and_kinds_only_the_server_saw() -> None:
    # answers given back from the journal are in the ledgers but were not paid again
    rec = reconcile_audit(_v1({"predict": 1000}), _v1({"predict": 1024}),
                          [{"queries": {"predict": 30}, "replayed": 6}])
    assert rec["equal"] is True and rec["stopped"] == {"predict": -6} and rec["replayed"] == 6
    # a kind at the resume that no ledger holds (no explanation asked): paid 0 of it
    rec = reconcile_audit(_v1({"predict": 1000, "explain": 10}), _v1({"predict": 1030, "explain": 10}),
                          [{"queries": {"predict": 30}}],
                          _v1({"predict": 1030, "explain": 10}) | {"finished": {"predict": 30}})
    assert rec["equal"] is True and rec["stopped"] is None


def test_the_headline_orders_rungs_then_levels_across_cells() -> None:
    rows = headline([_pt(50, 0.8), _pt(100, 0.95),
                     _pt(2000, 0.7, answers="label", attacker="data-free", kind="datafree")])
    keys = [list(r) for r in rows]
    assert keys[0] == ["answers", "attacker", "fidelity @50", "fidelity @100", "Q90", "Q95"]
    assert keys[1] == ["answers", "attacker", "fidelity @2000", "Q90", "Q95"]
    # a cell missing a rung the other has keeps the rung order
    rows = headline([_pt(100, 0.95), _pt(50, 0.8, answers="probs"), _pt(100, 0.9, answers="probs")])
    assert list(rows[1]) == ["answers", "attacker", "fidelity @50", "fidelity @100", "Q90", "Q95"]


def test_a_server_that_does_not_answer_is_one_error_and_a_malformed_count_is_no_count() -> None:
    import httpx

    from stealkit.audit.reconcile import v2_usage

    victim = "v2+http://127.0.0.1:9/v2/models/digits"

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(InputError, match="does not answer"):
        v2_usage(victim, None, transport=httpx.MockTransport(down))

    def stats(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stats"):
            return httpx.Response(200, json={"model_stats": [{"name": "digits", "inference_count": "40"}]})
        return httpx.Response(200, json={"name": "digits"})

    assert v2_usage(victim, None, transport=httpx.MockTransport(stats)) == {"source": None, "counts": None}
