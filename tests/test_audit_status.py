"""The audit's status line inside running parts (issue 49): every ``STEALKIT_PROGRESS_INTERVAL`` seconds, the
running part's name and progress (from its runner's bars, through :func:`stealkit.progress.listening`), the time
so far and the audit's ETA; none with the interval at 0; a worker's part reaches the audit's log too."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from stealkit import progress as P
from stealkit.audit import status
from stealkit.audit.parts import Part
from tests.audit_kit import part_id
from tests.test_audit import NO_EXTRAS_KW, ROOT, TINY_KW, VICTIM

#: a status line from inside a part: its name, what its bars count, and an ETA of the whole audit
IN_PART = re.compile(r"^audit: \d+/\d+ parts done, running extract-\S+ \(.*(victim queries|step).*; [\d:]+\); "
                     r"elapsed [\d:]+, ETA [\d:]+ ")


def test_a_listener_gets_every_bar_update_even_when_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEALKIT_QUIET", "1")
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    ticks: list[P.Tick] = []
    with P.listening(ticks.append):
        bar = P.progress(total=10, desc="train", unit="step")
        bar.set_postfix(epoch="1/5")
        bar.update(3)
        bar.close()
    assert [(t.desc, t.n, t.total) for t in ticks] == [("train", 3, 10)]
    assert ticks[0].words() == "train 3/10 step (epoch 1/5)"
    assert buf.getvalue() == ""  # quiet: the listener reports, the bar prints nothing
    assert P.progress(total=3).disable  # nobody listening: the silent tqdm of --quiet, as before


def test_the_clock_names_the_running_part_its_progress_and_an_eta(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(P.INTERVAL_ENV, "0.01")
    first, second = Part("label", "like", "pool", 20, 10.0), Part("probs", "like", "pool", 20, 30.0)
    clock = status.AuditClock([first, second], tmp_path, print, every=1.0)
    assert clock.line() == ("audit: 0/2 parts done, between parts; elapsed 0:00, ETA unknown yet (0 % of the "
                            "plan's time)")
    (tmp_path / f"{part_id(first)}.json").write_text("{}")  # the first part finished
    with status.reporting(tmp_path, part_id(second)):
        bar = P.progress(total=100, desc="train", unit="step")
        bar.update(50)
        import time

        time.sleep(0.02)
        bar.update(0)  # written at most every interval / 2
        line = clock.line()
        assert line is not None and line.startswith("audit: 1/2 parts done, running extract-probs-like-20 (train "
                                                    "50/100 step; 0:00); elapsed 0:00, ETA ")
        assert "(62 % of the plan's time)" in line  # 10 s done and half of 30 s, of 40 s
    assert not (tmp_path / f"{part_id(second)}.progress").exists()  # removed when the part ends


def test_interval_zero_turns_the_status_line_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEALKIT_QUIET", raising=False)
    monkeypatch.setenv(P.INTERVAL_ENV, "0")
    with status.reporting(tmp_path, "extract-label-like-20"):
        assert not list(tmp_path.iterdir())  # no progress file: no part reports
    lines: list[str] = []
    with status.AuditClock([Part("label", "like", "pool", 20, 1.0)], tmp_path, lines.append) as clock:
        assert clock.every == 0 and clock._thread is None
    monkeypatch.delenv(P.INTERVAL_ENV)
    assert status.interval() == status.DEFAULT_SECONDS == 30.0
    monkeypatch.setenv("STEALKIT_QUIET", "1")
    assert status.AuditClock([], tmp_path, lines.append).every == 0  # --quiet: no status line either
    assert lines == []


def _audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: str, **kw: object) -> list[str]:
    monkeypatch.chdir(ROOT)  # the standard victims' cache
    monkeypatch.delenv("STEALKIT_QUIET", raising=False)
    monkeypatch.setenv(P.INTERVAL_ENV, interval)
    lines: list[str] = []
    from stealkit.audit.run import run_audit
    from tests.audit_kit import options

    run_audit(options(victim=VICTIM, out=str(tmp_path / "a"), answers="label", budgets="20",
                      settings=TINY_KW, **NO_EXTRAS_KW, **kw),  # type: ignore[arg-type]
              progress=lines.append)
    return [ln for ln in lines if ln.startswith("audit: ")]


def test_a_running_audit_logs_status_lines_inside_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _audit(tmp_path, monkeypatch, "0.05", jobs=1)
    assert any(IN_PART.match(ln) for ln in lines), lines[-5:]


@pytest.mark.slow
def test_no_status_line_with_the_interval_at_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _audit(tmp_path, monkeypatch, "0", jobs=1) == []


@pytest.mark.slow
def test_parts_in_workers_reach_the_audit_s_status_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stealkit.audit import execute

    monkeypatch.setattr(execute, "PARALLEL_MIN_SECONDS", 0.0)  # tiny parts: use the workers anyway
    lines = _audit(tmp_path, monkeypatch, "0.05", jobs=2)
    assert any(IN_PART.match(ln) and "victim queries" in ln for ln in lines), lines[-5:]
