"""``benchmarks/results_tables.py`` and ``benchmarks/evidence.py``: docs/results.md's tables come from the
committed rows, and every verdict rests on a paired interval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _ev() -> Any:
    return load_benchmark("evidence")


def _tables() -> Any:
    return load_benchmark("results_tables")


def test_results_md_tables_match_the_committed_rows() -> None:
    mod = _tables()
    tables = mod.render()
    if not tables:
        pytest.skip("no rows committed under results/rows yet")
    doc = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert mod.apply(doc, tables) == doc, "docs/results.md is stale: run python benchmarks/results_tables.py --write"


def test_every_rows_file_has_its_plan_committed_and_a_renderer() -> None:
    mod = _tables()
    for path in sorted((ROOT / "results" / "rows").glob("*.jsonl")):
        assert path.stem in mod.TABLES, f"{path.name} has no renderer in results_tables.TABLES"
        meta = json.loads(path.with_suffix(".meta.json").read_text(encoding="utf-8"))
        assert (ROOT / meta["plan"]).exists(), f"{path.name}: its plan {meta['plan']} is not in the repository"


def test_check_fails_when_a_table_differs(tmp_path: Path) -> None:
    mod = _tables()
    doc = "intro\n<!-- BEGIN rows:t -->\nold\n<!-- END rows:t -->\nend\n"
    empty = "<!-- BEGIN rows:t -->\n<!-- END rows:t -->\n"
    assert mod.apply(empty, {"t": "new"}) == "<!-- BEGIN rows:t -->\nnew\n<!-- END rows:t -->\n"
    assert mod.apply(doc, {"t": "new"}) == "intro\n<!-- BEGIN rows:t -->\nnew\n<!-- END rows:t -->\nend\n"
    with pytest.raises(SystemExit, match="no block"):
        mod.apply("no markers here", {"t": "new"})


def test_bits_round_trip() -> None:
    ev = _ev()
    flags = np.random.default_rng(0).random(451) > 0.3
    assert (ev.unpack_bits(ev.pack_bits(flags), 451) == flags).all()
    with pytest.raises(ValueError):
        ev.unpack_bits(ev.pack_bits(flags), 500)


class _Scored:
    def __init__(self, pred: list[int], y: list[int], victim: list[int] | None = None) -> None:
        self.last_pred, self.y = torch.tensor(pred), torch.tensor(y)
        self.victim_labels = None if victim is None else torch.tensor(victim)


def test_per_image_refuses_a_record_of_another_model() -> None:
    ev = _ev()
    scored = _Scored([0, 1, 1, 0], [0, 1, 0, 0], victim=[0, 1, 0, 1])
    rec = ev.per_image(scored, 0.75)
    assert ev.unpack_bits(rec["correct"], 4).tolist() == [True, True, False, True]
    assert ev.unpack_bits(rec["victim_correct"], 4).tolist() == [True, True, True, False]
    with pytest.raises(RuntimeError, match="row says"):
        ev.per_image(scored, 0.5)


def test_paired_interval_and_verdicts() -> None:
    ev = _ev()
    rng = np.random.default_rng(1)
    base = rng.random((3, 400)) > 0.2
    # the same model twice: zero difference, a zero-width interval, "level"
    est, lo, hi = ev.paired_interval(ev.accuracy_difference, base, base, resamples=200)
    assert est == lo == hi == 0.0 and ev.verdict(lo, hi) == "level"
    # a model right on every image the other is, and on 40 more: ahead, and the interval excludes zero
    better = base.copy()
    better[:, :40] = True
    est, lo, hi = ev.paired_interval(ev.accuracy_difference, better, base, resamples=200)
    assert est > 0 and lo > 0 and ev.verdict(lo, hi) == "ahead"
    assert ev.verdict(*ev.paired_interval(ev.accuracy_difference, base, better, resamples=200)[1:]) == "behind"
    # two unrelated draws of the same accuracy: level
    other = rng.random((3, 400)) > 0.2
    assert ev.verdict(*ev.paired_interval(ev.accuracy_difference, other, base, resamples=500)[1:]) == "level"
    # distortions: smaller is better, compared with 1
    l2 = rng.random((4, 40)) + 0.5
    lo, hi = ev.paired_interval(ev.median_ratio, 0.8 * l2[:3], l2, resamples=200)[1:]
    assert hi < 1 and ev.verdict(lo, hi, 1.0, higher_is_better=False) == "ahead"


def test_paired_interval_is_reproducible() -> None:
    ev = _ev()
    rng = np.random.default_rng(2)
    a, b = rng.random((3, 100)) > 0.3, rng.random((3, 100)) > 0.3
    assert ev.paired_interval(ev.accuracy_difference, a, b, resamples=100) == \
        ev.paired_interval(ev.accuracy_difference, a, b, resamples=100)
