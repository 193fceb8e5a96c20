"""The GPU check (issue 41): every GPU figure the project still lacks, in one command, each step under its own limit.

Run it through ``benchmarks/gpu_check.sh`` on a bare GPU machine (it installs the carried wheels and points
``STEALKIT_DATA`` at the carried Fashion-MNIST files), or directly::

    python3 benchmarks/gpu_check.py --out DIR                 # the full check (about 8 minutes on one H100)
    python3 benchmarks/gpu_check.py --out DIR --tiny --device cpu   # the dry run: every step at a tiny size

Steps (each a child process of this script, killed at its limit; a failed or skipped step does not stop the
others):

- ``tier``: the ``gpu`` test tier (``pytest -m gpu``): passed / failed / skipped;
- ``serve``: ``stealkit serve --device D`` answering an extraction over HTTP; the extraction's ledger, the
  server's count (``/v1/info``) and a local run of the same command agree;
- ``ray``: ``stealkit sweep --backend ray --device D``: every trial's ``config.json`` names the device
  (skipped, with the reason, where Ray is not installed);
- ``pgd``: ``benchmarks/attack_speed.py`` (PGD Linf eps 0.1, 20 steps) at two batch sizes: stealkit,
  torchattacks, ART and a plain loop, interleaved; goal stealkit <= torchattacks' time at both batches;
- ``certify``: ``benchmarks/certify.py --rate-batches`` (sigma 0.5, n 10k): certification beside the bare
  noise+forward rate at the same batch; goal >= 90 % of it at both batches;
- ``dfme``: ``benchmarks/data_free.py``: DFME with probabilities, 2M queries, end to end; goal <= 40 s of
  extraction wall time and a ledger that spent the budget exactly (at most one iteration's cost unspent).
- ``audit``: the default Fashion-MNIST audit, ``stealkit audit --victim standard:fmnist-conv2 --device D``, its
  wall time (goal <= 180 s on one H100) and its verdict's first line;
- ``labelonly``, ``stn``, ``table4``, ``milli``: the papers' settings (issues 42, 43), each one call of
  ``benchmarks/gpu_papers.sh STEP`` under this step's limit (``LIMIT``); a step stopped at its limit is resumable
  (the run folders are packed into ``OUT/papers/papers-state.tgz``: put it in ``.gpu/`` for the next call).

``--plan 53`` runs issue 53's order: ``pgd,certify`` (side by side), ``audit``, then the papers, highest value first
(``labelonly,stn,table4,milli``). ``--budget SECONDS`` caps the whole run: a step starts with at most what is
left, and a step with less than 30 s left is listed as not run (a row that says so), never dropped.

Writes ``gpu_check.jsonl`` (one JSON line per figure, each with the device line), ``gpu_check.json`` (the
device line and every figure), ``gpu_check.md`` (the table) and ``logs.txt`` (every step's output) to
``--out``. Exits 1 if a step crashed or ran past its limit (a goal not met is a figure, not a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# step -> (limit in seconds for the full check, limit for --tiny); the full limits add up to 8 minutes
LIMITS: dict[str, tuple[int, int]] = {"tier": (150, 300), "serve": (60, 120), "ray": (45, 120),
                                      "pgd": (90, 120), "certify": (120, 120), "dfme": (200, 180),
                                      "audit": (240, 400), "labelonly": (540, 300), "stn": (540, 300),
                                      "table4": (540, 300), "milli": (540, 300)}
#: the run orders ``--plan`` names
PLANS: dict[str, str] = {"check": "tier,serve,ray,pgd,certify,dfme",
                         "53": "pgd,certify,audit,labelonly,stn,table4,milli"}
#: the papers' steps: gpu_papers.sh's step, and what it runs
PAPERS: dict[str, str] = {"labelonly": "CoDFe label-only data-free, standard:fmnist-conv2, to 2M queries",
                          "stn": "STN certification (Li et al. Sec. 6), n = 100k, 500 points, four sigmas",
                          "table4": "DFME Table 4, Fashion-MNIST, 50,000 distinct samples",
                          "milli": "Milli et al. Figures 2-4, Fashion-MNIST, seeds 0-2"}


def device_line(device: str) -> dict[str, Any]:
    """GPU name, driver, CUDA and torch versions, and the commit of the tree under test."""
    import torch

    line: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": platform.python_version(), "cpus": os.cpu_count(), "commit": commit()}
    if device.startswith("cuda") and torch.cuda.is_available():
        line["gpu"] = torch.cuda.get_device_name(0)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            line["driver"], line["gpu_memory"] = [s.strip() for s in out.split(",")][:2]
    else:
        line["gpu"] = None
    return line


def commit() -> str:
    """The commit under test: ``.gpu/COMMIT`` (written before the tree is sent; it carries no .git), else git."""
    stamp = ROOT / ".gpu" / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=False)
        if out.returncode == 0:
            return out.stdout.strip()
    return "unknown"


def stealkit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "stealkit", "-q", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def checked(proc: subprocess.CompletedProcess[str], what: str) -> str:
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} exited {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout


def bench(script: str, *args: str) -> dict[str, Any]:
    """Run one of the benchmark scripts; its stdout is one JSON document, its stderr goes to our stderr."""
    proc = subprocess.run([PY, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} exited {proc.returncode}")
    return json.loads(proc.stdout)


# --- the steps: each returns a list of figures (dicts with "step", "figure", "value" and optional "goal", "met")


def step_tier(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    xml = work / "tier.xml"
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-m", "gpu", "-rfs", "--tb=short", "-p", "no:cacheprovider",
                           "tests/test_gpu.py", f"--junitxml={xml}"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    sys.stderr.write(proc.stdout)  # whole: a failure's message is the figure a GPU session came for
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ok = counts["failures"] == counts["errors"] == 0 and (passed > 0 or not device.startswith("cuda"))
    return [{"step": "tier", "figure": "gpu tier passed / failed / skipped",
             "value": f"{passed} / {counts['failures'] + counts['errors']} / {counts['skipped']}",
             "goal": "every test passes", "met": ok}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step_serve(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    import httpx

    from stealkit.victims import standard_victim

    victim = standard_victim("digits-conv2", device=device).path
    key = "gpu-check-" + os.urandom(8).hex()
    keys = work / "keys.toml"
    keys.write_text(f'[[key]]\nkey = "{key}"\nname = "check"\nmode = "probs"\nbudget = 1000000\n')
    port = free_port()
    server = subprocess.Popen([PY, "-m", "stealkit", "-q", "serve", "--model", str(victim), "--keys", str(keys),
                               "--db", str(work / "q.sqlite"), "--port", str(port), "--device", device,
                               "--threads", "1"], cwd=ROOT, stdout=sys.stderr, stderr=sys.stderr,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    budget = "200" if tiny else "1000"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"stealkit serve exited {server.returncode} before answering /healthz")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("stealkit serve did not answer /healthz within 60 s")
            time.sleep(0.3)
        common = ["--mode", "probs", "--budget", budget, "--device", device, "--seed", "0"]
        checked(stealkit("extract", "surrogate", "--victim", url, "--key", key, *common, "--out",
                         str(work / "http")), "extract over HTTP")
        used = httpx.get(url + "/v1/info", headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 15)
        server.wait(timeout=30)
    checked(stealkit("extract", "surrogate", "--victim", "standard:digits-conv2", *common, "--out",
                     str(work / "local")), "local extract")
    http = json.loads((work / "http" / "summary.json").read_text())
    local = json.loads((work / "local" / "summary.json").read_text())
    http_dev = json.loads((work / "http" / "config.json").read_text())["device"]
    same = http["queries"] == local["queries"] and http["queries"]["predict"] == used["queries_used"]["predict"]
    return [{"step": "serve", "figure": f"extraction over HTTP on {http_dev}: ledger / server / local",
             "value": f"{http['queries']['predict']} / {used['queries_used']['predict']} / "
                      f"{local['queries']['predict']} predict queries",
             "goal": "equal", "met": same},
            {"step": "serve", "figure": "student test accuracy over HTTP / local",
             "value": f"{http['accuracy']:.4f} / {local['accuracy']:.4f}"}]


def step_ray(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return [{"step": "ray", "figure": "sweep --backend ray: trials on the device", "value": "skipped",
                 "why": f"ray is not installed here ({exc}); its wheel (79 MB) does not fit the 64 MiB carry limit"}]
    from stealkit.victims import standard_victim

    victim = standard_victim("digits-conv2", device=device).path
    config = work / "tiny.toml"
    config.write_text(f'name = "gpu-check"\n[[step]]\nid = "steal"\ncommand = "extract baseline"\n'
                      f'args = {{ victim = "{victim}", budget = 30, epochs = 1, student = "mlp2" }}\n')
    checked(stealkit("sweep", str(config), "--grid", "seed=0,1", "--backend", "ray", "--workers", "2",
                     "--out", str(work / "sweep"), "--device", device), "sweep --backend ray")
    devices = sorted(json.loads((t / "steal" / "config.json").read_text())["device"]
                     for t in (work / "sweep").glob("trial-*"))
    want = "cuda:0" if device == "cuda" else device
    return [{"step": "ray", "figure": "sweep --backend ray: each trial's config.json device",
             "value": ", ".join(devices), "goal": f"all {want}", "met": bool(devices) and set(devices) == {want}}]


def step_pgd(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    args = (["--victim", "digits-conv2", "--n", "200", "--batches", "50,100", "--repeats", "1"] if tiny else
            ["--n", "10000", "--batches", "256,1000", "--repeats", "3"])
    res = bench("attack_speed.py", "--device", device, "--threads", str(os.cpu_count() or 1), *args)
    rows: list[dict[str, Any]] = []
    by = {(r["library"], r["batch"]): r for r in res["results"]}
    for b in sorted({r["batch"] for r in res["results"]}):
        libs = {lib: r for (lib, bb), r in by.items() if bb == b}
        cells = ", ".join(f"{lib} {r['median_s']:.2f} s ({r['success_rate']:.3f})" for lib, r in libs.items())
        row: dict[str, Any] = {"step": "pgd", "figure": f"PGD Linf {res['n']} images, batch {b}: median s (success)",
                               "value": cells}
        if "stealkit" in libs and "torchattacks" in libs:
            ratio = libs["stealkit"]["median_s"] / libs["torchattacks"]["median_s"]
            row |= {"goal": "stealkit <= torchattacks", "met": ratio <= 1.0, "ratio": round(ratio, 3)}
        rows.append(row)
    if res.get("skipped"):
        rows.append({"step": "pgd", "figure": "libraries skipped", "value": json.dumps(res["skipped"])})
    return rows


def step_certify(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    args = (["--dataset", "digits", "--num", "5", "--n0", "20", "--n", "200", "--rate-batches", "50,100",
             "--repeats", "1"] if tiny else
            ["--num", "100", "--n", "10000", "--rate-batches", "1000,10000", "--repeats", "3"])
    res = bench("certify.py", "--device", device, "--skip-art", "--mem-ns", "", "--threads",
                str(os.cpu_count() or 1), *args)
    return [{"step": "certify", "figure": f"certify sigma 0.5, n {res['settings']['n']}, batch {b}: images/s "
                                          "certify / bare noise+forward",
             "value": f"{r['median']['stealkit']:.2f} / {r['median']['bare']:.2f}",
             "goal": ">= 0.90 of bare", "met": r["stealkit_over_bare"] >= 0.9, "ratio": r["stealkit_over_bare"]}
            for b, r in res["rate"].items()]


def step_dfme(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    budget = 20_000 if tiny else 2_000_000
    args = (["--victim", "digits-conv2", "--preset", "cpu"] if tiny else
            ["--victim", "fmnist-conv2", "--preset", "reference"])
    marks = ",".join(str(budget * k // 8) for k in (1, 2, 4, 8))  # a run stopped at its limit keeps a rate
    res = bench("data_free.py", "--methods", "dfme", "--modes", "probs", "--budget", str(budget), "--marks",
                marks, "--points", str(work / "dfme-points.jsonl"), "--device", device, *args)
    run = res["runs"][0] if "runs" in res else res["results"][0]
    spent, cost = run["queries"]["predict"], run["cost_per_iteration"]
    exact = budget - cost < spent <= budget
    return [{"step": "dfme", "figure": f"DFME probabilities, {budget:,} queries, {run['victim']}: wall s "
                                       "(accuracy, ledger)",
             "value": f"{run['wall_seconds']} s (accuracy {run['final_accuracy']:.4f}, {spent:,} predict)",
             "goal": "<= 40 s, ledger exact", "met": run["wall_seconds"] <= 40 and exact,
             "ledger_exact": exact}]


def step_audit(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
    victim = "standard:digits-conv2" if tiny else "standard:fmnist-conv2"
    extra = ["--quick", "--answers", "label", "--datafree-budget", "0"] if tiny else []
    if not tiny:  # the victim is trained (or read from the cache) before the clock starts
        from stealkit.victims import standard_victim

        standard_victim("fmnist-conv2", device=device)
    out = work / "audit"
    t0 = time.perf_counter()
    proc = stealkit("audit", "--victim", victim, "--device", device, "--out", str(out), *extra, timeout=10_000)
    wall = round(time.perf_counter() - t0, 1)
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    verdict = next((ln.strip() for ln in proc.stdout.splitlines() if ln.strip()), "")
    keep = Path(os.environ.get("GPU_CHECK_OUT", str(work))) / "audit"
    if keep != out and out.is_dir():  # the audit's summary and report travel back with the figures
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "report.html", "config.json"):
            if (out / name).is_file():
                (keep / name).write_bytes((out / name).read_bytes())
    return [{"step": "audit", "figure": f"stealkit audit --victim {victim} --device {device}{' ' if extra else ''}"
                                        f"{' '.join(extra)}: wall s (exit code)",
             "value": f"{wall} s (exit {proc.returncode})", "verdict": verdict[:300],
             "goal": "<= 180 s on one H100", "met": proc.returncode in (0, 1) and wall <= 180}]


def papers_step(name: str) -> Callable[[str, bool, Path], list[dict[str, Any]]]:
    """One of the papers' settings: ``gpu_papers.sh NAME`` under this step's limit, resumable."""
    def run(device: str, tiny: bool, work: Path) -> list[dict[str, Any]]:
        out = Path(os.environ.get("GPU_CHECK_OUT", str(work))) / "papers"
        limit = int(os.environ.get("GPU_CHECK_LIMIT", LIMITS[name][1 if tiny else 0])) - 15
        env = {**os.environ, "LIMIT": str(max(limit, 10)), "OUT": str(out),
               "RUNS": os.environ.get("RUNS", str(ROOT / "runs" / "gpu-papers")), "PYTHON": PY}
        t0 = time.perf_counter()
        proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_papers.sh"), name, "--device", device,
                               *(["--tiny"] if tiny else [])], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False)
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        log = (out / "steps.log").read_text().splitlines() if (out / "steps.log").is_file() else []
        exits = [ln for ln in log if ln.startswith("exit ")]
        last = exits[-1] if exits else f"gpu_papers.sh exited {proc.returncode}"
        done = last.startswith("exit 0 ")
        summaries = {p.name: p.read_text()[:2000] for p in sorted(out.glob("*summary.json"))}
        return [{"step": name, "figure": f"{PAPERS[name]}{' (tiny)' if tiny else ''}",
                 "value": "finished" if done else f"not finished: {last.split(':')[0]} (resumable from "
                                                  "papers/papers-state.tgz)",
                 "seconds_in_step": round(time.perf_counter() - t0, 1), "log": last, "summaries": summaries,
                 "goal": "finished, beside the paper's figure in docs/results.md", "met": done}]
    return run


STEPS: dict[str, Callable[[str, bool, Path], list[dict[str, Any]]]] = {
    "tier": step_tier, "serve": step_serve, "ray": step_ray, "pgd": step_pgd, "certify": step_certify,
    "dfme": step_dfme, "audit": step_audit, **{name: papers_step(name) for name in PAPERS}}


def run_step(name: str, args: argparse.Namespace, log: Any, left: float | None = None) -> list[dict[str, Any]]:
    """One step in a child process under its limit (and what is left of ``--budget``); a crash or a timeout
    becomes a failed row."""
    limit = LIMITS[name][1 if args.tiny else 0]
    if left is not None:
        limit = int(min(limit, left))
    os.environ["GPU_CHECK_OUT"], os.environ["GPU_CHECK_LIMIT"] = str(args.out.resolve()), str(limit)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as work:
        cmd = [PY, __file__, "--child", name, "--device", args.device, "--work", work] + (["--tiny"] if args.tiny
                                                                                            else [])
        t0 = time.perf_counter()
        log.write(f"\n===== {name} (limit {limit} s)\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            # the whole group: a benchmark the step started must not run on into the next step's timing
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            for points in sorted(Path(work).glob("*points.jsonl")):  # what a stopped run measured before its limit
                log.write(f"--- {points.name} (written before the limit)\n{points.read_text()}")
            return [{"step": name, "figure": "step", "value": f"stopped at its {limit} s limit", "met": False,
                     "error": True}]
        seconds = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            return [{"step": name, "figure": "step", "value": f"failed (exit {proc.returncode}); see logs.txt",
                     "met": False, "error": True, "seconds": seconds}]
        rows = json.loads(stdout.strip().splitlines()[-1])
        return [r | {"seconds": seconds} for r in rows]


def markdown(line: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    head = (f"Device: {line.get('gpu') or line['device']}, driver {line.get('driver', 'n/a')}, CUDA "
            f"{line.get('cuda') or 'n/a'}, torch {line['torch']}, {line['cpus']} CPUs, commit {line['commit']}, "
            f"{line['date']}{' (tiny dry run)' if line.get('tiny') else ''}\n\n")
    table = ["| step | figure | value | goal | met | step s |", "|---|---|---|---|---|---|"]
    for r in rows:
        met = "" if "met" not in r else ("yes" if r["met"] else "**no**")
        value = r["value"] + (f" ({r['why']})" if r.get("why") else "")
        table.append(f"| {r['step']} | {r['figure']} | {value} | {r.get('goal', '')} | {met} | "
                     f"{r.get('seconds', '')} |")
    return head + "\n".join(table) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/gpu-check")))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="every step at a tiny size (a dry run on any device)")
    p.add_argument("--steps", default=None, help="comma list of steps to run, in order (to rerun a failed one)")
    p.add_argument("--plan", default="check", choices=sorted(PLANS),
                   help="the steps' order when --steps is not given: check (issue 41) or 53 (issue 53)")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole run (steps get what is left)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(STEPS[args.child](args.device, args.tiny, args.work)))
        return 0
    steps = [s for s in (args.steps or PLANS[args.plan]).split(",") if s]
    if unknown := [s for s in steps if s not in STEPS]:
        p.error(f"unknown step(s) {unknown}; expected some of {list(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    line = device_line(args.device) | {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                       "tiny": args.tiny}
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    with open(args.out / "logs.txt", "a", encoding="utf-8") as log:
        for name in steps:
            left = None if args.budget is None else args.budget - (time.monotonic() - start)
            if left is not None and left < 30:
                got = [{"step": name, "figure": PAPERS.get(name, "step"), "value": "not run: the budget was spent",
                        "met": False}]
            else:
                got = run_step(name, args, log, left)
            rows += got
            with open(args.out / "gpu_check.jsonl", "a", encoding="utf-8") as fh:
                for r in got:
                    fh.write(json.dumps(r | {"device_line": line}) + "\n")
            print(f"{name}: " + "; ".join(f"{r['figure']}: {r['value']}" for r in got), file=sys.stderr, flush=True)
    md = markdown(line, rows)
    (args.out / "gpu_check.md").write_text(md)
    (args.out / "gpu_check.json").write_text(json.dumps({"device": line, "figures": rows}, indent=1) + "\n")
    print(md)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
