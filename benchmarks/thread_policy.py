"""Thread policy: wall time of a stealkit command at several intra-op thread counts, alone and beside a
CPU-bound neighbour. Prints JSON.

Each measurement runs the command in a fresh process (``stealkit --threads N ...``), so import and start-up
are included; thread counts are interleaved within each repeat so drifting background load hits them alike.
The neighbour is one busy-looping process per ``--neighbours``. The load average before each run is recorded.

    python benchmarks/thread_policy.py --threads 1,2,0 --repeats 3 --neighbours 0,1
    python benchmarks/thread_policy.py --command "demo --budgets 20,50,100,200,400" --repeats 2

``0`` threads is torch's own default (one per core).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _busy(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def measure(command: list[str], threads: int, out: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "STEALKIT_THREADS")}
    argv = [sys.executable, "-m", "stealkit", "-q", "--threads", str(threads), *command, "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--command", default="demo", help="stealkit command and options, without --out")
    ap.add_argument("--threads", default="1,2,0", help="thread counts to compare (0 = torch's default)")
    ap.add_argument("--neighbours", default="0,1", help="CPU-bound neighbour processes beside each run")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for neighbours in (int(n) for n in args.neighbours.split(",")):
            stop = multiprocessing.Event()
            procs = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True) for _ in range(neighbours)]
            for p in procs:
                p.start()
            times: dict[int, list[float]] = {t: [] for t in threads}
            loads: list[float] = []
            try:
                for r in range(args.repeats):
                    for t in threads if r % 2 == 0 else reversed(threads):  # interleaved, alternating order
                        loads.append(os.getloadavg()[0])
                        times[t].append(measure(args.command.split(), t, Path(tmp) / f"n{neighbours}-t{t}-r{r}"))
            finally:
                stop.set()
                for p in procs:
                    p.join(timeout=5)
            for t in threads:
                rows.append({"neighbours": neighbours, "threads": t or "torch default", "runs": len(times[t]),
                             "median_s": round(statistics.median(times[t]), 2),
                             "min_s": round(min(times[t]), 2), "max_s": round(max(times[t]), 2),
                             "load_average_1min_before_this_group": [round(x, 2) for x in loads]})
    print(json.dumps({"command": args.command, "cpus": os.cpu_count(), "repeats": args.repeats, "rows": rows},
                     indent=2))


if __name__ == "__main__":
    main()
