"""``stealkit audit``'s "what each defence buys": the default defence cells, ECE of what is served, PRADA's flag
on each part's own queries (watched, never re-sent), and the serving table (tiny sizes, the digits victim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stealkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
VICTIM = "standard:digits-conv2"
TINY = ["--set", "student=mlp2", "--set", "student.hidden=8", "--set", "epochs=1", "--set", "min_steps=0"]
#: the same, as run_audit_command's settings
TINY_KW = {"student": "mlp2", "student.hidden": 8, "epochs": 1, "min_steps": 0}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # standard victims are cached in runs/victims


def test_ece_on_a_hand_made_case() -> None:
    from stealkit.metrics import expected_calibration_error

    # bin (13/15, 14/15]: confidence 0.9, 1 of 2 right -> |0.5 - 0.9| x 2/4; bin (8/15, 9/15]: 0.6, 2 of 2 right
    # -> |1 - 0.6| x 2/4; ECE 0.4
    conf = torch.tensor([0.9, 0.9, 0.6, 0.6])
    assert expected_calibration_error(conf, torch.tensor([1, 0, 1, 1])) == pytest.approx(0.4)
    # within one bin, over- and under-confidence offset: 0.88 and 0.92 (mean 0.9) against 1 of 2 right
    assert expected_calibration_error(torch.tensor([0.88, 0.92]), torch.tensor([1, 0])) == pytest.approx(0.4)
    # across bins they do not: 0.9 (bin 13) right, 0.95 (bin 14) wrong
    assert expected_calibration_error(torch.tensor([0.9, 0.95]), torch.tensor([1, 0])) == pytest.approx(0.525)
    # a label served with confidence 1.0: ECE is the error rate
    assert expected_calibration_error(torch.ones(4), torch.tensor([1, 1, 1, 0])) == pytest.approx(0.25)
    assert expected_calibration_error(torch.tensor([0.3, 0.7]), torch.tensor([0.3, 0.7]) > 2) == pytest.approx(0.5)


def test_served_calibration_of_labels_and_a_defence() -> None:
    from stealkit.data import load_splits
    from stealkit.serve.defences import parse_defence, served_accuracy, served_calibration
    from stealkit.victims import standard_victim

    trained = standard_victim("digits-conv2")
    test = load_splits("digits", seed=int((trained.spec.extra or {}).get("split_seed", 0))).test
    probs = served_calibration(trained.model, test.x, test.y, mode="probs")
    label = served_calibration(trained.model, test.x, test.y, mode="label")
    topk = served_calibration(trained.model, test.x, test.y, mode="topk", top_k=3)
    assert label["accuracy"] == probs["accuracy"] == topk["accuracy"]
    assert label["ece"] == pytest.approx(1 - label["accuracy"])  # a bare label claims certainty
    assert topk["ece"] == pytest.approx(probs["ece"])  # top-k shows the top-1 probability unchanged
    rounded = served_calibration(trained.model, test.x, test.y, defence=parse_defence("round:decimals=0"))
    assert rounded["accuracy"] == served_accuracy(trained.model, parse_defence("round:decimals=0"), test.x, test.y)
    assert rounded["ece"] != probs["ece"]


def _first_flag(x: torch.Tensor, labels: torch.Tensor) -> int | None:
    """The reference: Algorithm 1 one query at a time; the 1-based index of the query after which it flags."""
    from stealkit.serve.detection import Prada

    det = Prada()
    for i in range(x.shape[0]):
        if det.update(x[i : i + 1], labels[i : i + 1]).flagged:
            return i + 1
    return None


def test_prada_watch_flags_at_the_query_algorithm_1_does() -> None:
    from stealkit.serve.detection import PradaWatch

    # one image again and again: every distance 0; the test first runs at 101 distances, i.e. after query 102
    same = torch.full((300, 1, 8, 8), 0.5)
    watch = PradaWatch()
    for i in range(0, 300, 64):
        watch.observe(same[i : i + 64], torch.zeros(min(64, 300 - i), dtype=torch.long))
    assert watch.flagged_at == 102 == _first_flag(same, torch.zeros(300, dtype=torch.long))
    assert watch.queries == 300

    # natural-looking images, then small steps around one seed (a JbDA-like stream): it flags mid-batch
    gen = torch.Generator().manual_seed(0)
    natural = torch.rand(150, 1, 8, 8, generator=gen)
    seed = torch.rand(1, 1, 8, 8, generator=gen)
    steps = (seed + 0.01 * torch.randn(250, 1, 8, 8, generator=gen)).clamp(0, 1)
    x = torch.cat([natural, steps])
    labels = torch.randint(0, 3, (400,), generator=gen)
    expected = _first_flag(x, labels)
    assert expected is not None and 150 < expected < 400
    for batch in (1, 37, 400):
        watch = PradaWatch()
        for i in range(0, 400, batch):
            watch.observe(x[i : i + batch], labels[i : i + batch])
        assert (watch.flagged_at, watch.queries) == (expected, 400)
    # uniform noise over 10 classes: a normal-looking stream that is never flagged
    noise, cls = torch.rand(400, 1, 8, 8, generator=gen), torch.randint(0, 10, (400,), generator=gen)
    watch = PradaWatch()
    watch.observe(noise, cls)
    assert watch.flagged_at is None is _first_flag(noise, cls)


def test_the_observer_sees_every_charged_query_and_changes_nothing() -> None:
    from stealkit.errors import BudgetExhausted
    from stealkit.oracle import LocalOracle
    from stealkit.oracle.observe import observing
    from stealkit.serve.defences import parse_defence
    from stealkit.victims import standard_victim

    model = standard_victim("digits-conv2").model
    x = torch.rand(50, 1, 8, 8, generator=torch.Generator().manual_seed(1))

    def oracle() -> LocalOracle:
        return LocalOracle(model, (1, 8, 8), mode="probs", budget=40, defences=[parse_defence("noise:sigma=0.05")])

    plain = oracle()
    bare = [plain.query(x[:30]), plain.query(x[30:40])]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    watched = oracle()
    with observing(lambda o, xs, a: seen.append((xs, a))):
        answers = [watched.query(x[:30]), watched.query(x[30:40])]
        with pytest.raises(BudgetExhausted):
            watched.query(x[40:])  # refused whole: nothing answered, nothing observed
    assert watched.ledger.as_dict() == plain.ledger.as_dict() == {"predict": 40, "explain": 0}
    assert all(torch.equal(a, b) for a, b in zip(answers, bare, strict=True))
    assert [xs.shape[0] for xs, _ in seen] == [30, 10]
    assert all(torch.equal(a, b) for (_, a), b in zip(seen, answers, strict=True))
    oracle().query(x[:1])  # outside the block: not observed
    assert len(seen) == 2


def test_default_defences_in_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stealkit.audit.defences import DEFAULT_DEFENCES, defence_rungs, resolve_defences

    base = ["-q", "audit", "--victim", VICTIM, "--budgets", "20,40,60", *TINY, "--transfer-images", "0",
            "--decision-images", "0", "--datafree-budget", "0", "--gradmatch-budgets", "0", "--exact-budget", "0",
            "--plan"]
    assert main([*base, "--answers", "label,probs", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    # the default defences: probability cells of the attacker with data like the victim's, lowest and middle rungs
    for spec in ("round_decimals_2", "noise_sigma_0.05"):
        assert f"extract-probs+{spec}-like-40 " in text and f"extract-probs+{spec}-like-60" not in text
        assert f"extract-label+{spec}-like-60 " in text  # the label recipe on the argmax: every rung
    total = text.split("\ntotal")[1].split()[0]
    assert total == f"{4 * 120 + 2 * 60 + 2 * 120:,}" and "its lowest and its middle (20, 40" in text
    # --defence none: none; --defence SPEC: that one on the whole ladder; label answers only: none
    assert main([*base, "--answers", "label,probs", "--defence", "none", "--out", str(tmp_path / "b")]) == 0
    assert "extract-probs+" not in capsys.readouterr().out.split("total")[0]
    assert main([*base, "--answers", "label,probs", "--defence", "label", "--out", str(tmp_path / "c")]) == 0
    text = capsys.readouterr().out
    assert "extract-probs+label-like-60" in text and "round" not in text
    assert main([*base, "--answers", "label", "--out", str(tmp_path / "d")]) == 0
    assert "extract-probs+" not in capsys.readouterr().out.split("total")[0]
    assert resolve_defences([], remote=True, answers=["probs"]) == ([], [])
    assert resolve_defences([], remote=False, answers=["probs"]) == ([], list(DEFAULT_DEFENCES))
    assert resolve_defences(["none", "label"], remote=False, answers=["probs"]) == (["label"], [])
    assert defence_rungs([50, 100, 200]) == [50, 100] and defence_rungs([20, 40]) == [20, 40]
    assert defence_rungs([250, 500, 1000, 2000, 4000]) == [250, 1000]


@pytest.mark.slow
def test_serving_table_and_prada_from_the_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny audit with the default defences and HopSkipJump: every cell of the serving table is the audit's
    own figure, PRADA saw exactly each part's ledger count, and the audit spent exactly its plan."""
    from stealkit.audit.defences import flagged_text

    out = tmp_path / "s"
    assert main(["-q", "audit", "--victim", VICTIM, "--answers", "label,probs", "--budgets", "20,40", *TINY,
                 "--transfer-images", "0", "--decision-images", "2", "--decision-queries", "20",
                 "--datafree-budget", "0", "--gradmatch-budgets", "0", "--exact-budget", "0", "--seeds", "1",
                 "--out", str(out)]) == 0
    terminal = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    parts = summary["parts"]
    extract = [r for r in parts if r["part"]["kind"] == "extract"]
    # label, probs x like, unrelated x 2 rungs; 2 defences x (the probability recipe, the label recipe) x 2 rungs
    assert len(extract) == 2 * 2 * 2 + 2 * 2 * 2
    assert summary["queries"] == sum(r["total_queries"] for r in parts)
    assert sum(r["total_queries"] for r in extract) == sum(r["part"]["budget"] for r in extract) == 4 * 60 + 4 * 60
    for r in parts:  # the observer saw every query the ledger charged, no more
        assert r["prada"]["queries"] == r["total_queries"]
        assert r["prada"]["flagged_at"] is None or 1 <= r["prada"]["flagged_at"] <= r["total_queries"]

    rows = {r["serving"]: r for r in summary["serving"]}
    assert list(rows) == ["probabilities", "top-1 label", "probabilities through round:decimals=2",
                          "probabilities through noise:sigma=0.05"]
    from stealkit.audit.defences import best_q

    heads = {(h["answers"], h["defence"]): h for h in summary["headline"] if h["attacker"] == "like"}
    for name, answers, defence, attackers in [
            ("probabilities", "probs", "none", ["probs", "label"]), ("top-1 label", "label", "none", ["label"]),
            ("probabilities through round:decimals=2", "probs", "round:decimals=2", ["probs", "label"]),
            ("probabilities through noise:sigma=0.05", "probs", "noise:sigma=0.05", ["probs", "label"])]:
        row = rows[name]
        best = best_q([heads[(a, defence)] for a in attackers])
        assert row["attacker Q90"] == best["Q90"]  # the best attacker that can use what is served
        (longest,) = [r for r in extract if r["part"]["answers"] == answers and r["part"]["attacker"] == "like"
                      and (r["part"]["defence"] or "none") == defence and r["part"]["budget"] == 40]
        assert row["PRADA flagged at"] == flagged_text(longest["prada"])
        if defence != "none":
            assert row["served accuracy"] == pytest.approx(longest["served_accuracy"], abs=1e-4)
    label = rows["top-1 label"]
    assert label["served accuracy"] == pytest.approx(summary["victim_accuracy"], abs=1e-4)
    assert label["ECE"] == pytest.approx(1 - label["served accuracy"], abs=2e-4)
    assert 0 < rows["probabilities"]["ECE"] < 1

    attacks = {r["attack"]: r for r in summary["prada"]}
    hsj = attacks["HopSkipJump without a copy"]
    assert hsj["queries"] == next(r["total_queries"] for r in parts if r["id"] == hsj["part"])
    assert len([a for a in attacks if a.startswith("extraction")]) == 8  # one row per cell: its longest run
    assert any("PRADA" in s for s in summary["sentences"])
    assert "attacker Q90" in terminal and "PRADA flagged at" in terminal
    html = (out / "report.html").read_text()
    assert "What each defence buys" in html and "PRADA on each attack" in html


def test_the_best_attacker_that_can_use_what_is_served_sets_each_choices_q90() -> None:
    """Made-up cells: probabilities through a defence are attacked by the probability recipe and by the label recipe
    on their argmax; the choice's Q90 is the better of the two, and the report names the winner."""
    from stealkit.audit.defences import serving_table

    def head(answers: str, q90: int | str, defence: str = "none") -> dict[str, Any]:
        return {"answers": answers, "attacker": "like", "defence": defence, "Q90": q90}

    headline = [head("probs", 50), head("label", 100), head("probs", "not reached within 100", "noise:sigma=0.05"),
                head("label", 100, "noise:sigma=0.05"), head("probs", 200, "round:decimals=1"),
                head("label", "not reached within 400", "round:decimals=1")]
    rows = {r["serving"]: r for r in serving_table(headline, [], None, 1)}
    noise = rows["probabilities through noise:sigma=0.05"]
    assert noise["attacker Q90"] == 100 and noise["best attacker"] == "label recipe on the argmax"
    rounded = rows["probabilities through round:decimals=1"]
    assert rounded["attacker Q90"] == 200 and rounded["best attacker"] == "probability recipe"
    assert rows["probabilities"]["attacker Q90"] == 50 and rows["top-1 label"]["attacker Q90"] == 100
    # neither reached: the stronger statement (the larger ladder) is shown
    headline[2:4] = [head("probs", "not reached within 100", "noise:sigma=0.05"),
                     head("label", "not reached within 400", "noise:sigma=0.05")]
    rows = {r["serving"]: r for r in serving_table(headline, [], None, 1)}
    assert rows["probabilities through noise:sigma=0.05"]["attacker Q90"] == "not reached within 400"


def test_a_defence_that_keeps_the_top_class_never_looks_stronger_than_labels_only(tmp_path: Path) -> None:
    """On a small victim: rounding keeps the top class, so the label recipe on the argmax of the rounded
    probabilities gets exactly the labels' answers and copies (same seed, same queries), and the rounded choice's
    Q90 can never read higher than serving labels only."""
    from stealkit.audit.defences import best_q
    from tests.audit_kit import run_audit_command

    out = tmp_path / "k"
    run_audit_command(victim=VICTIM, out=str(out), answers="label,probs", budgets="20,40", settings=TINY_KW,
                      defences=["round:decimals=2"], transfer_images=0, decision_images=0, datafree_budget=0,
                      gradmatch_budgets="0", exact_budget=0, seeds=1)
    summary = json.loads((out / "summary.json").read_text())
    parts = {r["id"]: r for r in summary["parts"]}
    for b in (20, 40):
        assert parts[f"extract-label+round_decimals_2-like-{b}"]["fidelity"] == \
            parts[f"extract-label-like-{b}"]["fidelity"]
    rows = {r["serving"]: r for r in summary["serving"]}
    rounded, labels = rows["probabilities through round:decimals=2"], rows["top-1 label"]
    both = [{"Q90": rounded["attacker Q90"], "name": "rounded"}, {"Q90": labels["attacker Q90"], "name": "labels"}]
    assert best_q(both)["name"] == "rounded" or rounded["attacker Q90"] == labels["attacker Q90"]


def test_the_verdict_names_the_speed_the_best_change_and_what_was_not_measured() -> None:
    from stealkit.audit.verdict import verdict

    summary = {"serving": [
        {"serving": "probabilities", "attacker Q90": 50, "best attacker": "probability recipe",
         "served accuracy": 0.97, "ECE": 0.03},
        {"serving": "top-1 label", "attacker Q90": 100, "best attacker": "label recipe", "served accuracy": 0.97,
         "ECE": 0.03},
        {"serving": "probabilities through noise:sigma=0.05", "attacker Q90": 100,
         "best attacker": "label recipe on the argmax", "served accuracy": 0.96, "ECE": 0.16},
        {"serving": "probabilities through round:decimals=2", "attacker Q90": "not reached within 100",
         "best attacker": "probability recipe", "served accuracy": 0.97, "ECE": 0.03}],
        "enables": [{"attack": "PGD transfer, Linf eps 0.25", "success": 0.86}],
        "notes": ["gradient matching left out: its ladder 10,30 needs 60 queries"]}
    now, change, missing = verdict(summary)
    assert "Served as probabilities" in now and "50 queries" in now and "86.0 %" in now
    assert "round:decimals=2" in change and "not reached within 100" in change  # the strongest measured change
    # at equal Q90 the cheapest for honest users: labels (no cost) before noise (a calibration error of 0.16)
    summary["serving"][3]["attacker Q90"] = 100
    assert "The serving change that raises Q90 most against attackers that adapt to it: top-1 label" in \
        verdict(summary)[1]
    assert missing.startswith("Not measured: gradient matching left out")
    summary["serving"] = summary["serving"][:1]
    summary["notes"] = []
    assert verdict(summary)[1:] == ["No serving choice audited raises Q90 above probabilities's against attackers "
                                    "that adapt to it.", "Everything the plan held was measured."]
