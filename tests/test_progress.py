"""Progress on every long command (issue 44): off a terminal, a plain status line (count of total, rate, ETA)
at a steady interval on stderr, never on stdout; ``-q`` silences it. Each command family runs tiny here with
the interval at 0, so every update writes a line."""

from __future__ import annotations

import io
import re

import pytest

from stealkit import progress as P
from stealkit.cli import main
from tests import test_report_kinds

#: a status line: "DESC: N/TOTAL UNIT (P%), RATE UNIT/s, elapsed T, ETA T" (no total, percentage or ETA where the
#: end is not known: exact recovery queries until it has solved the network)
STATUS = re.compile(r"^[^:\n]+: [\d,]+(/[\d,]+)? \S+( \(\d+%\))?, [\d.e+]+ \S+/s, elapsed [\d:]+(, ETA [\d:]+)?", re.M)


@pytest.fixture
def loud(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress on (conftest makes every test quiet), a status line at every update."""
    monkeypatch.delenv("STEALKIT_QUIET", raising=False)
    monkeypatch.setenv(P.INTERVAL_ENV, "0")


models = test_report_kinds.models  # module-scoped fixture: the digits mlp2 victim and substitute


def test_status_lines_count_rate_eta_and_a_closing_line(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    bar = P.StatusLines(total=8000, desc="train", unit="step", every=0)
    bar.set_postfix(epoch="1/20")
    bar.update(1200)
    P.note(bar, loss="0.4123")
    bar.update(800)
    bar.close()
    bar.close()  # twice: one closing line
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert STATUS.match(lines[0]) and lines[0].startswith("train: 1,200/8,000 step (15%), ")
    assert "ETA" in lines[0] and lines[0].endswith("epoch 1/20")
    assert lines[1].startswith("train: 2,000/8,000 step (25%)") and lines[1].endswith("epoch 1/20, loss 0.4123")
    assert lines[2].startswith("train: done, 2,000 step in ")


def test_status_lines_wait_for_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    bar = P.StatusLines(total=10, desc="x", every=3600)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert buf.getvalue() == ""  # a phase shorter than the interval says nothing, not even at its end


def test_the_kind_of_indicator_follows_quiet_and_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEALKIT_QUIET", "1")
    assert P.progress(total=3).disable
    monkeypatch.delenv("STEALKIT_QUIET")
    monkeypatch.setattr(P, "_on_terminal", lambda: False)
    assert isinstance(P.progress(total=3), P.StatusLines)
    monkeypatch.setattr(P, "_on_terminal", lambda: True)
    bar = P.progress(total=3, file=io.StringIO())
    assert not isinstance(bar, P.StatusLines) and not bar.disable
    bar.close()
    monkeypatch.setattr(P, "_columns", lambda: 0)  # a pseudo-terminal of size 0x0: tqdm alone draws nothing
    buf = io.StringIO()
    bar = P.progress(total=3, file=buf, desc="sized", mininterval=0)
    bar.update(2)
    assert "sized:  67%" in buf.getvalue() and "2/3" in buf.getvalue()
    bar.close()
    monkeypatch.setenv(P.INTERVAL_ENV, "2.5")
    assert P.interval() == 2.5
    monkeypatch.setenv(P.INTERVAL_ENV, "soon")
    assert P.interval() == P.DEFAULT_INTERVAL


def test_a_measured_accuracy_shows_on_the_query_bar(monkeypatch: pytest.MonkeyPatch, loud: None) -> None:
    from stealkit.oracle.ledger import QueryLedger

    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    ledger = QueryLedger(budget=100)
    P.ledger_progress(ledger)
    ledger.charge("predict", 40)
    P.measured(accuracy=0.8123, fidelity=None)
    ledger.charge("predict", 10)
    last = buf.getvalue().splitlines()[-1]
    assert last.startswith("victim queries: 50/100 q (50%)") and last.endswith("acc 0.812"), last


RUNS = {
    "train": (["train", "--dataset", "digits", "--arch", "logistic", "--epochs", "2"], ["step", "epoch 2/2"]),
    "surrogate": (["extract", "surrogate", "--victim", "{victim}", "--budget", "60", "--epochs", "2", "--mode",
                   "label", "--student", "mlp2", "--student-arg", "hidden=8"], ["victim queries: ", "/60 q", "acc "]),
    "baseline": (["extract", "baseline", "--victim", "{victim}", "--budget", "60", "--checkpoints", "30,60",
                  "--student", "mlp2", "--student-arg", "hidden=8", "--epochs", "2"], ["/60 q", "step"]),
    "codfe": (["extract", "codfe", "--victim", "{victim}", "--budget", "2000", "--mode", "label", "--student",
               "mlp2", "--student-arg", "hidden=8", "--batch-size", "20", "--ngf", "4", "--eval-every", "1000",
               "--max-iterations", "2"], ["codfe: ", "/2,000 q", "acc "]),
    "maze": (["extract", "maze", "--victim", "{victim}", "--budget", "2000", "--mode", "probs", "--student",
              "mlp2", "--student-arg", "hidden=8", "--batch-size", "20", "--ngf", "4", "--eval-every", "1000",
              "--max-iterations", "2"], ["maze: ", "/2,000 q"]),
    "gradient-matching": (["extract", "gradient-matching", "--victim", "{victim}", "--budget", "10",
                           "--checkpoints", "5,10", "--student", "mlp2", "--student-arg", "hidden=8", "--steps",
                           "20"], ["student (gradient matching): ", "/20 step"]),
    "exact": (["extract", "exact", "--victim", "{victim}"], ["victim queries: "]),
    "hopskipjump": (["attack", "hopskipjump", "--victim", "{victim}", "--n", "2", "--budget", "200"],
                    ["/200 q"]),
    "fgsm": (["attack", "fgsm", "--substitute", "{substitute}", "--victim", "{victim}", "--n", "20",
              "--budget", "100"], ["/100 q"]),
    "certify": (["certify", "--model", "{victim}", "--sigma", "0.25", "--n0", "10", "--n", "50", "--num", "4"],
                ["certify: ", "/4 img"]),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.slow
def test_each_command_family_reports_progress_off_a_terminal_and_not_with_q(
        name: str, models: dict[str, str], tmp_path, capsys, loud: None) -> None:
    args, wanted = RUNS[name]
    args = [a.format(**models) for a in args]
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert STATUS.search(err), err
    for w in wanted:
        assert w in err, (w, err)
    assert not STATUS.search(out), out  # progress is on stderr only
    assert main(["-q", *args, "--out", str(tmp_path / "quiet")]) == 0
    out, err = capsys.readouterr()
    assert not STATUS.search(err) and "/s" not in err, err


def test_reproduce_counts_studies(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys, loud: None) -> None:
    import stealkit.experiments.reproduce as R

    def fake(cfg, out, force, device=None):
        return {"name": cfg.name, "description": cfg.description, "dir": str(out / cfg.name), "seconds": 0.0,
                "step_seconds": {}, "queries": None, "rows": [], "final_step": None, "error": "skipped here"}

    monkeypatch.setattr(R, "run_study", fake)
    monkeypatch.setattr(R, "render", lambda summary, configs: "")
    monkeypatch.setattr(R, "markdown", lambda summary: "")
    R.reproduce("small", tmp_path)
    err = capsys.readouterr().err
    n = len(R.config_paths("small"))
    assert f"reproduce: 1/{n} study (" in err and f"reproduce: done, {n} study in " in err, err
