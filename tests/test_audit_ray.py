"""``stealkit audit --backend ray``: the parts as Ray tasks on a two-node cluster (``ray.cluster_utils.Cluster``
on this machine, one CPU and one custom resource per node).

- The figures of ``audit.json`` are those of ``--jobs 1`` at the same seed, with the workers acting as if they saw
  none of the driver's files (``STEALKIT_RAY_SHIP=1``: the victim from the object store, each part's folder shipped
  back); the two extraction parts, one CPU each, ran on both nodes at once (``ray.jsonl``).
- A driver SIGKILLed while an extraction part is midway (its answers paid for and journalled) and run again keeps the
  finished parts, gives the stopped part its answers back from its journal, and the server of an HTTP victim
  (queried from the workers with the audit's key) counts each query of the ledgers once.
- Without Ray, or with ``--address`` and no ``--backend ray``, the command refuses in one line (not slow).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stealkit.cli import main
from tests.audit_kit import kill_when, run_audit_command
from tests.conftest import load_benchmark
from tests.test_audit import NO_EXTRAS_KW, TINY, TINY_KW, VICTIM

ROOT = Path(__file__).resolve().parents[1]
KEY = "ray-audit-key-Q7mWv2Lp9TxB4nRc8Ks1"
#: the evaluation queries of the HTTP victim: its labels of digits' 450 test images, bought once by the driver
EVALUATION = 450
#: the smallest audit with a part that needs the stolen copy: two label extractions of 20 queries, PGD on 5 images
SMALL_KW: dict[str, Any] = {"answers": "label", "budgets": "20", "settings": TINY_KW, **NO_EXTRAS_KW,
                            "transfer_images": 5}
SMALL = ["--answers", "label", "--budgets", "20", *TINY, "--transfer-images", "5", "--decision-images", "0",
         "--datafree-budget", "0", "--defence", "none", "--gradmatch-budgets", "0", "--exact-budget", "0",
         "--seeds", "1"]


def test_address_without_the_ray_backend_is_refused_in_one_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--victim", VICTIM, "--address", "ray://head:10001", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--backend ray" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()


def test_the_ray_backend_without_ray_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    for argv in (["audit", "--victim", VICTIM, "--backend", "ray", "--out", str(tmp_path / "a")],
                 ["reproduce", "--backend", "ray", "--out", str(tmp_path / "r")],
                 ["sweep", "x.toml", "--grid", "seed=0,1", "--backend", "ray", "--out", str(tmp_path / "s")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "stealkit[ray]" in err and "ray extra" in err and len(err.strip().splitlines()) == 1, err
    assert not any((tmp_path / d).exists() for d in "ars")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    c.add_node(num_cpus=1, resources={"node_b": 1})
    c.wait_for_nodes()
    try:
        yield c
    finally:
        c.shutdown()


@pytest.mark.slow
def test_parts_on_two_nodes_give_the_figures_of_one_process(cluster: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the standard victims' cache
    from stealkit.victims import standard_victim

    victim = str(standard_victim(VICTIM.split(":", 1)[1]).path)
    run_audit_command(victim=victim, out=str(tmp_path / "one"), jobs=1, **SMALL_KW)
    monkeypatch.setenv("STEALKIT_RAY_SHIP", "1")  # the workers read none of the driver's files
    seen: list[str] = []
    run_audit_command(victim=victim, out=str(tmp_path / "ray"), backend="ray", address=cluster.address,
                      on_part=lambda part, _r: seen.append(part.kind), **SMALL_KW)
    figures = load_benchmark("audit_ray").figures  # audit.json less its timings, the benchmark's comparison
    assert figures(tmp_path / "ray") == figures(tmp_path / "one")
    assert seen == ["extract", "extract", "transfer"]  # the attack from the copy after every extraction
    where = [json.loads(line) for line in (tmp_path / "ray" / "ray.jsonl").read_text().splitlines()]
    nodes = {cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)}
    assert len(nodes) == 2
    extractions = {w["node"] for w in where if w["id"].startswith("extract-")}
    assert extractions == nodes  # one CPU a node: the two extraction parts ran on both nodes at once
    assert all(not w["shared_fs"] and w["num_cpus"] == 1 for w in where)
    for pid in ("extract-label-like-20", "extract-label-unrelated-20"):  # shipped back: the copy and its journal
        assert (tmp_path / "ray" / "parts" / pid / "student").is_dir()
        assert (tmp_path / "ray" / "parts" / f"{pid}.answers").stat().st_size > 0
    config = json.loads((tmp_path / "ray" / "parts" / "transfer-pgd-5" / "config.json").read_text())
    assert str(tmp_path / "ray" / "parts") in json.dumps(config) and "stealkit-part-" not in json.dumps(config)


def used(url: str) -> int:
    import httpx

    r = httpx.get(url + "/v1/charges", params={"limit": 1}, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    return int(r.json()["queries_used"]["predict"])


def driver(url: str, address: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    # 600 training steps after its queries (a second or more): time to be killed between its answers and its end
    cmd = [sys.executable, "-m", "stealkit.cli", "-q", "audit", "--victim", url, "--key", KEY, "--dataset", "digits",
           *SMALL, "--set", "min_steps=600", "--backend", "ray", "--address", address, "--out", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


EXTRACTIONS = ("extract-label-like-20", "extract-label-unrelated-20")


@pytest.mark.slow
def test_a_killed_driver_run_again_pays_for_nothing_twice(cluster: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the standard victims' cache
    from stealkit.victims import standard_victim
    from tests.test_serve_support import live_server, write_keys

    victim = standard_victim("digits-mlp2").path
    keys = write_keys(tmp_path / "keys.toml", [{"key": KEY, "name": "audit", "mode": "probs", "budget": 5000}])
    out, log = tmp_path / "audit", tmp_path / "audit.log"
    journals = [out / "parts" / f"{p}.answers" for p in EXTRACTIONS]
    with live_server(Path(victim), keys, tmp_path / "db.sqlite", log=tmp_path / "server.log") as url:
        start = used(url)
        proc = driver(url, cluster.address, out, log)
        # killed once both extraction parts' answers are counted by the server and kept in their journals
        kill_when(proc, lambda: all(j.exists() and j.stat().st_size > 0 for j in journals)
                  and used(url) - start >= EVALUATION + 40, log)
        first = sorted(p.stem for p in (out / "parts").glob("*.json"))
        killed = [p for p in EXTRACTIONS if p not in first]
        assert killed and not (out / "summary.json").exists(), first  # an extraction part was stopped midway
        stamps = {p: (out / "parts" / f"{p}.json").stat().st_mtime_ns for p in first}
        again = driver(url, cluster.address, out, log)
        assert again.wait() == 0, log.read_text()[-3000:]
        server = used(url) - start
    summary = json.loads((out / "summary.json").read_text())
    assert {p: (out / "parts" / f"{p}.json").stat().st_mtime_ns for p in first} == stamps  # not run again
    records = [json.loads(line)["id"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(records) == sorted(r["id"] for r in summary["parts"]) and len(records) == 3  # each once
    rerun = {r["id"]: r for r in summary["parts"]}
    assert all(rerun[p]["replayed"] == rerun[p]["total_queries"] == 20 for p in killed)  # answers given back
    assert 0 < summary["queries"] <= summary["planned_queries"] == 50
    assert server == EVALUATION + summary["queries"]  # each query the ledgers count answered once, over both drivers
    assert summary["reconciliation"]["equal"] is True
    where = [json.loads(line) for line in (out / "ray.jsonl").read_text().splitlines()]
    assert all(w["shared_fs"] for w in where)  # one machine: the workers wrote into --out themselves


@pytest.mark.slow
def test_reproduce_on_ray_runs_each_study_as_a_task_with_the_local_results(cluster: Any, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from stealkit.experiments import reproduce as rp
    from tests.test_experiments import TINY as TINY_STUDY

    paths = []
    for name in ("tiny", "second"):
        paths.append(tmp_path / f"{name}.toml")
        paths[-1].write_text(TINY_STUDY.replace('name = "tiny"', f'name = "{name}"'))
    monkeypatch.setattr(rp, "config_paths", lambda scale: paths)
    local = rp.reproduce("small", tmp_path / "local", jobs=1)
    ray = rp.reproduce("small", tmp_path / "ray", jobs=2, backend="ray", address=cluster.address)
    assert ray["backend"] == "ray" and [s["name"] for s in ray["studies"]] == ["tiny", "second"] and not ray["failed"]
    for a, b in zip(local["studies"], ray["studies"], strict=True):
        sa, sb = (json.loads((Path(s["final_step"]) / "summary.json").read_text()) for s in (a, b))
        assert sa["queries"] == sb["queries"] and sa["accuracy"] == sb["accuracy"] and a["queries"] == b["queries"]
    again = rp.reproduce("small", tmp_path / "ray", jobs=2, backend="ray", address=cluster.address)
    assert all(s["skipped_steps"] == ["victim", "steal"] for s in again["studies"])  # finished steps kept


def test_a_local_ray_starts_apart_from_a_running_one_with_its_tasks_at_the_drivers_priority(cluster: Any) -> None:
    """Without ``--address`` the command starts its own Ray of ``--jobs`` CPUs, even while another Ray runs on the
    machine (here the module's cluster), and its workers run at the driver's niceness (Ray's default is 15: on
    shared cores a part would wait behind every other process)."""
    from stealkit.raytasks import NICENESS_ENV, remote, session

    def nice() -> int:
        return os.nice(0)

    assert NICENESS_ENV not in os.environ
    with session(None, 1) as ray:
        assert ray.get(remote(nice).remote()) == os.nice(0)
        assert ray.cluster_resources().get("CPU") == 1 and "node_a" not in ray.cluster_resources()
    assert NICENESS_ENV not in os.environ
