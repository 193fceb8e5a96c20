"""Latency under a noisy neighbour: one key's predict latency while another key floods SmoothGrad explanations.

Starts ``stealkit serve`` (one worker, one torch thread) on a digits MLP, measures key B's predict latency
alone, then again while ``--flood`` client threads of key A keep SmoothGrad requests queued. Reports p50/p99
of both. ``--server-src DIR`` runs the server from another checkout's ``src`` (e.g. main's, for a before/after
comparison; the keys file uses only fields every version understands).

    PYTHONPATH=src python benchmarks/noisy_neighbour.py --flood 60 --probes 100 --out runs/noisy.json

Measured 2026-11-23 on this project's 2 shared CPU cores (defaults above: 1 worker, 1 torch thread, 60 clients
of SmoothGrad batch 8 x 32 samples, 100 probes 20 ms apart); quiet key's predict latency p50 / p99:

==========================================  ===============  ===================
server                                      alone            under the flood
==========================================  ===============  ===================
before (a1b2901, ``--server-src`` of it)    4.9 / 12.6 ms    140.8 / 241.4 ms
after (branch serve)                        6.7 / 17.0 ms    19.5 / 61.1 ms
==========================================  ===============  ===================
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
QUIET = "quiet-Zx81QpLw6RtV3mNb7Yc4"
NOISY = "noisy-Qw3eR5tY7uI9oP1aS2dF6"


def start(model: Path, tmp: Path, server_src: Path, port: int) -> subprocess.Popen[bytes]:
    keys = tmp / "keys.toml"
    keys.write_text(f'[[key]]\nkey = "{QUIET}"\nname = "quiet"\nmode = "probs"\n\n'
                    f'[[key]]\nkey = "{NOISY}"\nname = "noisy"\nmode = "probs"\nexplain = true\n')
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(server_src)}
    return subprocess.Popen([sys.executable, "-m", "stealkit.cli", "-q", "serve", "--model", str(model), "--keys",
                             str(keys), "--db", str(tmp / "db.sqlite"), "--port", str(port), "--threads", "1"],
                            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def percentiles(lat: list[float]) -> dict[str, float]:
    a = np.array(lat) * 1000
    return {"n": len(lat), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


def probe(url: str, n: int, gap: float) -> list[float]:
    """Key B: ``n`` sequential one-image predictions, ``gap`` seconds apart; latency of each."""
    x = {"inputs": np.random.default_rng(0).random((1, 1, 8, 8)).tolist()}
    lat = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {QUIET}"}, timeout=120) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.post("/v1/predict", json=x)
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            time.sleep(gap)
    return lat


def flood(url: str, stop: threading.Event, batch: int, samples: int, sent: list[int]) -> None:
    """Key A: SmoothGrad requests back to back until ``stop``."""
    x = {"inputs": np.random.default_rng(1).random((batch, 1, 8, 8)).tolist(), "method": "smoothgrad",
         "n_samples": samples, "sigma": 0.1}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {NOISY}"}, timeout=300) as c:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                r = c.post("/v1/explain", json=x)
                sent.append(r.status_code)
                if r.status_code in (429, 503):  # what a well-behaved client (HttpOracle) does
                    time.sleep(float(r.headers.get("Retry-After", "1")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=60, help="concurrent SmoothGrad clients of the noisy key")
    ap.add_argument("--batch", type=int, default=8, help="images per SmoothGrad request")
    ap.add_argument("--samples", type=int, default=32, help="SmoothGrad n_samples")
    ap.add_argument("--probes", type=int, default=100, help="predict calls of the quiet key per phase")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between the quiet key's calls")
    ap.add_argument("--server-src", type=Path, default=ROOT / "src", help="the src/ directory the server runs from")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = tmp / "victim"
        train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, seed=0), out=model)
        proc = start(model, tmp, args.server_src.resolve(), args.port)
        url = f"http://127.0.0.1:{args.port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.3)
            alone = probe(url, args.probes, args.gap)
            stop, sent = threading.Event(), []
            threads = [threading.Thread(target=flood, args=(url, stop, args.batch, args.samples, sent), daemon=True)
                       for _ in range(args.flood)]
            for t in threads:
                t.start()
            time.sleep(2.0)  # let the flood fill the queue
            noisy = probe(url, args.probes, args.gap)
            stop.set()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    result = {"settings": {k: str(v) for k, v in vars(args).items()}, "alone": percentiles(alone),
              "under_flood": percentiles(noisy),
              "flood_statuses": {str(k): sent.count(k) for k in sorted(set(sent))}}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
