"""``benchmarks/pool_image_sets.py``: runs on disjoint image sets pooled into one median per tool."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_benchmark


def _mod() -> Any:
    return load_benchmark("pool_image_sets")


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pooled_median_is_the_median_of_all_images_then_the_mean_over_seeds(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path / "a.jsonl", [
        {"tool": "stealkit-hsj", "budget": 5800, "seed": 0, "l2": [1.0, 2.0, 3.0]},
        {"tool": "stealkit-hsj", "budget": 5800, "seed": 1, "l2": [1.5, 2.5, 9.0]},
        {"tool": "art-hsj", "budget": "full", "seed": 0, "repeat": 0, "l2": [0.5, 4.0, None]},
        {"tool": "only-here", "budget": 5800, "seed": 0, "l2": [1.0]},
        {"tool": "stealkit-hsj", "budget": 5800, "seed": 2, "median_l2": 1.0},  # an old row: no per-image L2s
    ])
    b = _write(tmp_path / "b.jsonl", [
        {"tool": "stealkit-hsj", "budget": 5800, "seed": 0, "l2": [10.0, 0.1]},
        {"tool": "stealkit-hsj", "budget": 5800, "seed": 1, "l2": [0.2, 0.3]},
        {"tool": "art-hsj", "budget": "full", "seed": 0, "repeat": 0, "l2": [0.7, 0.9]},
    ])
    assert _mod().main([str(a), str(b)]) == 0
    out = {t["tool"]: t for t in json.loads(capsys.readouterr().out)["tools"]}
    assert set(out) == {"stealkit-hsj", "art-hsj"}  # a row missing from one run is left out
    s = out["stealkit-hsj"]
    assert s["pooled_median_l2"] == [2.0, 1.5]  # medians of [1, 2, 3, 10, .1] and [1.5, 2.5, 9, .2, .3]
    assert s["pooled_median_l2_mean"] == pytest.approx(1.75)
    assert s["images"] == 5 and s["draws"] == 2
    assert s["per_run_median_l2_mean"] == pytest.approx([statistics.fmean([2.0, 2.5]), statistics.fmean([5.05, 0.25])])
    assert out["art-hsj"]["pooled_median_l2"] == [0.9]  # an image without an adversarial point counts as inf


def test_runs_without_per_image_l2s_or_missing_files_are_one_error(tmp_path: Path) -> None:
    old = _write(tmp_path / "old.jsonl", [{"tool": "stealkit-hsj", "budget": 5800, "seed": 0, "median_l2": 1.0}])
    with pytest.raises(SystemExit, match="per-image L2s"):
        _mod().main([str(old), str(old)])
    with pytest.raises(SystemExit, match="no such file"):
        _mod().main([str(tmp_path / "nope.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(SystemExit, match="not a JSON line"):
        _mod().main([str(bad)])
