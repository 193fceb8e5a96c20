"""The ``NAME.meta.json`` beside a benchmark's raw rows ``NAME.jsonl`` (``results/rows/``).

A benchmark that writes rows with ``--jsonl PATH`` calls :func:`start` before its first row and :func:`finish`
after its last: the meta file then says how the rows were made (the command as typed, with ``OMP_NUM_THREADS``
and the niceness; the commit and whether the tree was dirty; the start and end time in UTC; torch; the device;
the load average at both ends; the seeds; a digest of each data split the rows were scored on) so that
``benchmarks/results_tables.py`` can print it under the table it regenerates. ``plan`` is a committed plan's path
for sealed rows, else ``"none: ..."`` saying the rows are not sealed.

    meta = rowmeta.start(args.jsonl, seeds=[0, 1, 2], data={"test": x_test}, device="cpu")
    ...                                    # rows appended to args.jsonl
    rowmeta.finish(meta)                   # writes PATH.meta.json (PATH without .jsonl)
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the plan of rows that are not sealed
NO_PLAN = "none: a rerun of a development figure (no plan committed before the run; not sealed)"


def meta_path(jsonl: str | Path) -> Path:
    """``results/rows/NAME.jsonl`` -> ``results/rows/NAME.meta.json``."""
    p = Path(jsonl)
    return p.with_name(p.name.removesuffix(".jsonl") + ".meta.json")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _commit() -> str:
    def git(*a: str) -> str:
        out = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks")
    return sha + (" (with uncommitted changes under src/ or benchmarks/)" if dirty else "")


def _command() -> str:
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS",) if k in os.environ)
    nice = os.nice(0)
    parts = [env, f"nice -n {nice}" if nice else "", "python", shlex.join(sys.argv)]
    return " ".join(p for p in parts if p)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def data_digest(x: Any) -> str:
    """A short sha256 of a tensor or array (the ledger's digest), for the ``data`` field."""
    from stealkit.oracle.ledger import digest_tensor

    return f"sha256 {digest_tensor(x)} ({'x'.join(str(d) for d in getattr(x, 'shape', ()))})"


def start(jsonl: str | Path | None, *, seeds: Any, data: dict[str, Any] | None = None, device: str = "cpu",
          plan: str = NO_PLAN, **extra: Any) -> dict[str, Any] | None:
    """The meta of a run about to write rows to ``jsonl`` (``None`` when it writes none). ``data``: name ->
    tensor (digested here) or a string already saying what the data is."""
    if not jsonl:
        return None
    import torch

    digests = {k: v if isinstance(v, str) else data_digest(v) for k, v in (data or {}).items()}
    return {"path": str(jsonl), "command": _command(), "plan": plan, "commit": _commit(), "started": _now(),
            "torch": torch.__version__, "device": f"{device}, {os.cpu_count()} cores visible, "
            f"{torch.get_num_threads()} torch threads", "seeds": seeds, "data": digests,
            "_load_start": _load(), **extra}


def finish(meta: dict[str, Any] | None, **extra: Any) -> Path | None:
    """Write ``meta`` (from :func:`start`) beside its rows, with the end time and load; returns its path."""
    if meta is None:
        return None
    meta = dict(meta)
    start_load = meta.pop("_load_start")
    meta["date"] = f"{meta.pop('started')} - {_now()}"
    meta["load"] = f"load average {start_load} at the start, {_load()} at the end"
    meta.update(extra)
    out = meta_path(meta.pop("path"))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def victim_test(name: str) -> Any:
    """The test split's images of the standard victim ``name`` (e.g. ``digits-conv2``), for :func:`data_digest`."""
    from stealkit.data import load_splits
    from stealkit.victims import RECIPES

    recipe = RECIPES[name]
    return load_splits(recipe.dataset, seed=recipe.split_seed).test.x
