"""``stealkit audit``'s explanation parts (gradient matching to 0.95x the victim, exact recovery of a two-layer ReLU
victim) and the spread of Q90/Q95 over seeds: in the plan or left out with a note, queries from the ledgers,
the figures computed right."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stealkit.audit.copies import copy_sentences, seed_spread
from stealkit.audit.kinds import KINDS
from stealkit.audit.kinds.explanations import ExplainAccess, reach_point
from stealkit.audit.kinds.extraction import Extraction
from stealkit.audit.options import AuditOptions, Sizes
from stealkit.audit.parts import PlanContext, VictimShape
from stealkit.cli import main
from stealkit.errors import InputError
from tests.audit_kit import part_id
from tests.test_audit import NO_EXTRAS, TINY, TINY_KW, _repo_root  # noqa: F401 (an autouse fixture)

VICTIM = "standard:digits-conv2"
NOTHING_MORE = ["--gradmatch-budgets", "0", "--exact-budget", "0", "--seeds", "1"]


@pytest.fixture(scope="module")
def mlp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-layer ReLU digits victim of hidden width 8 (3 epochs): exact recovery takes a few hundred queries."""
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    out = tmp_path_factory.mktemp("mlp8") / "victim"
    train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, seed=0), out=out, arch_kwargs={"hidden": 8})
    return out


def _plan(capsys: pytest.CaptureFixture[str], victim: str, *args: str, out: Path) -> str:
    assert main(["-q", "audit", "--victim", victim, "--answers", "label", "--budgets", "20,40", *TINY,
                 *NO_EXTRAS[:4], *args, "--plan", "--out", str(out)]) == 0
    assert not out.exists()
    return capsys.readouterr().out


# -- the plan ---------------------------------------------------------------------------------------------------
def test_conv_victim_gets_gradient_matching_and_a_note_on_exact_recovery(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    text = _plan(capsys, VICTIM, "--datafree-budget", "0", "--gradmatch-budgets", "10,30", "--seeds", "1",
                 out=tmp_path / "a")
    # 2 attackers x (20 + 40), then gradient matching: 30 answers and 30 explanations
    assert "gradient-matching-10-30" in text and f"{120 + 60:,}" in text.split("total")[1].split("(")[0]
    assert "exact-recovery" not in text.split("note:")[0]
    assert "exact recovery left out: the victim is conv2, not a two-layer ReLU network" in text


def test_mlp2_victim_gets_exact_recovery_at_its_per_unit_budget(tmp_path: Path, mlp8: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    text = _plan(capsys, str(mlp8), "--datafree-budget", "0", "--gradmatch-budgets", "0", "--seeds", "1",
                 out=tmp_path / "a")
    assert "exact-recovery-h8-1000 " in text  # 125 queries per hidden unit, h = 8
    text = _plan(capsys, str(mlp8), "--datafree-budget", "0", "--gradmatch-budgets", "0", "--seeds", "1",
                 "--exact-budget", "300", out=tmp_path / "b")
    assert "exact-recovery-h8-300 " in text  # capped by --exact-budget


def test_explanations_wait_for_room_and_the_data_free_part_leaves_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # 120 for the ladder; gradient matching 10,30 needs 60; the data-free part gets the rest of 700
    text = _plan(capsys, VICTIM, "--datafree-budget", "2000", "--gradmatch-budgets", "10,30", "--seeds", "1",
                 "--max-queries", "700", out=tmp_path / "a")
    assert "datafree-label-520 " in text and "gradient-matching-10-30" in text
    text = _plan(capsys, VICTIM, "--datafree-budget", "0", "--gradmatch-budgets", "10,300", "--seeds", "1",
                 "--max-queries", "700", out=tmp_path / "b")
    assert "gradient-matching" not in text.split("note:")[0]
    assert "gradient matching left out: its ladder 10,300 needs 600 queries" in text and "leaves 580" in text


def plan_explanations(access: ExplainAccess, sizes: Sizes, room: int) -> tuple[list[Any], list[str]]:
    """The explanation kinds' parts and notes, in table order, as the plan asks them within ``room``."""
    ctx = PlanContext(AuditOptions(victim="-", out="-"), sizes, VictimShape(10, 64), None,  # type: ignore[arg-type]
                      memo={"explain": access})
    parts, notes = [], []
    for name in ("gradmatch", "exact"):
        got, why = KINDS[name].plan(ctx, room)
        parts, notes, room = parts + got, notes + why, room - sum(p.budget for p in got)
    return parts, notes


def explanation_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return KINDS["gradmatch"].rows(results, KINDS)["explanations"] + KINDS["exact"].rows(results, KINDS)["explanations"]


def test_a_victim_that_serves_no_explanations_gets_a_note() -> None:
    access = ExplainAccess("an ONNX victim gives no gradients (onnxruntime)", None, "", 64)
    parts, notes = plan_explanations(access, Sizes(gradmatch=(10, 30), exact_budget=1000, seeds=1), room=10_000)
    assert parts == [] and notes == ["the explanation attacks (gradient matching, exact recovery) left out: an ONNX "
                                     "victim gives no gradients (onnxruntime)"]
    parts, notes = plan_explanations(access, Sizes(gradmatch=(), exact_budget=0, seeds=1), room=10_000)
    assert parts == notes == []  # nothing asked for, nothing to say


def test_onnx_victim_is_read_as_serving_no_explanations(tmp_path: Path, mlp8: Path) -> None:
    pytest.importorskip("onnx")
    from stealkit.audit.kinds.explanations import explanation_access
    from stealkit.models import load_model
    from stealkit.models.export import export_model
    from stealkit.oracle.victim import Target

    model, spec = load_model(mlp8)
    export_model(model, spec, tmp_path / "v.onnx", "onnx")
    access = explanation_access(Target(str(tmp_path / "v.onnx"), dataset="digits"))
    assert access.why_not is not None and "ONNX" in access.why_not and access.hidden is None
    local = explanation_access(Target(str(mlp8)))
    assert local.why_not is None and local.hidden == 8


def test_seeds_fill_the_room_the_plan_leaves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _plan(capsys, VICTIM, "--datafree-budget", "0", "--gradmatch-budgets", "0", "--seeds", "3",
                 out=tmp_path / "a")
    for k in (1, 2):
        assert f"extract-label-like-20-seed+{k}" in text and f"extract-label-like-40-seed+{k}" in text
    assert "unrelated-20-seed" not in text  # only the attacker with data like the victim's
    assert "at 3 of --seeds 3 seeds" in text
    # 120 for the ladder; each seed more costs 60: 200 holds one
    text = _plan(capsys, VICTIM, "--datafree-budget", "0", "--gradmatch-budgets", "0", "--seeds", "3",
                 "--max-queries", "200", out=tmp_path / "b")
    assert "seed+1" in text and "seed+2" not in text
    assert "at 2 of --seeds 3 seeds (each seed more needs 60 queries, the plan leaves 20" in text


def test_plan_seeds_repeats_only_the_undefended_like_ladder() -> None:
    from stealkit.audit.parts import Part

    parts = [Part("label", "like", "pool", 50), Part("label", "unrelated", "patches", 50),
             Part("probs", "like", "pool", 50, defence="label"), Part("label", "like", "pool", 100)]
    repeats, notes = Extraction().repeats(parts, 3, 1000 - 200)
    assert [part_id(p) for p in repeats] == ["extract-label-like-50-seed+1", "extract-label-like-100-seed+1",
                                       "extract-label-like-50-seed+2", "extract-label-like-100-seed+2"]
    assert Extraction().repeats(parts, 1, 800) == ([], [])


def test_bad_sizes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, what in ((["--seeds", "0"], "--seeds"), (["--exact-budget", "-1"], "--exact-budget"),
                       (["--gradmatch-budgets", "0,10"], "--gradmatch-budgets")):
        assert main(["-q", "audit", "--victim", VICTIM, *args, "--plan", "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and len(err.splitlines()) == 1


# -- the figures ------------------------------------------------------------------------------------------------
def _gm_point(queries: int, accuracy: float) -> dict[str, Any]:
    return {"queries": queries, "queries_predict": queries // 2, "queries_explain": queries // 2, "n": queries // 2,
            "accuracy": accuracy, "fidelity": accuracy}


def test_queries_to_095x_the_victim_from_a_made_up_curve() -> None:
    curve = [_gm_point(600, 0.97), _gm_point(20, 0.60), _gm_point(200, 0.93), _gm_point(60, 0.92)]
    target = 0.95 * 0.97  # 0.9215: 60 queries (0.92) fall short, 200 (0.93) reach it
    assert reach_point(curve, target)["queries"] == 200
    assert reach_point(curve, 0.92)["queries"] == 60  # at the target is reaching it
    assert reach_point(curve, 0.98) is None and reach_point(curve, None) is None
    result = {"part": {"kind": "gradmatch", "budget": 600}, "total_queries": 600, "curve": curve,
              "target_accuracy": target, "reached": reach_point(curve, target)}
    (row,) = explanation_rows([result])
    assert row["queries to target"] == 200 and row["answers"] == 100 and row["explanations"] == 100
    assert row["accuracy"] == 0.93 and row["target"] == "0.95x victim accuracy (0.921)"
    (row,) = explanation_rows([{**result, "target_accuracy": 0.99, "reached": None}])
    assert row["queries to target"] == "not reached within 600" and row["accuracy"] == 0.97  # the top rung


def _like(answers: str, budget: int, fidelity: float, seed_offset: int = 0, **part: Any) -> dict[str, Any]:
    return {"part": {"kind": "extract", "answers": answers, "attacker": "like", "budget": budget, "defence": "",
                     "seed_offset": seed_offset, **part}, "total_queries": budget, "fidelity": fidelity}


def test_spread_over_seeds_from_made_up_ladders() -> None:
    results = [
        # seed 0: Q90 100, Q95 200; seed +1: Q90 50, Q95 not reached; seed +2: Q90 200, Q95 200
        _like("label", 50, 0.85), _like("label", 100, 0.91), _like("label", 200, 0.96),
        _like("label", 50, 0.90, 1), _like("label", 100, 0.93, 1), _like("label", 200, 0.94, 1),
        _like("label", 50, 0.70, 2), _like("label", 100, 0.80, 2), _like("label", 200, 0.95, 2),
        # one seed only: no spread row; another attacker and a defence: not in the spread
        _like("probs", 50, 0.99),
        {**_like("label", 50, 0.99, 1), "part": {**_like("label", 50, 0.99, 1)["part"], "attacker": "unrelated"}},
        _like("label", 50, 0.99, 1, defence="round:decimals=1"),
    ]
    (row,) = seed_spread(results)
    assert row["answers"] == "label" and row["seeds"] == 3
    assert row["Q90 per seed"] == "100, 50, 200" and row["Q90 median"] == 100 and row["Q90 range"] == "50-200"
    assert row["Q95 per seed"] == "200, –, 200" and row["Q95 median"] == 200
    assert row["Q95 range"] == "200 to not reached within 200"
    # two seeds of three not reaching it: the median is "not reached"; an even count takes the middle pair's mean.
    # Seeds compare on the rungs they all have: without seed 0's 200, the spread stops at 100
    two_short = [r for r in results[:9] if r["part"]["seed_offset"] != 0 or r["part"]["budget"] != 200]
    assert seed_spread(two_short)[0]["Q95 median"] == "not reached within 100"
    assert copy_sentences({"spread": [row]}, KINDS) == ["Repeated at 3 seeds with data like yours, Q90 ranges 50-200 with top-1 "
                                       "labels."]
    pair = results[:6]
    assert seed_spread(pair)[0]["Q90 median"] == 75.0
    assert seed_spread(pair)[0]["Q95 range"] == "200 to not reached within 200"
    same = [r for r in results[:9] if r["part"]["seed_offset"] != 1]  # Q95 200 at both seeds
    assert seed_spread(same)[0]["Q95 range"] == "200" and seed_spread(same)[0]["Q95 median"] == 200


# -- a whole audit ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_audit_runs_the_explanation_parts_and_the_seeds_through_their_ledgers(tmp_path: Path, mlp8: Path,
                                                                              capsys: pytest.CaptureFixture[str]
                                                                              ) -> None:
    """Gradient matching and exact recovery run as their commands, every query (answers and explanations) from
    the ledgers, summing to the plan; a repeat at another seed; the audit resumed after the gradient-matching
    part pays nothing twice."""
    import torch

    from tests.audit_kit import run_audit_command

    # the CLI's thread policy: one torch thread (conftest's two make gradient matching's double back-propagation
    # about 14x slower on this shared 2-core machine: 3 min against 13 s)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _whole_audit(tmp_path, mlp8, capsys, run_audit_command)
    finally:
        torch.set_num_threads(threads)


def _whole_audit(tmp_path: Path, mlp8: Path, capsys: pytest.CaptureFixture[str], run_audit_command: Any) -> None:

    kwargs: dict[str, Any] = {"victim": str(mlp8), "answers": "label", "budgets": "20",
                              "settings": TINY_KW, "transfer_images": 0,
                              "decision_images": 0, "datafree_budget": 0, "gradmatch_budgets": "10,30",
                              "exact_budget": 1000, "seeds": 2}

    class Stop(Exception):
        pass

    def stop(part: Any, result: dict[str, Any]) -> None:
        if part.kind == "gradmatch":
            raise Stop(part_id(part))

    out = tmp_path / "x"
    with pytest.raises(Stop):
        run_audit_command(out=str(out), on_part=stop, **kwargs)
    calls: list[str] = []
    run_audit_command(out=str(out), on_part=lambda p, r: calls.append(part_id(p)), **kwargs)
    assert calls == ["exact-recovery-h8-1000", "extract-label-like-20-seed+1"]  # the rest was done before
    summary = json.loads((out / "summary.json").read_text())
    parts = {r["id"]: r for r in summary["parts"]}
    assert list(parts) == ["extract-label-like-20", "extract-label-unrelated-20", "gradient-matching-10-30",
                           "exact-recovery-h8-1000", "extract-label-like-20-seed+1"]

    gm = parts["gradient-matching-10-30"]
    own = json.loads((out / "parts" / "gradient-matching-10-30" / "summary.json").read_text())
    assert gm["queries"] == own["queries"] == {"predict": 30, "explain": 30}
    assert [p["queries"] for p in gm["curve"]] == [20, 60]
    assert gm["target_accuracy"] == pytest.approx(0.95 * own["victim_accuracy"], abs=1e-6)

    ex = parts["exact-recovery-h8-1000"]
    own = json.loads((out / "parts" / "exact-recovery-h8-1000" / "summary.json").read_text())
    assert ex["recovered"] and ex["queries"] == own["queries"] and own["queries"]["explain"] > 0
    assert ex["total_queries"] <= 1000 and ex["fidelity"] == own["fidelity"] == 1.0

    spent = sum(r["total_queries"] for r in summary["parts"])
    assert summary["queries"] == spent <= summary["planned_queries"] == 40 + 60 + 1000 + 20
    rows = {r["attack"].split(" (")[0]: r for r in summary["explanations"]}
    assert rows["exact recovery"]["queries to target"] == ex["total_queries"]
    assert rows["gradient matching"]["queries spent"] == 60
    (spread,) = summary["spread"]
    assert spread["seeds"] == 2 and spread["answers"] == "label"
    html = (out / "report.html").read_text()
    assert "Explanations: gradient matching and exact recovery" in html and "Q90 and Q95 over seeds" in html
    assert "functionally equivalent copy" in " ".join(summary["sentences"])
    assert "exact recovery (two-layer ReLU, h = 8)" in [r["attack"] for r in summary["explanations"]]


def test_sizes_defaults() -> None:
    from stealkit.audit.options import parse_gradmatch

    def sizes(quick: bool = False, **given: Any) -> Sizes:
        return AuditOptions(victim="-", out="-", quick=quick, sizes=given).check()

    assert (sizes().gradmatch, sizes().exact_budget, sizes().seeds) == ((30, 100, 300), 20_000, 1)
    assert (sizes(True).gradmatch, sizes(True).exact_budget, sizes(True).seeds) == ((10, 30, 100), 20_000, 2)
    assert sizes(seeds=3).seeds == 3
    assert sizes(gradmatch=parse_gradmatch("0"), exact_budget=0).gradmatch == ()
    with pytest.raises(InputError):
        parse_gradmatch("-5")
    with pytest.raises(InputError):
        sizes(seeds=0)


@pytest.mark.slow
def test_gradient_matching_over_http_is_charged_as_the_server_counts_it(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Against `stealkit serve` with a key that may explain: the explain queries are in the audit's ledgers and
    equal the server's own count; exact recovery is left out (the server does not publish the hidden width)."""
    import torch

    from tests.test_serve_support import live_server, make_victim, write_keys

    key = "explain-key-Zx81QpLw6RtV3mNb7Yc4"
    victim = make_victim(tmp_path / "victim")
    keys = write_keys(tmp_path / "keys.toml", [{"key": key, "name": "x", "mode": "probs", "explain": True,
                                                "budget": 5000}])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CLI's thread policy (see above)
    try:
        with live_server(victim, keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
            out = tmp_path / "h"
            assert main(["-q", "audit", "--victim", url, "--key", key, "--dataset", "digits", "--answers", "label",
                         "--budgets", "20", *TINY, *NO_EXTRAS[:6], "--gradmatch-budgets", "10", "--seeds", "1",
                         "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert "exact recovery left out: a remote victim's hidden width is not published" in text
    summary = json.loads((out / "summary.json").read_text())
    (gm,) = [r for r in summary["parts"] if r["part"]["kind"] == "gradmatch"]
    assert gm["queries"] == {"predict": 10, "explain": 10}
    rec = summary["reconciliation"]
    # 40 extraction answers, 10 gradient-matching answers, 450 evaluation queries (the test split's labels)
    assert rec["equal"] is True and rec["server"]["explain"] == 10 and rec["server"]["predict"] == 40 + 10 + 450
    (row,) = summary["explanations"]  # the victim's accuracy is known over HTTP too (the labels bought): measured
    assert row["target"].startswith("0.95x victim accuracy") and gm["target_accuracy"] is not None
    assert row["queries to target"] != "not measured (no victim accuracy)"
