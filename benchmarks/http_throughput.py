"""Throughput and latency of an oracle over HTTP (``stealkit serve`` + HttpOracle) against LocalOracle.

For batches of 1, 32 and 256 images: images/s and p50/p99 latency per ``query`` call, in process
(``LocalOracle``) and over HTTP with 1 and 2 uvicorn workers, measured in the same run on the same model.
HTTP clients are ``HttpOracle`` s (npy bodies, validation, ledger) in ``--clients`` threads per worker.
Prints one JSON document to stdout. ``--jsonl PATH`` also appends one raw row per configuration (transport,
workers, batch) and writes ``PATH``'s ``.meta.json`` at the end (``benchmarks/rowmeta.py``).

    .venv/bin/python benchmarks/http_throughput.py                 # fmnist-conv2, the anchors' victim
    .venv/bin/python benchmarks/http_throughput.py --quick         # digits-conv2, fewer requests
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
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from stealkit.oracle import LocalOracle
from stealkit.oracle.http import HttpOracle
from stealkit.victims import standard_victim

ROOT = Path(__file__).resolve().parents[1]
BENCH_KEY = "bench-Zx81QpLw6RtV3mNb7Yc4"  # a key of enough entropy (the server refuses guessable ones)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(model_dir: Path, workers: int, threads: int, tmp: Path):
    keys = tmp / "keys.toml"
    keys.write_text(f"[[key]]\nkey = \"{BENCH_KEY}\"\nmode = \"probs\"\n")
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "stealkit.cli", "-q", "serve", "--model", str(model_dir), "--keys",
                             str(keys), "--db", str(tmp / f"db-{workers}.sqlite"), "--port", str(port), "--workers",
                             str(workers), "--threads", str(threads)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        seen: set[int] = set()
        while len(seen) < workers:  # every worker has started (each answers /healthz with its pid)
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("stealkit serve did not start")
            with contextlib.suppress(httpx.HTTPError):
                seen.add(httpx.get(url + "/healthz", timeout=2).json()["pid"])
            time.sleep(0.05 if seen else 0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def run_clients(make_query, x: torch.Tensor, batch: int, requests: int, clients: int) -> dict[str, float]:
    """``clients`` threads each make ``requests // clients`` calls of ``batch`` images; latency per call."""
    lat: list[float] = []
    lock = threading.Lock()
    per = max(1, requests // clients)

    def work(i: int) -> None:
        query = make_query()
        query(x[:batch])  # warm-up (connection, first forward)
        mine = []
        for j in range(per):
            xb = x[(j * batch) % (len(x) - batch + 1):][:batch]
            t = time.perf_counter()
            query(xb)
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    arr = np.asarray(lat) * 1000
    return {"images_per_s": round(len(lat) * batch / wall, 1), "p50_ms": round(float(np.percentile(arr, 50)), 3),
            "p99_ms": round(float(np.percentile(arr, 99)), 3), "calls": len(lat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victim", default="fmnist-conv2", help="standard victim name")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--images", type=int, default=8192, help="images per configuration (at least 100 calls)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in process / per server, split by workers")
    ap.add_argument("--clients", type=int, default=2, help="client threads per server worker")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--quick", action="store_true", help="digits-conv2 and 1/8 of the images (smoke run)")
    ap.add_argument("--jsonl", default=None, metavar="PATH", help="also append one row per configuration here")
    args = ap.parse_args()
    if args.quick:
        args.victim, args.images = "digits-conv2", args.images // 8
    torch.set_num_threads(args.threads)
    trained = standard_victim(args.victim)
    shape = tuple(trained.spec.input_shape)
    batches = [int(b) for b in args.batches.split(",")]
    x = torch.rand(max(batches) * 4, *shape, generator=torch.Generator().manual_seed(0))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds="0 (the uniform random images)", victim=args.victim, threads=args.threads,
                         images=args.images, data={"queried images": x})
    rows = []
    for b in batches:
        calls = max(100, args.images // b) if b > 1 else max(200, args.images // 16)
        local = LocalOracle(trained.model, shape, mode="probs")
        rows.append({"transport": "local", "workers": 0, "clients": 1, "batch": b,
                     **run_clients(lambda local=local: local.query, x, b, calls, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for w in (int(v) for v in args.workers.split(",")):
            with server(Path(trained.path), w, max(1, args.threads // w), Path(tmp)) as url:
                for b in batches:
                    calls = max(100, args.images // b) if b > 1 else max(200, args.images // 16)
                    clients = args.clients * w
                    res = run_clients(lambda url=url: HttpOracle(url, key=BENCH_KEY, batch_size=4096).query,
                                      x, b, calls, clients)
                    rows.append({"transport": "http", "workers": w, "clients": clients, "batch": b, **res})
                    print(json.dumps(rows[-1]), file=sys.stderr)
    local_ips = {r["batch"]: r["images_per_s"] for r in rows if r["transport"] == "local"}
    for r in rows:
        r["fraction_of_local"] = round(r["images_per_s"] / local_ips[r["batch"]], 3)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(r) + "\n")
    rowmeta.finish(meta)
    print(json.dumps({
        "benchmark": "http_throughput", "victim": args.victim, "input_shape": list(shape), "mode": "probs",
        "threads": args.threads, "images": args.images, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
