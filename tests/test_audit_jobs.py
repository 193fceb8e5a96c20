"""``stealkit audit --jobs``: the parts that need no stolen copy run in worker processes with the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stealkit.audit import execute as audit_mod
from stealkit.audit.parts import Part
from tests.audit_kit import part_id, run_audit_command
from tests.test_audit import NO_EXTRAS_KW, TINY_KW, VICTIM

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_parts_in_two_workers_give_the_figures_and_queries_of_one_process(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the standard victims' cache
    monkeypatch.setattr(audit_mod, "PARALLEL_MIN_SECONDS", 0.0)  # tiny parts: use the workers anyway
    seen: list[str] = []
    from stealkit.victims import standard_victim

    kw = {"victim": str(standard_victim(VICTIM.split(":", 1)[1]).path), "answers": "label,probs", "budgets": "20,40", "settings": TINY_KW, **NO_EXTRAS_KW,
          "transfer_images": 5}
    run_audit_command(out=str(tmp_path / "one"), jobs=1, **kw)
    run_audit_command(out=str(tmp_path / "two"), jobs=2, on_part=lambda part, _r: seen.append(part_id(part)), **kw)
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert two["headline"] == one["headline"] and two["enables"] == one["enables"]
    assert two["queries"] == one["queries"] and 4 * 20 + 4 * 40 < one["queries"] <= 4 * 20 + 4 * 40 + 10
    assert seen[-1] == "transfer-pgd-5" and len(seen) == 9  # the attack from the copy runs after every extraction


def test_small_audits_stay_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_workers(*_a: object, **_k: object) -> None:
        raise AssertionError("workers started for parts estimated under PARALLEL_MIN_SECONDS")

    monkeypatch.setattr(audit_mod, "_in_workers", no_workers)
    part = Part("label", "like", "pool", 20, estimate_s=1.0)
    todo = [part, Part("label", "like", "pool", 40, estimate_s=1.0)]
    ran: list[str] = []
    monkeypatch.setattr(audit_mod, "run_part", lambda p, *_a, **_k: ran.append(part_id(p)) or {
        "part": {"kind": "extract"}, "id": part_id(p), "total_queries": 0, "fidelity": 0.5, "accuracy": 0.5,
        "elapsed_s": 0.0})

    class Run:
        path = Path("/nonexistent-audit")

        def append_record(self, _r: object) -> None:
            pass

    monkeypatch.setattr(audit_mod, "load_done", lambda *_a: {})
    import stealkit.fsutil as fsutil

    monkeypatch.setattr(fsutil, "atomic_write_json", lambda *_a, **_k: None)
    from types import SimpleNamespace

    ctx = SimpleNamespace(options=SimpleNamespace(jobs=2, backend="local"), parts_dir=Path("/nonexistent-audit/parts"))
    audit_mod.execute(todo, Run(), ctx)  # type: ignore[arg-type]
    assert ran == [part_id(p) for p in todo]
