"""Every kind of run the CLI makes: ``stealkit report RUN`` re-renders the very page the run wrote.

One tiny run per kind (heavier studies are marked ``slow``); the page the run wrote and the page ``stealkit
report`` writes again must be equal but for the time stamp. A kind missing here fails
:func:`test_every_kind_in_the_table_is_covered`, so a new kind can't be added without its check.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from stealkit.cli import main
from stealkit.report.kinds import BUILDERS, FAMILIES, builder_for

VICTIM = "{victim}"
SUBSTITUTE = "{substitute}"

#: run kind -> (CLI arguments before --out, slow?)
RUNS: dict[str, tuple[list[str], bool]] = {
    "demo": (["demo", "--budgets", "20,40"], True),
    "train": (["train", "--dataset", "digits", "--arch", "logistic", "--epochs", "1"], False),
    "train-robust": (["train-robust", "--dataset", "digits", "--arch", "logistic", "--method", "stability",
                      "--sigma", "0.25", "--epochs", "1"], False),
    "extract baseline": (["extract", "baseline", "--victim", VICTIM, "--budget", "60", "--checkpoints", "30,60",
                          "--student", "mlp2", "--student-arg", "hidden=8", "--epochs", "2"], False),
    "extract surrogate": (["extract", "surrogate", "--victim", VICTIM, "--budget", "60", "--epochs", "2", "--mode",
                           "label",  # probability answers raise training to 3,000 steps: minutes
                           "--student", "mlp2", "--student-arg", "hidden=8"], False),
    **{f"extract {m}": (["extract", m, "--victim", VICTIM, "--budget", "2000", "--mode", mode,
                         "--student", "mlp2", "--student-arg", "hidden=8", "--batch-size", "20", "--ngf", "4",
                         "--eval-every", "1000", "--max-iterations", "2"], True)
       for m, mode in (("dfme", "probs"), ("maze", "probs"), ("dast", "label"))},
    # the default label-only recipe's fixed costs (its student selection, a 30 s run even at two iterations)
    "extract codfe": (["extract", "codfe", "--victim", VICTIM, "--budget", "2000", "--mode", "label",
                       "--student", "mlp2", "--student-arg", "hidden=8", "--batch-size", "20", "--ngf", "4",
                       "--eval-every", "1000", "--max-iterations", "2"], True),
    "extract gradient-matching": (["extract", "gradient-matching", "--victim", VICTIM, "--budget", "10",
                                   "--checkpoints", "5,10",
                                   "--student", "mlp2", "--student-arg", "hidden=8", "--steps", "20"], False),
    "extract exact": (["extract", "exact", "--victim", VICTIM], False),
    "attack fgsm": (["attack", "fgsm", "--substitute", SUBSTITUTE, "--victim", VICTIM, "--n", "20"], False),
    "attack hopskipjump": (["attack", "hopskipjump", "--victim", VICTIM, "--n", "2", "--budget", "200"], False),
    "certify": (["certify", "--model", VICTIM, "--sigma", "0.25", "--n0", "10", "--n", "50", "--num", "4"], False),
    "certify-study": (["certify-study", "--quick", "--parts", "bounds"], False),
    "defences": (["defences", "--budget", "40", "--seeds", "0", "--epochs", "1", "--defence", "none",
                  "--defence", "label"], True),
    "audit": (["audit", "--victim", VICTIM, "--answers", "label", "--budgets", "20", "--set", "student=mlp2",
               "--set", "student.hidden=8", "--set", "epochs=1",
               # the attack parts at a tiny size (their tables on the page); the data-free part is left out
               "--transfer-images", "10", "--decision-images", "1", "--decision-queries", "40",
               "--datafree-budget", "0", "--gradmatch-budgets", "10", "--exact-budget", "0"], True),
    "attack study": (["attack", "study", "--quick", "--n", "20", "--datafree", ""], True),
    "study dfme-table4": (["study", "dfme-table4", "--victims", "digits-conv2", "--columns", "gaussian", "--taus", "1",
                           "--schedules", "cyclic", "--max-distinct", "40", "--epochs", "1"], True),
    "study dfme-logits": (["study", "dfme-logits", "--victims", "digits-logistic"], True),
    "study dfme-hypothesis1": (["study", "dfme-hypothesis1", "--victims", "digits-conv2", "--losses", "kl", "--repeats", "2",
                                "--epochs", "1"], True),
    "study codfe": (["study", "codfe", "--datasets", "digits", "--budget", "2000", "--noise-set", "500"], True),
    "study explanations": (["study", "explanations", "--quick", "--archs", "logistic", "--figures", "2",
                            "--queries", "1,10", "--steps", "20"], True),
}
#: kinds of the same family share a builder; these stand for their families
FAMILY_MEMBERS = {"attack": "attack fgsm", "extract": "extract baseline"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, hidden, seed in (("victim", 16, 0), ("substitute", 8, 1)):
        train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, lr=0.01, seed=seed), out=root / name,
                     arch_kwargs={"hidden": hidden})
        out[name] = str(root / name)
    return out


def _stamp_free(page: str) -> str:
    return re.sub(r"<p class='meta'>.*?</p>", "", page)


def test_every_kind_in_the_table_is_covered() -> None:
    assert set(BUILDERS) <= set(RUNS), f"add a run for {sorted(set(BUILDERS) - set(RUNS))} to RUNS"
    assert {FAMILY_MEMBERS[f] for f in FAMILIES} <= set(RUNS)
    for kind in [*BUILDERS, *FAMILY_MEMBERS.values()]:
        assert builder_for(kind)[1], kind  # every listed builder imports


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if slow else k
                                  for k, (_, slow) in RUNS.items()])
def test_report_rerenders_the_page_the_run_wrote(kind: str, models: dict[str, str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # standard victims are cached in runs/victims
    args = [a.format(**models) for a in RUNS[kind][0]]
    out = tmp_path / "run"
    assert main(["-q", *args, "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["command"] == kind
    written = (out / "report.html").read_text()
    assert builder_for(kind)[1]
    assert main(["report", str(out)]) == 0
    assert _stamp_free((out / "report.html").read_text()) == _stamp_free(written)
    assert "is not known to this version" not in written
    PAGES[kind] = tmp_path / "page.html"
    PAGES[kind].write_text(written)
    assert (out / "report.html").stat().st_mode & 0o044 == 0o044  # shareable, like any file the user writes

    # nothing that isn't stealkit's own becomes markup: plant a script in every string the page could show
    _plant(out / "config.json")
    _plant(out / "summary.json")
    records = out / "records.jsonl"
    if records.exists():
        lines = [json.dumps(_planted(json.loads(line))) for line in records.read_text().splitlines() if line]
        records.write_text("\n".join(lines) + "\n")
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert PLANT in json.dumps(json.loads((out / "summary.json").read_text()))
    assert "<script" not in page.lower() and "&lt;script&gt;" in page


PLANT = "<script>alert(1)</script>"
#: the page each kind's run wrote, for the browser check below (filled by the test above)
PAGES: dict[str, Path] = {}
#: what a page must not show a reader: Python reprs and float noise
REPRS = re.compile(r"\{'|\bNone\b|\bTrue\b|\bFalse\b|\d\.\d{9,}")


@pytest.mark.slow  # about 25 s: a browser over every page
def test_every_page_reads_well_in_chromium() -> None:
    """Chromium renders every page a run kind wrote at 1280 px: no horizontal overflow, every image loads, no
    Python repr or float noise in the text (runs after the kinds above, which collect the pages)."""
    from tests.test_report_browser import CHROMIUM, check_page

    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    if not PAGES:
        pytest.skip("no run of the kinds above in this session")
    shots = os.environ.get("STEALKIT_SCREENSHOTS")  # a folder: save each page as PNG (docs/img/ is made so)
    for kind, path in PAGES.items():
        shot = Path(shots) / f"report-{kind.replace(' ', '-')}.png" if shots else None
        result = check_page(path, width=1280, screenshot=shot)
        assert result["errors"] == [], kind
        assert result["images"] and all(i["ok"] for i in result["images"]) or "<img" not in path.read_text(), kind
        assert not result["overflow"], f"{kind}: the page is wider than 1280 px"
        found = [result["text"][max(0, m.start() - 80):m.end() + 20] for m in REPRS.finditer(result["text"])]
        assert not found, f"{kind}: {found[:3]} in the page's text"


def _planted(node: object) -> object:
    """Every string value gets the script appended (keys stay, so the builders still find their data)."""
    if isinstance(node, dict):
        return {k: _planted(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_planted(v) for v in node]
    return node + PLANT if isinstance(node, str) and node else node


def _plant(path: Path) -> None:
    if path.exists():
        path.write_text(json.dumps(_planted(json.loads(path.read_text()))))


def test_unknown_kind_gets_the_generic_page_and_a_note(tmp_path: Path) -> None:
    from stealkit.rundir import RunDir

    run = RunDir(tmp_path / "old").create(command="extinct-command", config={}, seed=0)
    run.write_summary({"accuracy": 0.5})
    assert main(["report", str(run.path)]) == 0
    page = run.report_path.read_text()
    assert "is not known to this version of stealkit" in page and "Summary" in page
