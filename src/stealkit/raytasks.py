"""The Ray engine every ``--backend ray`` uses (sweeps, ``reproduce``, the audit's parts): one session on an
existing cluster (``--address``) or a local Ray, tasks with their resources, results as each task finishes.

Ray is optional (the ``ray`` extra): nothing here imports it at module level, :func:`check_backend` refuses a
bad ``--backend``/``--address`` pair and a missing Ray in one line before any heavy import, and only the
functions that run tasks import it.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stealkit.errors import InputError

BACKENDS = ("local", "ray")
#: Ray's setting of its workers' niceness (read by the raylet a local Ray starts); see :func:`_niceness`
NICENESS_ENV = "RAY_worker_niceness"
NICENESS = "0"
MISSING = "--backend ray needs Ray, which is not installed: pip install 'stealkit[ray]' (the ray extra)"


def check_backend(backend: str, address: str | None) -> None:
    """Refuse an unknown backend, ``--address`` without ``--backend ray`` and ``--backend ray`` without Ray."""
    if backend not in BACKENDS:
        raise InputError(f"--backend takes local or ray, got {backend!r}")
    if address and backend != "ray":
        raise InputError(f"--address {address} names a Ray cluster: add --backend ray, or leave --address out")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise InputError(MISSING)


def gpu_fraction(device: str | None, per_gpu: int) -> float:
    """The GPU share each task asks for: ``1/per_gpu`` of a GPU where the work runs on cuda, else none."""
    return 1 / max(1, per_gpu) if device and device.startswith("cuda") else 0.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(MISSING) from None
    return ray


@contextlib.contextmanager
def session(address: str | None, num_cpus: int) -> Iterator[Any]:
    """Ray, connected: to the cluster at ``address`` (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``), or a local Ray
    of ``num_cpus`` CPUs started here; one already initialised in this process is used as it is. Shut down on
    leaving only if it was started here."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            with _niceness(NICENESS):
                # "local": a new Ray, even where one started by ``ray start`` runs here (``--address auto``
                # names that one); without it Ray would join that one and refuse num_cpus
                ray.init(address="local", num_cpus=max(1, num_cpus), include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def _niceness(value: str) -> Iterator[None]:
    """Ray's workers at the driver's priority while a local Ray starts: Ray starts them at niceness 15 unless
    ``RAY_worker_niceness`` says otherwise, so on shared cores every other process (Ray's own daemons included) runs
    before a part, which then takes 1.3-1.6x its ``--jobs`` time. A value the user set is kept."""
    import os

    before = os.environ.get(NICENESS_ENV)
    if before is None:
        os.environ[NICENESS_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NICENESS_ENV, None)


def remote(fn: Callable[..., Any], *, num_cpus: float = 1, num_gpus: float = 0) -> Any:
    """``fn`` as a Ray task asking for these resources, never retried (a retried part would pay twice)."""
    return _ray().remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)(fn)


def as_completed(refs: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """``(index, result)`` of each task as it finishes; a failed task raises here (the others are cancelled)."""
    ray = _ray()
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                yield index[ref], ray.get(ref)
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


def run_all(fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]], *, address: str | None, workers: int,
            gpus: float = 0, on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Every ``fn(*job)`` as a Ray task of one CPU (and ``gpus`` of a GPU); the results in ``jobs``' order.
    ``on_done(index, result)`` is called as each finishes."""
    with session(address, workers):
        task = remote(fn, num_cpus=1, num_gpus=gpus)
        refs = [task.remote(*job) for job in jobs]
        results: dict[int, Any] = {}
        for i, result in as_completed(refs):
            results[i] = result
            if on_done is not None:
                on_done(i, result)
        return [results[i] for i in range(len(jobs))]
