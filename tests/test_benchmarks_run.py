"""Every benchmark kept in ``benchmarks/`` runs end to end at a tiny size and prints the JSON it promises.

These are not measurements (the sizes are far too small to mean anything); they keep the scripts from rotting:
a change to the package that breaks a benchmark fails here. Digits victims throughout, so nothing needs
Fashion-MNIST; the scripts that compare against ART skip their ART rows where ART is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_ART = importlib.util.find_spec("art") is not None

#: script -> (tiny arguments, keys its JSON must have); ``{tmp}`` is the test's temporary folder
RUNS: dict[str, tuple[list[str], set[str]]] = {
    "adaptive_misinformation": (["--rows", "{tmp}/am.jsonl", "--victim-dir", "{tmp}/am-victim", "--out", "{tmp}/am",
                                 "--budgets", "20", "--seeds", "0", "--pools", "pool", "--served", "am-argmax"],
                                set()),
    "attack_speed": (["--victim", "digits-conv2", "--n", "64", "--batches", "32", "--repeats", "1",
                      "--threads", "1", "--libraries", "stealkit,plain", "--jsonl", "{tmp}/rows.jsonl"], {"results"}),
    # the committed rows of the same plan at 1e82ecb and on the audit package: equal on the rows it compares
    "audit_compare": (["results/rows/audit-digits-quick-nodef-1e82ecb.json",
                       "results/rows/audit-digits-quick-nodef-1e82ecb.json"], {"equal", "differences"}),
    "audit_consistency": (["--answers", "label", "--budgets", "20", "--transfer-images", "10", "--decision-images",
                           "2", "--decision-queries", "20", "--set", "student=mlp2", "--out", "{tmp}/consistency"],
                          {"figures", "all_equal"}),
    "audit_ray": (["--small", "--repeats", "1", "--out", "{tmp}/ray"], {"figures_identical", "parts"}),
    "breast_cancer_victim": (["--out", "{tmp}/bc"], {"test_accuracy", "features"}),
    "certify": (["--dataset", "digits", "--num", "2", "--n0", "20", "--n", "100", "--threads", "1",
                 "--mem-ns", "", "--skip-art", "--jsonl", "{tmp}/rows.jsonl"], set()),
    "data_free": (["--victim", "digits-conv2", "--methods", "codfe", "--modes", "label", "--budget", "1000",
                   "--marks", "500,1000", "--recipe", "labelonly-v3", "--seeds", "0", "--threads", "1",
                   "--jsonl", "{tmp}/rows.jsonl"],
                  {"runs"}),
    "decision_attacks": (["--dataset", "digits", "--n", "2", "--val", "1", "--seeds", "0", "--budgets", "60",
                          "--tools", "hsj,boundary", "--jsonl", "{tmp}/rows.jsonl"], set()),
    "exact_recovery": (["--quick", "--variants", "secant,mq", "--jsonl", "{tmp}/rows.jsonl"], set()),
    "gpu_check": (["--tiny", "--device", "cpu", "--steps", "tier,dfme", "--out", "{tmp}/gpu"], {"device", "figures"}),
    "gradient_matching": (["--quick", "--queries", "10", "--steps", "20", "--jsonl", "{tmp}/rows.jsonl"], set()),
    "http_throughput": (["--victim", "digits-conv2", "--batches", "8", "--images", "64", "--threads", "1",
                         "--clients", "1", "--workers", "1", "--jsonl", "{tmp}/rows.jsonl"], set()),
    "oracle_overhead": (["--victim", "digits-conv2", "--batches", "4", "--batch-size", "32", "--repeats", "1",
                         "--jsonl", "{tmp}/rows.jsonl"],
                        set()),
    "surrogate_extraction": (["--active", "--victim", "digits-conv2", "--budgets", "20", "--modes", "label",
                              "--seeds", "0", "--rows", "ours-default" + (",art" if HAS_ART else ""),
                              "--epochs", "1", "--jsonl", "{tmp}/rows.jsonl"], {"rows", "table"}),
    "noisy_neighbour": (["--flood", "2", "--batch", "1", "--samples", "2", "--probes", "5", "--gap", "0.01",
                         "--port", "{port}", "--out", "{tmp}/noisy.json"], set()),
    "serve_attack": (["--half-open", "20", "--slow-per-key", "2", "--junk", "2", "--flood", "1", "--flood-batch", "8",
                      "--seconds", "1", "--slow-seconds", "2", "--port", "{port}", "--out", "{tmp}/attack.json"],
                     set()),
}
#: scripts that write their JSON to --out instead of printing it
OUT_FILE = {"noisy_neighbour": "noisy.json", "serve_attack": "attack.json", "gpu_check": "gpu/gpu_check.json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json_doc(stdout: str) -> Any:
    """The JSON document a benchmark printed: the whole stdout, else its last line that parses."""
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        for line in reversed(stdout.strip().splitlines()):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise AssertionError(f"no JSON in the benchmark's output:\n{stdout[-2000:]}")


def test_every_kept_benchmark_has_a_tiny_run() -> None:
    # modules, tested in their own files
    helpers = {"pool_image_sets", "evidence", "results_tables", "results_figures", "results_audit", "rowmeta"}
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - helpers
    assert scripts == set(RUNS), f"benchmarks without a tiny run here: {sorted(scripts - set(RUNS))}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_benchmark_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    args, keys = RUNS[name]
    port = str(_free_port())
    args = [a.replace("{tmp}", str(tmp_path)).replace("{port}", port) for a in args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "STEALKIT_QUIET": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    out = tmp_path / OUT_FILE.get(name, "-")
    doc = json.loads(out.read_text()) if out.is_file() else _json_doc(proc.stdout)
    assert isinstance(doc, dict), f"{name} printed {type(doc).__name__}, not a JSON object"
    assert keys <= set(doc), f"{name}: missing keys {sorted(keys - set(doc))}"
    if "--jsonl" in args:  # the raw rows and, written after the last, their meta (benchmarks/rowmeta.py)
        rows = (tmp_path / "rows.jsonl").read_text(encoding="utf-8").splitlines()
        assert rows and all(isinstance(json.loads(r), dict) for r in rows), name
        meta = json.loads((tmp_path / "rows.meta.json").read_text(encoding="utf-8"))
        assert {"command", "commit", "date", "torch", "device", "seeds", "data", "load"} <= set(meta), name


@pytest.mark.slow
def test_gpu_papers_script_runs_a_step_at_a_tiny_size_and_packs_its_state(tmp_path: Path) -> None:
    """``benchmarks/gpu_papers.sh`` (issues 42-43) dry run: one step on the CPU; the run folder is packed for
    the next call."""
    import tarfile

    env = {**os.environ, "PYTHON": sys.executable, "RUNS": str(tmp_path / "runs"), "OUT": str(tmp_path / "out"),
           "OMP_NUM_THREADS": "1", "STEALKIT_QUIET": "1"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_papers.sh"), "table4", "--tiny", "--device", "cpu"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exit 0 after" in (tmp_path / "out" / "steps.log").read_text()
    with tarfile.open(tmp_path / "out" / "papers-state.tgz") as tar:
        assert any(n.endswith("table4-tiny/summary.json") for n in tar.getnames())
    assert json.loads((tmp_path / "out" / "device.json").read_text())["device"] == "cpu"


@pytest.mark.slow
def test_attack_speed_per_step_mode_reports_slope_and_ops(tmp_path: Path) -> None:
    """``attack_speed.py --per-step`` (issue 53): per-step and fixed times for every library, the operation counts,
    and another version of the loop timed beside the current one (here the same file)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "STEALKIT_QUIET": "1"}
    before = ROOT / "src" / "stealkit" / "evade" / "gradient_based" / "gradient.py"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attack_speed.py"), "--victim", "digits-conv2",
                           "--n", "16", "--batches", "8", "--repeats", "1", "--threads", "1", "--per-step", "1,2",
                           "--libraries", "stealkit,plain", "--before", str(before), "--ops"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = _json_doc(proc.stdout)
    assert {r["library"] for r in doc["results"]} == {"stealkit", "plain", "stealkit-before"}
    assert all({"per_step_ms", "fixed_ms", "per_step_cpu_ms"} <= set(r) for r in doc["results"])
    ops = doc["ops_per_step"]
    assert ops["stealkit batch 8"]["total"] == ops["stealkit-before batch 8"]["total"] > 0


@pytest.mark.slow
def test_gpu_check_plan_53_lists_what_the_budget_did_not_reach(tmp_path: Path) -> None:
    """``gpu_check.py --plan 53`` (issue 53): the steps in the issue's order; a step the budget does not reach is a
    row that says "not run", with the device line beside it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--plan", "53", "--budget", "1",
                           "--device", "cpu", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == ["pgd", "certify", "audit", "labelonly", "stn", "table4", "milli"]
    assert all(r["value"] == "not run: the budget was spent" and r["device_line"]["commit"] for r in rows)
