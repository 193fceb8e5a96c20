"""``stealkit serve``: run a saved model as a pay-per-query prediction and explanation API."""

from __future__ import annotations

import json
import os

import click

from stealkit.commands.common import device_option, model_option
from stealkit.errors import InputError


@click.command("serve")
@model_option(help_text="Model: a model directory, an extraction run directory (its student/), an ONNX (.onnx) or "
              "TorchScript (.pt) file, or standard:NAME. An ONNX model answers predictions only (no gradients): "
              "keys with explain = true are refused at start-up.")
@click.option("--keys", "keys_path", required=True, type=click.Path(), help="TOML keys file ([[key]] tables: key, "
              "name, mode, budget, explain, rate, image_rate, defences, prada; [model] max_batch, max_body_mb, "
              "metrics_key). Keys must be long random strings.")
@click.option("--db", required=True, type=click.Path(), help="SQLite file for budgets and the query log "
              "(created if missing; counters survive restarts).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True, help="Worker processes.")
@click.option("--threads", type=int, default=None, help="torch threads per worker (default: torch's choice).")
@device_option
@click.option("--max-inflight", type=int, default=64, show_default=True,
              help="Concurrent queries per worker (body reads included) before answering 503.")
@click.option("--compute-slots", type=int, default=4, show_default=True,
              help="Model computations per worker at once, shared fairly between keys (one key holds at most "
                   "all but one).")
@click.option("--protocol", type=click.Choice(["v1", "v2"]), default="v1", show_default=True,
              help="v2: also speak the Open Inference Protocol (KServe/Triton/MLServer REST: /v2/health/*, "
                   "/v2/models/NAME[/ready|/infer], explanations as the model NAME-explain) over the same keys, "
                   "budgets and log.")
@click.option("--model-name", default=None,
              help="The model's name under /v2/models/ (default: the model directory's or file's stem).")
@click.option("--header-timeout", type=float, default=10.0, show_default=True,
              help="Seconds a connection may take to send a request's headers (from opening, or from its previous "
                   "answer) before it is closed.")
@click.option("--body-timeout", type=float, default=30.0, show_default=True,
              help="Seconds a request's body may take to arrive before it is answered 408 and its connection closed.")
@click.option("--max-connections", type=int, default=4096, show_default=True,
              help="Open connections per worker (kept below the open-file limit); more are closed at once.")
@click.option("--max-connections-per-address", type=int, default=64, show_default=True,
              help="Open connections per worker from one client address (trusted proxies exempt).")
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDR",
              help="An address or network (repeatable) whose X-Forwarded-For header names the client; no other "
                   "peer's is believed (default: none).")
def serve_cmd(model_dir: str, keys_path: str, db: str, host: str, port: int, workers: int, threads: int | None,
              device: str, max_inflight: int, compute_slots: int, protocol: str, model_name: str | None,
              header_timeout: float, body_timeout: float, max_connections: int, max_connections_per_address: int,
              trusted_proxies: tuple[str, ...]) -> None:
    """Serve MODEL over HTTP: POST /v1/predict, POST /v1/explain, GET /v1/info, /healthz, /metrics (and with
    --protocol v2 the Open Inference Protocol's /v2 routes).

    Clients authenticate with 'Authorization: Bearer KEY'. Attack it with any extraction command:
    stealkit extract baseline --victim http://HOST:PORT --key KEY --budget N ...
    (v2: --victim v2+http://HOST:PORT --model NAME).
    """
    import shutil
    import tempfile

    import uvicorn

    from stealkit.models.foreign_meta import join_victim, split_victim
    from stealkit.models.locate import load_any_model
    from stealkit.serve.app import ENV, check_explain_keys
    from stealkit.serve.keys import load_keys
    from stealkit.serve.store import Store
    from stealkit.serve.v2 import model_name as v2_model_name

    if workers < 1 or not 0 < port < 65536 or max_inflight < 1 or compute_slots < 1:
        raise InputError("--workers, --max-inflight and --compute-slots must be >= 1 and --port in 1..65535")
    if min(max_connections, max_connections_per_address) < 1 or not 0 < header_timeout <= 3600 \
            or not 0 < body_timeout <= 3600:
        raise InputError("--max-connections and --max-connections-per-address must be >= 1, and "
                         "--header-timeout and --body-timeout in (0, 3600] seconds")
    trusted = check_trusted(trusted_proxies)
    # fail fast, in this process, on a bad model, keys file or database (one clear line instead of N workers'
    # tracebacks), and create the schema once before the workers race to
    name = v2_model_name(model_dir, model_name)
    _, spec = load_any_model(model_dir, device=device)
    config = load_keys(keys_path)
    check_explain_keys(spec, config, model_dir)
    store = Store(db)
    store.sync_keys(config.keys.values())
    refunded = store.recover()  # requests in flight when a previous server died were never settled
    store.close()
    if refunded:
        click.echo(f"refunded {refunded} request(s) left in flight by the previous run (never settled)", err=True)
    path, options = split_victim(model_dir)
    os.environ[ENV] = json.dumps({"model": join_victim(os.path.abspath(path), options), "keys": os.path.abspath(keys_path),
                                  "db": os.path.abspath(db), "workers": workers, "threads": threads,
                                  "device": device, "max_inflight": max_inflight, "compute_slots": compute_slots,
                                  "protocol": protocol, "model_name": name, "body_timeout": body_timeout,
                                  "conn": {"header_timeout": header_timeout, "per_address": max_connections_per_address,
                                           "max_connections": max_connections, "trusted": list(trusted)},
                                  "supervisor_pid": os.getpid() if workers > 1 else None})
    metrics_dir = None
    if workers > 1:  # prometheus_client's multiprocess mode: one aggregated series per metric
        metrics_dir = tempfile.mkdtemp(prefix="stealkit-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host}, reachable beyond this machine", err=True)
    click.echo(f"serving {model_dir} on http://{host}:{port} ({workers} worker(s), {len(config.keys)} key(s))",
               err=True)
    if protocol == "v2":
        click.echo(f"v2: http://{host}:{port}/v2/models/{name} (explanations: {name}-explain)", err=True)
    if config.metrics_digest is None:
        click.echo("metrics: off (set metrics_key in the keys file's [model] table to scrape /metrics)", err=True)
    try:
        uvicorn.run("stealkit.serve.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                    # connection guards (header deadline, connection caps): uvicorn has no such knobs
                    http="stealkit.serve.conn:GuardedH11Protocol",
                    timeout_keep_alive=5, h11_max_incomplete_event_size=16 * 1024,
                    # X-Forwarded-For only from --trusted-proxy (uvicorn trusts loopback by default)
                    proxy_headers=bool(trusted), forwarded_allow_ips=",".join(trusted) or None,
                    # a worker imports torch and loads the model before it answers the supervisor's health
                    # checks; uvicorn's 5 s default kills and restarts slow starters forever on a busy machine
                    timeout_worker_healthcheck=120)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def check_trusted(values: tuple[str, ...]) -> tuple[str, ...]:
    """Validate ``--trusted-proxy`` values: IP addresses or networks (CIDR)."""
    import ipaddress

    for v in values:
        try:
            ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise InputError(f"--trusted-proxy {v!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
    return tuple(values)


def register(cli: click.Group) -> None:
    cli.add_command(serve_cmd)
