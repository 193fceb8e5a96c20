"""``benchmarks/results_figures.py`` and ``benchmarks/rowmeta.py``: the README rows that regenerate from a
benchmark's ``--jsonl`` rows once committed, and ``results_tables --check``'s handling of those not committed yet.

``tests/data/rows52/`` holds rows each benchmark wrote at a tiny size (digits victims, a few images, one or two
epochs; the commands are in each ``.meta.json``), so every renderer is run on what its writer really writes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "rows52"


class _Rows:
    """Points ``results_figures`` at another rows folder for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch

    def at(self, path: Path) -> None:
        self.mp.setattr(sys.modules["results_figures"], "ROWS", path)


@pytest.fixture
def mods(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, _Rows]:
    tables = load_benchmark("results_tables")
    return tables, sys.modules["results_figures"], _Rows(monkeypatch)


def test_every_figure_regenerates_from_the_rows_its_benchmark_writes(mods: tuple[Any, Any, _Rows]) -> None:
    _, rf, rows = mods
    rows.at(TINY)
    assert {s for f in rf.FIGURES for s in f.files} == {p.stem for p in TINY.glob("*.jsonl")}
    for f in rf.FIGURES:
        assert f.present(), f.name
        block, cells = f.make()
        assert cells and all(cells), f.name
        meta = json.loads((TINY / f"{f.files[0]}.meta.json").read_text(encoding="utf-8"))
        assert f"- command: `{meta['command']}`" in block and f"- commit: {meta['commit']}" in block, f.name


def test_a_figure_without_rows_is_skipped_only_while_the_readme_says_no_raw_rows(
        mods: tuple[Any, Any, _Rows], tmp_path: Path) -> None:
    tables, rf, rows = mods
    rows.at(tmp_path)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    skips = tables.readme_skips(text)
    assert len(skips) == len(rf.FIGURES) and all("not committed; the README row says 'no raw rows'" in s
                                                   for s in skips)
    assert tables.check_readme(text) == []
    row = next(r for r in tables.readme_rows(text) if "(docs/results.md#gradient-matching)" in r)
    bad = text.replace(row, row.replace(", no raw rows", ""))
    assert any("#gradient-matching does not say 'no raw rows'" in p for p in tables.check_readme(bad))
    assert not any("gradient-matching" in s for s in tables.readme_skips(bad))
    # rows of an unfinished run (no meta yet) do not count as committed
    shutil.copy(TINY / "gradient-matching-fmnist.jsonl", tmp_path)
    assert any("has no .meta.json (its run has not finished)" in s for s in tables.readme_skips(text))


@pytest.mark.slow
def test_committed_rows_make_the_readme_carry_their_figures(mods: tuple[Any, Any, _Rows], tmp_path: Path) -> None:
    tables, rf, rows = mods
    for name in ("exact-recovery.jsonl", "exact-recovery.meta.json"):
        shutil.copy(TINY / name, tmp_path)
    rows.at(tmp_path)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    problems = tables.check_readme(text)
    assert any("#exact-recovery says 'no raw rows' but its rows are committed" in p for p in problems)
    assert any("lacks the regenerated figure exact-recovery-0" in p for p in problems)
    _, cells = next(f for f in rf.FIGURES if f.name == "exact-recovery").make()
    row = next(r for r in tables.readme_rows(text) if "(docs/results.md#exact-recovery)" in r)
    good = text.replace(row, f"| exact recovery, regenerated | {cells[0]} | {cells[1]} | "
                             f"[results](docs/results.md#exact-recovery) |")
    assert tables.check_readme(good) == []
    # one digit changed in a regenerated figure is caught
    assert tables.check_readme(good.replace(cells[1], cells[1].replace("no model", "one model")))
    names = [f.name for f in rf.FIGURES]
    assert list(tables.render(names)) == ["exact-recovery"]


def _curve(accs: dict[int, float]) -> list[dict[str, Any]]:
    return [{"n": n, "accuracy": a} for n, a in accs.items()]


def test_gradient_matching_bounds_the_ratio_by_the_grid_points_around_each_crossing(
        mods: tuple[Any, Any, _Rows], tmp_path: Path) -> None:
    _, rf, rows = mods
    rows.at(tmp_path)
    grid = (10, 40, 100, 500, 1000)
    written = []
    for seed, (g_at, m_at) in enumerate(((100, 1000), (40, 1000))):
        for kind, at in (("gradient", g_at), ("membership", m_at)):
            written.append({"seed": seed, "kind": kind, "victim_accuracy": 0.9, "target": 0.855,
                         "curve": _curve({n: 0.86 if n >= at else 0.5 for n in grid})})
    (tmp_path / "gradient-matching-fmnist.jsonl").write_text("\n".join(json.dumps(r) for r in written) + "\n")
    (tmp_path / "gradient-matching-fmnist.meta.json").write_text(json.dumps({"command": "c", "commit": "x"}))
    block, cells = rf.gradient_matching()
    # seed 0: crossing in (40, 100] and (500, 1000]: 500/100 = 5x to 1000/40 = 25x; seed 1: (10, 40]: 12.5x to 100x
    assert cells == ["gradients 40-100", "membership-only 1,000: 5-100x more (grid resolution)"]
    assert "| 0 | 0.9000 | 0.855 | 100 | 1,000 | 5x to 25x |" in block


def test_rowmeta_writes_what_made_the_rows(tmp_path: Path) -> None:
    import torch

    rowmeta = load_benchmark("rowmeta")
    assert rowmeta.start(None, seeds=[0]) is None and rowmeta.finish(None) is None
    path = tmp_path / "x.jsonl"
    meta = rowmeta.start(path, seeds=[0, 1], data={"test": torch.zeros(3, 2), "pool": "the whole pool"}, extra=1)
    out = rowmeta.finish(meta, ledger_exact=True)
    assert out == tmp_path / "x.meta.json" and rowmeta.meta_path("a/b.jsonl") == Path("a/b.meta.json")
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert {"command", "plan", "commit", "date", "torch", "device", "seeds", "data", "load"} <= set(doc)
    assert doc["seeds"] == [0, 1] and doc["extra"] == 1 and doc["ledger_exact"] is True
    assert doc["data"]["pool"] == "the whole pool" and doc["data"]["test"].endswith("(3x2)")
    assert doc["data"]["test"].startswith("sha256 ") and doc["plan"].startswith("none:")
    assert "load average" in doc["load"] and " - " in doc["date"]
