"""``stealkit demo``: the two oracles stolen in parallel worker processes give the figures of one process.

A tiny demo (a two-epoch victim, two budgets, two student epochs) run serially and with two workers: the
summaries must agree to the last digit, the ledgers must stop at the largest budget, and no worker may outlive
the demo.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from stealkit.commands.demo import summary_table
from stealkit.demo import _worker_setup, run_demo

TINY = {"budgets": (20, 40), "victim_epochs": 2, "student_epochs": 2}


def _figures(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


@pytest.mark.slow
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="parallel oracles need fork")
def test_parallel_oracles_give_the_serial_figures(tmp_path: Path) -> None:
    serial = run_demo(tmp_path / "serial", jobs=1, **TINY)
    parallel = run_demo(tmp_path / "parallel", jobs=2, **TINY)
    assert _figures(parallel) == _figures(serial)
    assert not mp.active_children()  # the workers are gone
    for mode in ("probs", "label"):
        assert parallel[f"ledger_{mode}"]["predict"] == max(TINY["budgets"])  # from the oracle's ledger
    assert [p["queries"] for p in parallel["extraction"]] == list(TINY["budgets"])
    assert [p["queries"] for p in parallel["extraction_label"]] == list(TINY["budgets"])
    on_disk = json.loads((tmp_path / "parallel" / "summary.json").read_text())
    assert on_disk["extraction"] == [{k: round(v, 6) if isinstance(v, float) else v for k, v in p.items()}
                                     for p in parallel["extraction"]]  # the summary keeps six decimals
    records = [json.loads(line) for line in (tmp_path / "parallel" / "records.jsonl").read_text().splitlines()]
    assert [(r["mode"], r["queries"]) for r in records] == [("probs", 20), ("probs", 40), ("label", 20), ("label", 40)]
    page = (tmp_path / "parallel" / "report.html").read_text()
    assert "Extraction against budget" in page
    table = summary_table(parallel)
    assert all(f"{b:>8,}" in table for b in TINY["budgets"])


def test_worker_setup_uses_at_least_one_thread() -> None:
    before = torch.get_num_threads()
    try:
        _worker_setup(0)
        assert torch.get_num_threads() == 1
        _worker_setup(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_cli_default_budgets_are_the_demos() -> None:
    from stealkit.commands.common import parse_int_list
    from stealkit.commands.demo import demo_cmd
    from stealkit.demo import DEFAULT_BUDGETS

    default = next(p.default for p in demo_cmd.params if p.name == "budgets")
    assert parse_int_list(default) == DEFAULT_BUDGETS
