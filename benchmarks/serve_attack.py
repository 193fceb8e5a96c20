"""Attack a running ``stealkit serve`` and measure what honest tenants see (issue 40), printing JSON.

Four phases against one server (1 worker, 1 torch thread, a digits MLP), each with an honest tenant sending
one-image predictions every ``--gap`` seconds from 127.0.0.1 (latency p50/p95/p99, statuses, failures):

- ``baseline``: honest traffic alone;
- ``half_open``: ``--half-open`` connections from 127.0.0.2 that send part of their headers and never finish
  (every ``--reopen`` seconds each sends another header line and the closed ones are reopened, as slowloris
  does);
- ``slow_bodies``: two hostile keys (from 127.0.0.3) each hold ``--slow-per-key`` requests with ``Content-Length: 6000000``,
  trickling one byte every 2 s (the honest key's 503s are counted, and how the hostile requests ended);
- ``junk``: ``--junk`` concurrent 6.2 MB JSON bodies (another key, from 127.0.0.4) of the wrong shape (answered 400, free), in 3 rounds;
- ``json_flood``: another key (from 127.0.0.5) floods valid JSON batches (``--flood`` clients) while the honest key probes;
- ``junk_shapes`` (issue 51): ``--junk-shapes`` concurrent bodies of each junk shape of the issue (tiny arrays in
  objects to /v1 and /v2, nested objects, objects where v2 data goes; ``--junk-mb`` each) from two keys;
- ``early_trickle`` (issue 51): from ``--early`` addresses, 4 connections each whose ``GET /healthz`` declares a
  body the server answers before reading, then one body byte a second (no key needed);
- ``cap_fill`` (issue 51): half-open connections from ``--cap-addresses`` addresses, ``--cap-per-address`` each
  (below the per-address cap, above the total cap together), reopened as they are closed;
- ``slow_bodies4`` (issue 51): four keys trickle 16 bodies each (their whole in-flight share), the honest key is
  a fifth.

IPv6 /64 grouping is not attacked here (the loopback has one IPv6 address); tests/test_serve_caps.py checks it.

Per phase: the server's CPU seconds (all its processes), peak and end RSS, and log bytes written. The server's
open-file limit is set to ``--server-nofile`` (soft = hard) so a few thousand connections reach it on a small
machine. ``--server-src DIR`` runs the server from another checkout's ``src`` (before/after).

    PYTHONPATH=src python benchmarks/serve_attack.py --server-src /work/main/src --out runs/attack-before.json
    PYTHONPATH=src python benchmarks/serve_attack.py --out runs/attack-after.json

Measured 2026-11-26 on this project's 2 CPU cores shared with other jobs (defaults: 20 s phases, 40 s for slow
bodies, server open-file limit 1024, 2,000 half-open connections reopened every second, 2 x 40 trickled bodies,
3 rounds of 48 junk bodies, 4 flood clients of 256-image JSON batches). Honest tenant p50 / p95 / p99 in ms,
its failures, server CPU seconds in the phase, RSS peak / after in MB, log bytes:

=============  ==========  ====================================  =========================================
phase          server      honest p50/p95/p99 (failures)         CPU s, RSS MB, log
=============  ==========  ====================================  =========================================
baseline       before      6.9 / 12.0 / 15.0 (0 of 347)          1.4 s, 256 / 256, 0 B
baseline       after       7.3 / 12.2 / 17.9 (0 of 343)          1.6 s, 257 / 257, 0 B
half-open      before      10057 / 10063 / 10064 (2 of 2)        18.9 s, 269 / 269, 85.7 MB (EMFILE loop)
half-open      after       7.7 / 100.6 / 505 (0 of 262)          6.3 s, 266 / 266, 419 B (30,004 refused)
slow bodies    before      3.5 / 8.2 / 10.0 (732 of 732: 503)    1.8 s, 269 / 269, 0.3 MB
slow bodies    after       6.0 / 10.6 / 13.8 (0 of 596)          2.3 s, 266 / 266, 0 B (hostile: 32 x 408)
junk bodies    before      305 / 854 / 910 (0 of 47)             17.3 s, 1150 / 1045, 0 B
junk bodies    after       21.3 / 273 / 379 (0 of 182)           18.8 s, 453 / 418, 0 B (88 x 429)
JSON flood     before      49.1 / 190 / 245 (0 of 172)           19.3 s, 1045 / 402, 0 B
JSON flood     after       19.6 / 37.4 / 56.5 (0 of 276)         26.7 s, 420 / 304, 0 B
=============  ==========  ====================================  =========================================

With ``--half-open 10000 --server-nofile 20000 --reopen 15`` (after): honest 5.6 / 10.0 / 221 ms (0 of 512
failed), server CPU 4.5 s against 1.65 s for the baseline phase, 0 log bytes, 20,000 connections opened.
With ``--workers 2 --phases baseline,json_flood``: the quiet tenant's p50 / p95 / p99 under the flood was
14.9 / 51.2 / 217 ms before and 13.2 / 31.6 / 39.9 ms after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
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

ROOT = Path(__file__).resolve().parents[1]
HONEST = "honest-Zx81QpLw6RtV3mNb7Yc4"
HOSTILE = ("hostile1-Qw3eR5tY7uI9oP1aS2dF6", "hostile2-Lk8jH6gF4dS2aP0oI9uY7", "hostile3-Pq2wE4rT6yU8iO0pA1sD3",
           "hostile4-Zx9cV7bN5mL3kJ1hG2fD4")
NOISY = "noisy-Mn7bV5cX3zL1kJ9hG8fD4"
JUNK_BYTES = 6_200_000


def start(model: Path, tmp: Path, server_src: Path, port: int, nofile: int, log: Path,
          workers: int = 1) -> subprocess.Popen[bytes]:
    keys = tmp / "keys.toml"
    keys.write_text("".join(f'[[key]]\nkey = "{k}"\nname = "{n}"\nmode = "probs"\n\n' for k, n in (
        (HONEST, "honest"), *((k, f"hostile{i + 1}") for i, k in enumerate(HOSTILE)), (NOISY, "noisy"))))
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(server_src)}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return subprocess.Popen([sys.executable, "-m", "stealkit.cli", "-q", "serve", "--model", str(model), "--keys",
                             str(keys), "--db", str(tmp / "db.sqlite"), "--port", str(port), "--threads", "1",
                             "--workers", str(workers), "--protocol", "v2", "--model-name", "digits"],
                            cwd=tmp, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=limit)  # noqa: PLW1509 - sets the fd limit only


def group_pids(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if os.getpgid(int(d.name)) == pgid:
                    pids.append(int(d.name))
    return pids


def cpu_seconds(pgid: int) -> float:
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def rss_mb(pgid: int) -> float:
    total = 0
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


class Sampler(threading.Thread):
    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.peak, self.stop = pgid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, rss_mb(self.pgid))


def honest(url: str, stop: threading.Event, gap: float, out: dict) -> None:
    x = {"inputs": np.random.default_rng(0).random((1, 1, 8, 8)).tolist()}
    lat, statuses = [], {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {HONEST}"}, timeout=10) as c:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                code = str(c.post("/v1/predict", json=x).status_code)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            lat.append(time.perf_counter() - t)
            statuses[code] = statuses.get(code, 0) + 1
            time.sleep(gap)
    a = np.array(lat) * 1000
    out.update({"n": len(lat), "p50_ms": round(float(np.percentile(a, 50)), 1),
                "p95_ms": round(float(np.percentile(a, 95)), 1), "p99_ms": round(float(np.percentile(a, 99)), 1),
                "statuses": statuses})


def _reopen(socks: list[socket.socket | None], i: int, source: str, port: int) -> bool:
    """Keep ``socks[i]`` while the server holds it open; otherwise close it and open a fresh non-blocking connection
    from ``source`` to the server (``None`` where that fails). True when a connection was opened."""
    s = socks[i]
    if s is not None:
        try:
            alive = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            alive = True
        except OSError:
            alive = False
        if alive:
            return False
        s.close()
    try:
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks[i] = s
        return True
    except OSError:
        socks[i] = None
        return False


def half_open(port: int, n: int, seconds: float, reopen: float, report: mp.Queue) -> None:  # type: ignore[type-arg]
    """Hold ``n`` connections from 127.0.0.2 with unfinished headers; every ``reopen`` seconds, send each a header
    line and reopen the closed ones (slowloris)."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    socks: list[socket.socket | None] = [None] * n
    opened = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(n):
            opened += _reopen(socks, i, "127.0.0.2", port)
        time.sleep(min(0.3, reopen / 2))
        for s in socks:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.send(b"GET /healthz HTTP/1.1\r\nX-a: b\r\n")
        time.sleep(max(0.0, reopen - 0.3))
    report.put({"connections_opened": opened, "held_at_end": sum(s is not None for s in socks)})
    for s in socks:
        if s is not None:
            s.close()


def slow_bodies(port: int, per_key: int, seconds: float, out: dict, keys: tuple[str, ...] = HOSTILE[:2]) -> None:
    socks = []
    for key in keys:
        for _ in range(per_key):
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.3", 0))
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: "
                      b"Bearer " + key.encode() + b"\r\nContent-Length: 6000000\r\n\r\n")
            socks.append(s)
    end, answers = time.monotonic() + seconds, {}
    while time.monotonic() < end and socks:
        for s in list(socks):
            try:
                s.setblocking(False)
                data = s.recv(4096)
                code = data[9:12].decode() if data.startswith(b"HTTP/1.1") else "closed"
                answers[code] = answers.get(code, 0) + 1
                socks.remove(s)
                s.close()
                continue
            except BlockingIOError:
                pass
            except OSError:
                answers["reset"] = answers.get("reset", 0) + 1
                socks.remove(s)
                continue
            with contextlib.suppress(OSError):
                s.send(b" ")
        time.sleep(2.0)
    answers["still_open"] = len(socks)
    out.update(answers)
    for s in socks:
        s.close()


def junk(url: str, n: int, rounds: int, out: dict) -> None:
    body = b'{"inputs": [' + b"0.1234567890123, " * ((JUNK_BYTES - 20) // 17) + b"0.5]}"
    statuses: dict[str, int] = {}

    def one() -> None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4"), timeout=120) as c:
                code = str(c.post(url + "/v1/predict", content=body, headers={
                    "Authorization": f"Bearer {NOISY}", "Content-Type": "application/json"}).status_code)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        statuses[code] = statuses.get(code, 0) + 1

    for _ in range(rounds):
        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    out.update({"statuses": statuses, "body_mb": round(len(body) / 1e6, 2), "in_flight_mb": round(n * len(body) / 1e6)})


def junk_shapes(url: str, n: int, size: int, out: dict) -> None:
    """Issue 51's junk shapes, ``n`` of each at once from two keys, to /v1 and /v2 (each answered 400, free)."""
    obj = b'{"a":[{}' + b",[1]" * 4000 + b"]}"
    shapes = {
        "v1_tiny_arrays_in_objects": ("/v1/predict", b'{"inputs":[' + b",".join([obj] * (size // len(obj))) + b"]}"),
        "v2_tiny_arrays_in_objects": ("/v2/models/digits/infer",
                                      b'{"inputs":[' + b",".join([obj] * (size // len(obj))) + b"]}"),
        "v2_nested_objects": ("/v2/models/digits/infer", b'{"inputs":[{"name":"input","parameters":{' + b",".join(
            b'"k%d":{"a":{"b":1}}' % i for i in range(size // 20)) + b"}}]}"),
        "v2_objects_as_data": ("/v2/models/digits/infer", b'{"inputs":[{"name":"input","shape":[1,1,8,8],'
                               b'"datatype":"FP32","data":[' + b",".join([b"{}"] * (size // 3)) + b"]}]}"),
    }
    statuses: dict[str, dict[str, int]] = {}

    def one(name: str, path: str, body: bytes, key: str) -> None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.6"), timeout=300) as c:
                code = str(c.post(url + path, content=body, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"}).status_code)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        got = statuses.setdefault(name, {})
        got[code] = got.get(code, 0) + 1

    for name, (path, body) in shapes.items():
        threads = [threading.Thread(target=one, args=(name, path, body, HOSTILE[i % 2])) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    out.update({"statuses": statuses, "body_mb": round(size / 1e6, 2)})


def early_trickle(port: int, addresses: int, per_address: int, seconds: float, out: dict) -> None:
    """From ``addresses`` loopback addresses, connections whose request (``GET /healthz`` declaring a body) is
    answered before its body is read, then one body byte each second: the server must cut them."""
    socks = []
    for a in range(addresses):
        for _ in range(per_address):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.2.{a + 1}", 0))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
                s.setblocking(False)
                socks.append(s)
    end, cut = time.monotonic() + seconds, 0
    while time.monotonic() < end and socks:
        for s in list(socks):
            try:
                s.send(b" ")
                with contextlib.suppress(BlockingIOError):
                    while True:
                        if s.recv(65536) == b"":
                            raise ConnectionResetError
            except OSError:
                cut += 1
                socks.remove(s)
                s.close()
        time.sleep(1.0)
    out.update({"connections": cut + len(socks), "cut_by_server": cut, "still_open": len(socks)})
    for s in socks:
        s.close()


def cap_fill(port: int, addresses: int, per_address: int, seconds: float, out: dict) -> None:
    """Half-open connections from ``addresses`` loopback addresses (``per_address`` each, below the per-address
    cap), reopened as they are closed: together more than the total cap."""
    socks: list[socket.socket | None] = [None] * (addresses * per_address)
    opened, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(len(socks)):
            opened += _reopen(socks, i, f"127.0.3.{i // per_address + 1}", port)
        time.sleep(0.3)
        for s in socks:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.send(b"GET /healthz HTTP/1.1\r\nX-a: b\r\n")
        time.sleep(0.7)
    out.update({"connections_opened": opened, "held_at_end": sum(s is not None for s in socks)})
    for s in socks:
        if s is not None:
            s.close()


def flood(url: str, stop: threading.Event, batch: int, sent: dict) -> None:
    body = json.dumps({"inputs": np.random.default_rng(1).random((batch, 1, 8, 8)).tolist()}).encode()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {NOISY}", "Content-Type": "application/json"},
                      timeout=60, transport=httpx.HTTPTransport(local_address="127.0.0.5")) as c:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                r = c.post("/v1/predict", content=body)
                sent[str(r.status_code)] = sent.get(str(r.status_code), 0) + 1
                if r.status_code in (429, 503):
                    time.sleep(float(r.headers.get("Retry-After", "1")))


def phase(name: str, url: str, pgid: int, log: Path, seconds: float, gap: float, attack=None) -> dict:  # noqa: ANN001
    stop, probe = threading.Event(), {}
    cpu0, log0, sampler = cpu_seconds(pgid), log.stat().st_size, Sampler(pgid)
    sampler.start()
    prober = threading.Thread(target=honest, args=(url, stop, gap, probe))
    prober.start()
    extra: dict = {}
    if attack is not None:
        extra = attack(seconds) or {}
    else:
        time.sleep(seconds)
    stop.set()
    prober.join()
    time.sleep(2.0)
    sampler.stop.set()
    sampler.join()
    result = {"honest": probe, "server_cpu_s": round(cpu_seconds(pgid) - cpu0, 2),
              "rss_peak_mb": round(sampler.peak), "rss_after_mb": round(rss_mb(pgid)),
              "log_bytes": log.stat().st_size - log0, **extra}
    print(name, json.dumps(result), file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half-open", type=int, default=2000, help="half-open connections of the slowloris phase")
    ap.add_argument("--reopen", type=float, default=1.0,
                    help="seconds between the slowloris rounds (a header line each, closed connections reopened)")
    ap.add_argument("--slow-per-key", type=int, default=40, help="trickled requests per hostile key")
    ap.add_argument("--junk", type=int, default=48, help="concurrent junk bodies")
    ap.add_argument("--flood", type=int, default=4, help="clients flooding JSON batches")
    ap.add_argument("--flood-batch", type=int, default=256, help="images per flood request")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--slow-seconds", type=float, default=40.0, help="length of the slow-bodies phase")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between the honest tenant's requests")
    ap.add_argument("--workers", type=int, default=1, help="server worker processes")
    ap.add_argument("--server-nofile", type=int, default=1024, help="the server's open-file limit (soft = hard)")
    ap.add_argument("--junk-shapes", type=int, default=4, help="concurrent bodies of each issue-51 junk shape")
    ap.add_argument("--junk-mb", type=float, default=6.3, help="size of each junk-shape body (MB)")
    ap.add_argument("--early", type=int, default=70, help="addresses of the early-answer trickle (4 connections each)")
    ap.add_argument("--cap-addresses", type=int, default=100, help="addresses filling the connection cap")
    ap.add_argument("--cap-per-address", type=int, default=8, help="half-open connections per address")
    ap.add_argument("--phases", default="baseline,half_open,slow_bodies,junk,json_flood,junk_shapes,early_trickle,"
                    "cap_fill,slow_bodies4")
    ap.add_argument("--server-src", type=Path, default=ROOT / "src", help="the src/ directory the server runs from")
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model, log = tmp / "victim", tmp / "server.log"
        log.touch()
        train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, seed=0), out=model)
        proc = start(model, tmp, args.server_src.resolve(), args.port, args.server_nofile, log, args.workers)
        url = f"http://127.0.0.1:{args.port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        time.sleep(5.0 * (args.workers > 1))  # the other workers finish loading
                        break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.3)
            pgid = proc.pid
            phases = args.phases.split(",")
            if "baseline" in phases:
                results["baseline"] = phase("baseline", url, pgid, log, args.seconds, args.gap)
            if "half_open" in phases:
                def attack_half_open(seconds: float) -> dict:
                    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
                    p = mp.Process(target=half_open, args=(args.port, args.half_open, seconds, args.reopen, q))
                    p.start()
                    report = q.get(timeout=seconds + 120)
                    p.join()
                    return report
                results["half_open"] = phase("half_open", url, pgid, log, args.seconds, args.gap, attack_half_open)
            if "slow_bodies" in phases:
                def attack_slow(seconds: float) -> dict:
                    out: dict = {}
                    slow_bodies(args.port, args.slow_per_key, seconds, out)
                    return {"hostile_requests": out}
                results["slow_bodies"] = phase("slow_bodies", url, pgid, log, args.slow_seconds, args.gap, attack_slow)
            if "junk" in phases:
                def attack_junk(seconds: float) -> dict:
                    out: dict = {}
                    junk(url, args.junk, 3, out)
                    return {"junk": out}
                results["junk"] = phase("junk", url, pgid, log, args.seconds, args.gap, attack_junk)
            if "junk_shapes" in phases:
                def attack_shapes(seconds: float) -> dict:
                    out: dict = {}
                    junk_shapes(url, args.junk_shapes, int(args.junk_mb * 1e6), out)
                    return {"junk_shapes": out}
                results["junk_shapes"] = phase("junk_shapes", url, pgid, log, args.seconds, args.gap, attack_shapes)
            if "early_trickle" in phases:
                def attack_early(seconds: float) -> dict:
                    out: dict = {}
                    early_trickle(args.port, args.early, 4, seconds, out)
                    return {"early_trickle": out}
                results["early_trickle"] = phase("early_trickle", url, pgid, log, max(args.seconds, 25.0), args.gap,
                                                 attack_early)  # past the 10 s deadline of an early answer
            if "cap_fill" in phases:
                def attack_cap(seconds: float) -> dict:
                    out: dict = {}
                    cap_fill(args.port, args.cap_addresses, args.cap_per_address, seconds, out)
                    return {"cap_fill": out}
                results["cap_fill"] = phase("cap_fill", url, pgid, log, args.seconds, args.gap, attack_cap)
            if "slow_bodies4" in phases:
                def attack_slow4(seconds: float) -> dict:
                    out: dict = {}
                    slow_bodies(args.port, 16, seconds, out, keys=HOSTILE)
                    return {"hostile_requests": out}
                results["slow_bodies4"] = phase("slow_bodies4", url, pgid, log, args.seconds, args.gap, attack_slow4)
            if "json_flood" in phases:
                def attack_flood(seconds: float) -> dict:
                    stop, sent = threading.Event(), {}
                    threads = [threading.Thread(target=flood, args=(url, stop, args.flood_batch, sent), daemon=True)
                               for _ in range(args.flood)]
                    for t in threads:
                        t.start()
                    time.sleep(seconds)
                    stop.set()
                    return {"flood_statuses": sent}
                results["json_flood"] = phase("json_flood", url, pgid, log, args.seconds, args.gap, attack_flood)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    print(json.dumps(results, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
