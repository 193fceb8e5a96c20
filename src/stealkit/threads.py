"""The CPU thread policy: how many intra-op threads torch uses in a stealkit process.

stealkit's models (the zoo on digits, Fashion-MNIST, CIFAR-sized inputs) are small: extra intra-op threads
gain little on them and cost a lot when the cores are shared with other work (docs/results.md#threads: the demo took
10.1 s beside a CPU-bound neighbour at one thread, 24.5 s at two). So a process uses **one** intra-op thread unless told otherwise, and parallelism comes from running
independent work in separate processes (``reproduce --jobs``, ``sweep --workers``).

Precedence: ``--threads N`` > ``$STEALKIT_THREADS`` > ``$OMP_NUM_THREADS`` (set by the user) > 1. ``0`` means
torch's own default (one thread per core). The count in force is recorded in every run's ``config.json``.
"""

from __future__ import annotations

import os
import sys

from stealkit.errors import InputError

DEFAULT_THREADS = 1
_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def resolve_threads(option: int | None = None) -> int | None:
    """The thread count to use (``None``: leave torch's default), from the option and the environment."""
    if option is not None:
        value, source = str(option), "--threads"
    elif os.environ.get("STEALKIT_THREADS"):
        value, source = os.environ["STEALKIT_THREADS"], "$STEALKIT_THREADS"
    elif os.environ.get("OMP_NUM_THREADS"):
        return None  # the user chose already; torch reads it at import
    else:
        return DEFAULT_THREADS
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{source} must be a whole number of threads (0 = one per core), got {value!r}") from None
    if n < 0:
        raise InputError(f"{source} must be >= 0 threads (0 = one per core), got {n}")
    return None if n == 0 else n


def apply_threads(n: int | None) -> None:
    """Use ``n`` intra-op threads from now on (before torch is imported, through the environment it reads)."""
    if n is None:
        return
    os.environ["STEALKIT_THREADS"] = str(n)  # worker processes (reproduce --jobs, sweeps) inherit the policy
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(n)
    else:  # torch is not loaded yet (the CLI imports it lazily): it takes its thread count from these
        for var in _ENV_VARS:
            os.environ[var] = str(n)
