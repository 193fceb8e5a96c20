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
    """Every committed rows file: a renderer, its meta, and a plan that is in the repository or says it is none
    (a rerun of a development figure, written by ``benchmarks/rowmeta.py``)."""
    import subprocess

    mod = _tables()
    figures = {s for f in mod.FIGURES for s in f.files}
    listed = subprocess.run(["git", "ls-files", "results/rows/*.jsonl"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    assert listed, "no committed rows found"
    for path in sorted(ROOT / p for p in listed):
        assert path.stem in mod.TABLES or path.stem in figures, f"{path.name} has no renderer"
        meta = json.loads(path.with_suffix(".meta.json").read_text(encoding="utf-8"))
        assert meta["plan"].startswith("none: ") or (ROOT / meta["plan"]).exists(), \
            f"{path.name}: its plan {meta['plan']} is not in the repository"


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


def test_t_interval_on_known_numbers() -> None:
    ev = _ev()
    # mean 2, sample sd 1, n 3: half-width t(0.975, 2) * 1 / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    mean, lo, hi = ev.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert lo == pytest.approx(2.0 - 2.484138, abs=1e-6) and hi == pytest.approx(2.0 + 2.484138, abs=1e-6)
    # the labels-at-200 cell: per-seed differences 1.11, 2.89, 2.44 points give [-0.15, +4.45]
    _, lo, hi = ev.t_interval([10 / 9, 26 / 9, 22 / 9])
    assert round(lo, 2) == -0.15 and round(hi, 2) == 4.45
    with pytest.raises(ValueError, match="two seeds"):
        ev.t_interval([1.0])


def _seeds_with_spread(spread: float, rng: np.random.Generator, seeds: int = 3, n: int = 300) -> np.ndarray:
    """Correctness of ``seeds`` models whose accuracies differ between seeds by about ``spread``."""
    acc = 0.8 + spread * np.linspace(-1, 1, seeds)
    return rng.random((seeds, n)) < acc[:, None]


def test_hierarchical_width_grows_with_the_spread_between_seeds() -> None:
    ev = _ev()
    rng = np.random.default_rng(3)
    anchor = rng.random((3, 300)) < 0.8
    widths = []
    for spread in (0.0, 0.05, 0.12):
        a = _seeds_with_spread(spread, np.random.default_rng(4))
        _, lo, hi = ev.hierarchical_interval(ev.accuracy_difference, a, anchor, resamples=400)
        widths.append(hi - lo)
    assert widths[0] < widths[1] < widths[2]
    # images are resampled within each seed: one seed still has a non-zero width
    one = _seeds_with_spread(0.0, rng, seeds=1)
    _, lo, hi = ev.hierarchical_interval(ev.accuracy_difference, one, anchor[:1], resamples=200)
    assert hi - lo > 0


def test_seed_interval_uses_the_wider_of_the_two() -> None:
    ev = _ev()
    rng = np.random.default_rng(5)
    anchor = rng.random((3, 400)) < 0.8
    # three seeds far apart: the t-interval over three per-seed figures is the wider one
    far = _seeds_with_spread(0.08, np.random.default_rng(6), n=400)
    si = ev.seed_interval(ev.accuracy_difference, far, anchor, resamples=400)
    assert si.method == "t" and (si.lo, si.hi) == si.t
    assert si.t[1] - si.t[0] > si.hierarchical[1] - si.hierarchical[0]
    assert len(si.seeds) == 3 and si.estimate == ev.accuracy_difference(far, anchor)
    # every seed ahead by exactly 30 images: the t-interval has zero width, the bootstrap over images does not,
    # so the bootstrap is the one used
    worse = anchor.copy()
    for s in range(3):
        worse[s, np.flatnonzero(anchor[s])[:30]] = False
    si = ev.seed_interval(ev.accuracy_difference, anchor, worse, resamples=400)
    assert si.t[0] == pytest.approx(si.t[1]) and si.method == "hierarchical"
    assert (si.lo, si.hi) == si.hierarchical and si.lo > 0 and si.hi > si.lo
    # a tie (both zero wide: the same model twice) goes to t
    si = ev.seed_interval(ev.accuracy_difference, anchor, anchor.copy(), resamples=100)
    assert si.method == "t" and si.lo == si.hi == 0.0


def test_a_verdict_the_paired_bootstrap_calls_ahead_is_level_at_the_seed_level() -> None:
    """The issue's point: three seeds that spread, each ahead, are "ahead" under the old pooled bootstrap but
    not under the seed-level interval."""
    ev = _ev()
    rows = _tables()._load("surrogate-digits-sealed-artsearch")[0]
    cell = [r for r in rows if r["mode"] == "label" and int(r["budget"]) == 200]
    ours = ev.stack(sorted((r for r in cell if r["attack"] == "ours-default"), key=lambda r: r["seed"]))
    art = ev.stack(sorted((r for r in cell if r["attack"] == "art-knockoff-random"), key=lambda r: r["seed"]))
    _, lo, hi = ev.paired_interval(ev.accuracy_difference, ours, art)
    assert ev.verdict(lo, hi) == "ahead"
    si = ev.seed_interval(ev.accuracy_difference, ours, art)
    assert si.method == "t" and ev.verdict(si.lo, si.hi) == "level"


def test_unpaired_seeds_compare_each_seed_with_the_pooled_anchor() -> None:
    ev = _ev()
    rng = np.random.default_rng(7)
    l2 = rng.random((4, 40)) + 0.5
    a = 0.8 * l2[:3]
    figures = ev.per_seed(ev.median_ratio, a, l2)
    assert figures == [ev.median_ratio(a[s:s + 1], l2) for s in range(3)]
    si = ev.seed_interval(ev.median_ratio, a, l2, resamples=200)
    assert si.hi < 1 and ev.verdict(si.lo, si.hi, 1.0, higher_is_better=False) == "ahead"


def test_readme_carries_every_figure_the_rows_give_and_says_where_there_are_none() -> None:
    mod = _tables()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert mod.check_readme(text) == [], "README.md is stale: python benchmarks/results_tables.py --check"
    cells = mod.readme_cells()
    assert {"sealed-surrogate", "sealed-labelonly", "sealed-decision", "gpu-pgd"} <= set(cells)
    # a README figure changed by one digit is caught, and so is a row that neither has a figure nor says why
    first = cells["sealed-labelonly"]
    assert mod.check_readme(text.replace(first, first.replace("0.951x", "0.952x")))
    row = next(r for r in mod.readme_rows(text) if "no raw rows" in r)
    assert mod.check_readme(text.replace(row, row.replace("no raw rows", "raw rows")))


def test_the_audit_table_regenerates_from_its_committed_audit_json() -> None:
    mod = _tables()
    table = mod.results_audit.audit_adaptive(mod.ROWS)
    assert "| top-k probabilities (k=1) | 200 | 100 | label recipe on the argmax | 0.973 | 0.035 |" in table
    assert "8,519 after" in table
