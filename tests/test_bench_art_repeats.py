"""``benchmarks/decision_attacks.py --art-repeats``: ART's full run repeated in one invocation, seeded per repeat
(also ART's otherwise unseeded start draws), and the anchor (mean and std over the repeats) beside stealkit's rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_benchmark

pytest.importorskip("art")


def _bench() -> Any:
    return load_benchmark("decision_attacks")


def _run(bench: Any, out: Path, repeats: int, seeds: str = "0,1") -> list[dict[str, Any]]:
    argv = ["--dataset", "digits", "--n", "3", "--val", "0", "--seeds", seeds, "--budgets", "60",
            "--tools", "hsj,art-hsj", "--pool", "100", "--sub-epochs", "1", "--jsonl", str(out)]
    assert bench.main(argv + (["--art-repeats", str(repeats)] if repeats else [])) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture()
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    mod = _bench()
    # a short ART run (the option, not ART's settings, is under test)
    monkeypatch.setitem(mod.ART_HSJ, "max_iter", 2)
    monkeypatch.setitem(mod.ART_HSJ, "max_eval", 40)
    monkeypatch.setitem(mod.ART_HSJ, "init_eval", 10)
    return mod


@pytest.mark.slow
def test_repeats_rows_anchor_and_reproducible(bench: Any, tmp_path: Path) -> None:
    rows = _run(bench, tmp_path / "a.jsonl", 3)
    art = [r for r in rows if r["tool"] == "art-hsj" and r["budget"] == "full"]
    # three repeats spread over the two seeds' loops, not one per seed
    assert sorted(r["repeat"] for r in art) == [0, 1, 2] and [r["seed"] for r in art] == [r["repeat"] for r in art]
    assert len([r for r in rows if r["tool"] == "stealkit-hsj"]) == 2
    # interleaved: repeat 0 and 2 after seed 0's stealkit row, repeat 1 after seed 1's
    order = [(r["tool"], r.get("repeat", r["seed"])) for r in rows if r["budget"] in (60, "full") and not r.get("anytime")]
    assert order == [("stealkit-hsj", 0), ("art-hsj", 0), ("art-hsj", 2), ("stealkit-hsj", 1), ("art-hsj", 1)]
    anc = bench.anchor(rows)
    meds = [r["median_l2"] for r in art]
    assert anc["repeats"] == 3 and anc["art_median_l2"] == meds
    assert anc["art_median_l2_mean"] == pytest.approx(statistics.fmean(meds))
    assert anc["art_median_l2_std"] == pytest.approx(statistics.stdev(meds))
    sk = statistics.fmean(r["median_l2"] for r in rows if r["tool"] == "stealkit-hsj")
    assert anc["stealkit"] == [{"tool": "stealkit-hsj", "budget": "60", "median_l2_mean": pytest.approx(sk),
                                "seeds": 2, "vs_art": pytest.approx(sk / statistics.fmean(meds) - 1)}]
    text = bench.table(str(tmp_path / "a.jsonl"))
    assert "3 repeats in this invocation" in text and f"{anc['art_median_l2_mean']:.3f}" in text
    # a second invocation repeats ART's runs exactly (its start draws seeded too)
    again = [r for r in _run(bench, tmp_path / "b.jsonl", 3) if r["tool"] == "art-hsj" and r["budget"] == "full"]
    assert sorted((r["repeat"], r["median_l2"], r["mean_queries"]) for r in again) == \
        sorted((r["repeat"], r["median_l2"], r["mean_queries"]) for r in art)


@pytest.mark.slow
def test_without_repeats_no_anchor(bench: Any, tmp_path: Path) -> None:
    rows = _run(bench, tmp_path / "c.jsonl", 0, seeds="0")
    assert bench.anchor(rows) is None and not any("repeat" in r for r in rows)
    assert "repeats in this invocation" not in bench.table(str(tmp_path / "c.jsonl"))


def test_repeats_need_art(bench: Any) -> None:
    with pytest.raises(SystemExit, match="art-repeats"):
        bench.main(["--dataset", "digits", "--tools", "hsj", "--art-repeats", "2"])
