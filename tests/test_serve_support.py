"""Shared helpers of the serve/http tests: a small digits victim, keys files, a live ``stealkit serve``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def make_victim(out: Path) -> Path:
    """A digits MLP (3 epochs; about 0.9 test accuracy) saved to ``out``; reused if already there."""
    if (out / "model.json").exists():
        return out
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    train_victim("digits", "mlp2", TrainConfig(epochs=3, batch_size=64, seed=0), out=out)
    return out


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def write_keys(path: Path, keys: list[dict[str, object]], model: dict[str, object] | None = None) -> Path:
    lines = []
    if model:
        lines.append("[model]")
        lines += [f"{k} = {toml_value(v)}" for k, v in model.items()]
    for k in keys:
        lines.append("[[key]]")
        lines += [f"{name} = {toml_value(v)}" for name, v in k.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, keys: Path, db: Path, *, workers: int = 1, log: Path | None = None,
                 timeout: float = 180.0, port: int | None = None, extra: tuple[str, ...] = ()
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``stealkit serve`` on ``port`` (default: a free loopback port), with ``extra`` arguments, and wait
    until /healthz answers."""
    port = port or free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "stealkit.cli", "-q", "serve", "--model", str(model), "--keys", str(keys),
         "--db", str(db), "--port", str(port), "--workers", str(workers), "--threads", "1", *extra],
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stealkit serve exited with {proc.returncode} before answering /healthz")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=2).status_code == 200 and workers_up(url, workers):
                return proc, url
        time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"stealkit serve did not answer /healthz within {timeout} s")


def workers_up(url: str, workers: int) -> bool:
    """With several workers, wait until /healthz has been answered by that many distinct processes."""
    if workers == 1:
        return True
    pids = set()
    for _ in range(20 * workers):
        with contextlib.suppress(httpx.HTTPError):
            pids.add(httpx.get(url + "/healthz", timeout=2).json()["pid"])
        if len(pids) >= workers:
            return True
    return False


def stop_server(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the server's whole process group (uvicorn's workers too) and wait for it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@contextlib.contextmanager
def live_server(model: Path, keys: Path, db: Path, **kw: object) -> Iterator[str]:
    proc, url = start_server(model, keys, db, **kw)  # type: ignore[arg-type]
    try:
        yield url
    finally:
        stop_server(proc)
