"""The audit's table of part kinds: a new kind plugged into :data:`stealkit.audit.kinds.KINDS` appears in the plan,
the run, ``audit.json`` and the report with no other edit."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from stealkit.audit.kinds import KINDS
from stealkit.audit.parts import Copy, Part, PlanContext, RunContext, kind_of
from tests.audit_kit import run_audit_command
from tests.test_audit import NO_EXTRAS_KW, ROOT, TINY_KW


class Probe:
    """A dummy kind: five label queries through its own metered oracle; one table, one sentence, one section."""

    name = "probe"
    claim = "room"
    needs_copy = False
    makes_copy = False

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        return ([Part("label", "probe", "", 5, 0.1, kind=self.name)], []) if room >= 5 else ([], ["probe left out"])

    def part_id(self, part: Part) -> str:
        return f"probe-{part.budget}"

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        import torch

        v = ctx.target.open(mode="label", budget=part.budget)
        labels = v.oracle.query(torch.rand(part.budget, *v.input_shape, generator=torch.Generator().manual_seed(0)))
        queries = v.oracle.ledger.as_dict()
        return {"queries": queries, "total_queries": sum(queries.values()), "classes_seen": len(set(labels.tolist()))}

    def progress(self, result: dict[str, Any]) -> str:
        return f"{result['classes_seen']} classes seen"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        return {"probe": [{"classes seen": r["classes_seen"]} for r in results if kind_of(r) == self.name]}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        return [f"The probe saw {r['classes seen']} classes." for r in summary.get("probe") or []]

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Any]:
        from stealkit.report.html import Section

        return [Section("The probe's section", tables=[("", summary.get("probe") or [])])]


def test_a_new_kind_in_the_table_is_planned_run_summarised_and_reported(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(KINDS, "probe", Probe())
    from stealkit.victims import standard_victim

    out = tmp_path / "a"
    kw = {"victim": str(standard_victim("digits-conv2").path), "answers": "label", "budgets": "20",
          "settings": TINY_KW, **NO_EXTRAS_KW}
    ran: list[str] = []
    run_audit_command(out=str(out), on_part=lambda part, _r: ran.append(part.kind), **kw)
    assert ran == ["extract", "extract", "probe"]
    audit = json.loads((out / "audit.json").read_text())
    assert "probe-5" in audit["audit"]["parts"]
    (probe,) = [r for r in audit["parts"] if r["id"] == "probe-5"]
    assert probe["queries"] == {"predict": 5, "explain": 0} and probe["total_queries"] == 5
    assert audit["queries"] == 20 + 20 + 5  # the ledgers' total includes the new kind's
    assert audit["probe"] == [{"classes seen": probe["classes_seen"]}]
    assert f"The probe saw {probe['classes_seen']} classes." in audit["sentences"]
    assert "The probe&#x27;s section" in (out / "report.html").read_text() or \
        "The probe's section" in (out / "report.html").read_text()


def test_the_plan_prints_the_new_kinds_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(KINDS, "probe", Probe())
    from stealkit.audit.run import run_audit
    from stealkit.victims import standard_victim
    from tests.audit_kit import options

    lines: list[str] = []
    run_audit(options(victim=str(standard_victim("digits-conv2").path), out=str(tmp_path / "p"), answers="label",
                      budgets="20", settings=TINY_KW, **NO_EXTRAS_KW), plan_only=True, echo=lines.append)
    assert any(line.startswith("probe-5 ") for line in "\n".join(lines).splitlines())
    assert not (tmp_path / "p").exists()
