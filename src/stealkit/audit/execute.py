"""Running the plan: each part through its own metered oracle, checkpointed as it finishes, resumable.

Each part writes ``parts/<id>.json`` atomically when it finishes: an interrupted audit run again with the same
``--out`` and plan skips the finished parts and pays for no query twice (an extraction part stopped midway
replays its answer journal; a data-free part resumes from its checkpoint). PRADA watches every part's own
queries as the oracle answers them; each part's progress goes to the audit's status line
(:mod:`stealkit.audit.status`). With ``jobs`` > 1, the parts that need no stolen copy run in worker
processes of one torch thread each; the figures and the queries are those of a run with ``jobs`` = 1. With
``backend`` ``ray`` every part is a Ray task instead (:mod:`stealkit.audit.ray_backend`), recorded the same way.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit import copies
from stealkit.audit.kinds import KINDS, LADDER_KIND, part_id
from stealkit.audit.parts import Part, RunContext
from stealkit.errors import InputError

if TYPE_CHECKING:
    from stealkit.rundir import RunDir

#: called after each part with the part and its result (a hook: a test stops the audit here)
PartHook = Callable[[Part, dict[str, Any]], None]
#: below this estimated time of the parallel parts together, starting worker processes (a few seconds each:
#: a fresh interpreter imports torch) costs more than it saves, so they run in this process
PARALLEL_MIN_SECONDS = 120.0


def run_part(part: Part, ctx: RunContext, copy: copies.Copy | None = None) -> dict[str, Any]:
    """Run one part into ``parts_dir/<id>/``; its result (the part, its figures, its seconds)."""
    kind = KINDS[part.kind]
    out = ctx.parts_dir / part_id(part)
    started = time.perf_counter()
    checkpointed = (out / "checkpoint" / "checkpoint.json").exists()
    if out.exists() and not checkpointed:  # a part stopped midway runs again from its start (its journal replays)
        shutil.rmtree(out)
    from stealkit.audit.status import reporting

    with reporting(ctx.parts_dir, part_id(part)):  # its bars' progress, for the audit's status line
        result = kind.run(part, ctx, out, copy)
    return {"part": part.as_dict(), "id": part_id(part), **result,
            "elapsed_s": round(time.perf_counter() - started, 2)}


def watched_part(part: Part, ctx: RunContext, copy: copies.Copy | None = None) -> dict[str, Any]:
    """:func:`run_part` with PRADA watching the part's own queries, in order (none is sent again for it)."""
    from stealkit.audit.defences import PradaObserver
    from stealkit.oracle.observe import observing

    with observing(PradaObserver()) as watch:
        result = run_part(part, ctx, copy)
    result["prada"] = watch.as_dict()
    if result.get("resumed"):
        result["prada"]["note"] = "resumed from its checkpoint: PRADA saw the queries after it only"
    return result


def load_done(parts_dir: Path, parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    done = {}
    for p in parts:
        path = parts_dir / f"{part_id(p)}.json"
        if path.exists():
            done[part_id(p)] = json.loads(path.read_text(encoding="utf-8"))
    return done


def check_resume(run: RunDir, config: dict[str, Any], seed: int) -> set[str]:
    """The finished parts of an earlier audit in ``run`` with the same plan; another plan there is refused."""
    if not (run.path / "parts").is_dir():
        return set()
    old = run.load_config() if run.config_path.exists() else {}
    if old.get("command") != "audit" or old.get("config") != json.loads(json.dumps(config)) or old.get("seed") != seed:
        raise InputError(f"{run.path} holds an audit with another plan; run it with the same options to resume, "
                         "or choose another --out")
    return {p.stem for p in (run.path / "parts").glob("*.json")}


def execute(parts: Sequence[Part], run: RunDir, ctx: RunContext, *, on_part: PartHook | None = None,
            echo: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """Run the parts not yet checkpointed in ``run``/parts, each one written atomically when it finishes."""
    from stealkit.fsutil import atomic_write_json

    parts_dir = ctx.parts_dir
    done = load_done(parts_dir, parts)
    results: dict[str, dict[str, Any]] = dict(done)
    finished = [0]

    def record(part: Part, result: dict[str, Any]) -> None:
        atomic_write_json(parts_dir / f"{part_id(part)}.json", result)
        run.append_record(result)
        finished[0] += 1
        echo(f"[{len(done) + finished[0]}/{len(parts)}] {part_id(part)}: {KINDS[part.kind].progress(result)}, "
             f"{result['total_queries']:,} queries, {result['elapsed_s']:.0f}s")
        results[part_id(part)] = result
        if on_part is not None:
            on_part(part, result)

    todo = [p for p in parts if part_id(p) not in done]
    if ctx.options.backend == "ray":  # each part a Ray task, recorded here as it finishes
        from stealkit.audit.ray_backend import run_on_ray

        run_on_ray(parts, todo, ctx, record, results, watched_part)
        return [results[part_id(p)] for p in parts]
    free = [p for p in todo if not KINDS[p.kind].needs_copy]
    jobs = ctx.options.jobs
    if jobs > 1 and len(free) > 1 and sum(p.estimate_s for p in free) >= PARALLEL_MIN_SECONDS:
        workers = _in_workers(free, min(jobs, len(free)), ctx)
        try:
            for part, result in workers:
                record(part, result)
        finally:
            workers.close()  # stops the other workers now if a part failed or the hook stopped the audit
    for part in todo:
        if part_id(part) in results:
            continue
        copy = None
        if KINDS[part.kind].needs_copy:
            copy = copies.best_copy([results[part_id(p)] for p in parts if part_id(p) in results], parts_dir,
                                    LADDER_KIND)
        record(part, watched_part(part, ctx, copy))
    return [results[part_id(p)] for p in parts]


def _in_workers(parts: Sequence[Part], jobs: int, ctx: RunContext) -> Iterator[tuple[Part, dict[str, Any]]]:
    """Each part in one of ``jobs`` spawned worker processes, yielded as each finishes (the largest first, so
    the slowest part does not start last). A failure stops the others; the finished parts are already yielded."""
    import functools
    import multiprocessing as mp

    order = sorted(parts, key=lambda p: -p.estimate_s)
    mp_ctx = mp.get_context("spawn")  # not fork: the parent has run torch, and a forked OpenMP runtime can hang
    with mp_ctx.Pool(jobs, initializer=_worker_setup) as pool:
        try:
            yield from pool.imap_unordered(functools.partial(_worker_part, ctx=ctx), order)
        finally:
            pool.terminate()


def _worker_setup() -> None:
    """A worker: no progress bars of its own (the audit prints a line per part), one torch thread."""
    import os

    os.environ["STEALKIT_QUIET"] = "1"
    from stealkit.threads import apply_threads, resolve_threads

    apply_threads(resolve_threads())


def _worker_part(part: Part, ctx: RunContext) -> tuple[Part, dict[str, Any]]:
    return part, watched_part(part, ctx)
