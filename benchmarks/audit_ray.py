"""``stealkit audit --backend ray`` against ``--jobs N`` on the same cores (issue 54, "What it must show").

Runs the same audit with the local backend (``--jobs N``: worker processes) and with ``--backend ray`` (a local Ray
of N CPUs started by the command), interleaved (local, ray, ray, local, ...), each as a user runs it: a separate
``stealkit audit`` process, timed from its start to its exit (Ray's start included). Checks that every run's
``audit.json`` holds the same figures (timings left out), and prints JSON: each run's wall time, the median of each
backend and their ratio, a table of each part's seconds (the median over the Ray runs, where ``ray.jsonl`` says
which node ran it) and the wall time projected on 1, 2, 4, ... nodes of ``--cpus-per-node`` CPUs: the parts that
need no stolen copy placed largest first on the first free CPU, then those that start from the best copy likewise
(the audit's critical path: the best copy, then the parts that need it; Ray's start and the driver's own work
(plan, summary, report) are added as measured: the wall time less the parts' makespan on this machine).

    python benchmarks/audit_ray.py --out runs/audit-ray                       # the quick digits audit, 2 repeats
    python benchmarks/audit_ray.py --small --repeats 1 --out /tmp/audit-ray   # 4 extraction parts + PGD transfer
    python benchmarks/audit_ray.py --victim standard:fmnist-conv2 --default --repeats 1 --out runs/audit-ray-fm
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the small audit: the label ladder 50 and 100 for both attackers, PGD from the copy on 20 images
SMALL = ["--answers", "label", "--budgets", "50,100", "--transfer-images", "20", "--decision-images", "0",
         "--datafree-budget", "0", "--defence", "none", "--gradmatch-budgets", "0", "--exact-budget", "0",
         "--seeds", "1"]
TIMING = ("elapsed_s", "seconds")


def audit(args: list[str], out: Path) -> float:
    """``stealkit audit ARGS --out OUT`` as a separate process; its wall seconds, also written to ``OUT/wall.json``
    (what ``--resume`` reads back)."""
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "stealkit.cli", "-q", "audit", *args, "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1, 3):  # 1 and 3: a gate's verdict, not a failure
        raise SystemExit(f"stealkit audit exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    wall = round(time.perf_counter() - started, 1)
    (out / "wall.json").write_text(json.dumps({"wall_s": wall, "ended": datetime.datetime.now(
        datetime.UTC).isoformat(timespec="seconds"), "load_after": round(os.getloadavg()[0], 2)}))
    return wall


def figures(path: Path) -> Any:
    """``audit.json`` without its timings, with the audit's own folder written as OUT (the test of the Ray backend
    compares its runs by this too)."""
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMING}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x.replace(str(path), "OUT") if isinstance(x, str) else x

    return strip(json.loads((path / "audit.json").read_text(encoding="utf-8")))


def makespan(times: list[float], slots: int) -> float:
    """Largest first, each on the first free slot (the --jobs order): when the last one ends."""
    free = [0.0] * max(1, slots)
    for t in sorted(times, reverse=True):
        i = free.index(min(free))
        free[i] += t
    return max(free) if times else 0.0


def project(parts: list[dict[str, Any]], nodes: list[int], cpus: int, fixed: float) -> dict[str, float]:
    free = [p["ray_s"] for p in parts if not p["needs_copy"]]
    rest = [p["ray_s"] for p in parts if p["needs_copy"]]
    return {str(n): round(fixed + makespan(free, n * cpus) + makespan(rest, n * cpus), 1) for n in nodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", default="standard:digits-conv2")
    ap.add_argument("--small", action="store_true", help="the small audit (4 extraction parts and PGD), not --quick")
    ap.add_argument("--default", action="store_true", help="the default audit, not --quick")
    ap.add_argument("--jobs", type=int, default=2, help="--jobs of the local runs; CPUs of the local Ray")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--nodes", default="1,2,4,8,16", help="node counts of the projection")
    ap.add_argument("--cpus-per-node", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true",
                    help="keep a run whose OUT/<backend>-<repeat>/wall.json exists (a benchmark stopped between runs)")
    a = ap.parse_args()

    from stealkit.audit.kinds import KINDS
    from stealkit.rundir import environment

    env = environment()
    base = ["--victim", a.victim, *([] if a.default else ["--quick"]), "--seed", str(a.seed), *(SMALL if a.small else [])]
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for r in range(a.repeats):
        order = ("local", "ray") if r % 2 == 0 else ("ray", "local")
        for backend in order:
            out = a.out / f"{backend}-{r}"
            extra = ["--jobs", str(a.jobs)] + (["--backend", "ray"] if backend == "ray" else [])
            if a.resume and (out / "wall.json").exists() and (out / "audit.json").exists():
                kept = json.loads((out / "wall.json").read_text(encoding="utf-8"))
                runs.append({"backend": backend, "repeat": r, "out": str(out), "resumed": True, **kept})
                continue
            wall = audit([*base, *extra], out)
            runs.append({"backend": backend, "repeat": r, "wall_s": wall, "out": str(out),
                         "load_after": round(os.getloadavg()[0], 2)})
    first = figures(Path(runs[0]["out"]))
    identical = all(figures(Path(run["out"])) == first for run in runs)
    median = {b: statistics.median(run["wall_s"] for run in runs if run["backend"] == b) for b in ("local", "ray")}

    by_part: dict[str, dict[str, Any]] = {}
    for run in runs:
        summary = json.loads((Path(run["out"]) / "summary.json").read_text(encoding="utf-8"))
        where = {}
        if run["backend"] == "ray":
            for line in (Path(run["out"]) / "ray.jsonl").read_text(encoding="utf-8").splitlines():
                w = json.loads(line)
                where[w["id"]] = w["node"][:8]
        for p in summary["parts"]:
            row = by_part.setdefault(p["id"], {"id": p["id"], "kind": p["part"]["kind"],
                                               "needs_copy": KINDS[p["part"]["kind"]].needs_copy,
                                               "local": [], "ray": [], "nodes": []})
            row[run["backend"]].append(p["elapsed_s"])
            if p["id"] in where:
                row["nodes"].append(where[p["id"]])
    parts = [{"id": r["id"], "kind": r["kind"], "needs_copy": r["needs_copy"],
              "local_s": round(statistics.median(r["local"]), 1), "ray_s": round(statistics.median(r["ray"]), 1),
              "ray_nodes": sorted(set(r["nodes"]))} for r in by_part.values()]
    here = makespan([p["ray_s"] for p in parts if not p["needs_copy"]], a.jobs) + \
        makespan([p["ray_s"] for p in parts if p["needs_copy"]], a.jobs)
    fixed = max(0.0, median["ray"] - here)  # Ray's start, the plan, the summary and the report
    nodes = [int(n) for n in a.nodes.split(",")]
    print(json.dumps({
        "what": "stealkit audit --jobs N against --backend ray (a local Ray of N CPUs) on the same cores",
        "command": f"stealkit audit {' '.join(base)} --jobs {a.jobs} [--backend ray]",
        "date": datetime.date.today().isoformat(), "commit": env.get("git_commit"), "torch": env.get("torch"),
        "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before], "repeats": a.repeats,
        "runs": runs, "median_wall_s": median, "ray_over_local": round(median["ray"] / median["local"], 2),
        "figures_identical": identical, "parts": parts,
        "critical_path_s": round(max((p["ray_s"] for p in parts if not p["needs_copy"]), default=0.0)
                                 + max((p["ray_s"] for p in parts if p["needs_copy"]), default=0.0), 1),
        "fixed_s": round(fixed, 1),
        "projected_wall_s": project(parts, nodes, a.cpus_per_node, fixed),
        "projection": f"nodes of {a.cpus_per_node} CPUs; each part's Ray time; plus the fixed part of the measured "
                      "wall (Ray's start, the plan, the summary, the report)",
    }, indent=1))


if __name__ == "__main__":
    main()
