"""The audit's parts as Ray tasks (``stealkit audit --backend ray [--address ADDR]``), on the engine of
:mod:`stealkit.raytasks` that sweeps and ``reproduce --backend ray`` use.

Dispatch follows ``--jobs``: the parts that need no stolen copy go first, all at once, the largest first (Ray runs
as many as the cluster's resources allow); when all of them have finished, the best copy is chosen from their
records as in one process, and the parts that start from it go. Each task asks for ``num_cpus`` = its torch threads
(one, or ``$STEALKIT_THREADS``) and, where the audit runs on cuda, ``1/--jobs`` of a GPU. On its worker a part runs
exactly as :func:`stealkit.audit.execute.watched_part` (which the executor hands over) runs it in process: its own
metered oracle and ledger, PRADA watching its queries, its answer journal. Its record comes back to the driver, which writes it as ``--jobs`` does
(``parts/<id>.json``, ``records.jsonl``): ``audit.json`` holds the figures of ``--jobs 1`` at the same seed, and a
driver killed mid-audit and run again keeps the finished parts.

What moves over the network: the run context (the options; the victim's handle: an HTTP victim's address and key,
which every worker queries with; an ``nn.Module`` itself), put in the object store once; a local victim's files,
put once and fetched by a node only where it cannot read them at the driver's path; each part's record back; and
where a worker does not see the driver's ``--out`` (no shared filesystem), the part's folder back (its student,
its journal) and the best copy's folder out to the parts that start from it. ``ray.jsonl`` in the audit folder
says where each part ran, with what resources, in how long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.audit import copies
from stealkit.audit.kinds import KINDS, LADDER_KIND, part_id
from stealkit.audit.parts import Part, RunContext

#: the file in ``parts/`` whose token tells a worker it sees the driver's folder (a shared filesystem)
TOKEN_FILE = ".ray-driver"
#: set to 1 on the driver: the workers act as if they saw none of its files (the shipping path, on one machine)
SHIP_ENV = "STEALKIT_RAY_SHIP"
#: the text files of a shipped part folder whose worker paths are written back as the driver's
TEXT_SUFFIXES = (".json", ".jsonl", ".html", ".txt", ".md")

Record = Callable[[Part, dict[str, Any]], None]
RunPart = Callable[[Part, RunContext, "copies.Copy | None"], dict[str, Any]]


@dataclass(frozen=True)
class VictimFiles:
    """A local victim as the workers get it: where the driver has it and the digest of its files; ``box`` holds
    the object-store reference of the files themselves (fetched only by a worker that cannot read them)."""

    location: str   # the driver's victim string (a path, maybe with ``?k=v`` metadata)
    path: str       # the driver's absolute path (without the metadata)
    suffix: str     # ``?k=v`` metadata, or ""
    digest: str
    is_dir: bool
    box: list[Any]


@dataclass(frozen=True)
class Job:
    """What a part's task gets besides the part and the run context."""

    parts_dir: str                  # the driver's parts folder, absolute
    token: str                      # "" where the driver asked the workers to ship everything
    victim: VictimFiles | None
    copy: copies.Copy | None        # the best copy, as the driver names it
    copy_box: list[Any]             # its packed folder, in the object store


def run_on_ray(parts: Sequence[Part], todo: Sequence[Part], ctx: RunContext, record: Record,
               results: dict[str, dict[str, Any]], run: RunPart) -> None:
    """Run ``todo`` (of the plan ``parts``) as Ray tasks, each ``run(part, ctx, copy)`` on its worker (the executor's
    :func:`~stealkit.audit.execute.watched_part`), calling ``record`` for each as it finishes (in the driver)."""
    from stealkit.fsutil import atomic_write_text
    from stealkit.raytasks import gpu_fraction, remote, session
    from stealkit.threads import resolve_threads

    if not todo:
        return
    opts = ctx.options
    ship = os.environ.get(SHIP_ENV) == "1"
    parts_dir = ctx.parts_dir
    parts_dir.mkdir(parents=True, exist_ok=True)
    token = "" if ship else uuid.uuid4().hex
    if token:
        atomic_write_text(parts_dir / TOKEN_FILE, token)
    threads = resolve_threads() or 1
    gpus = gpu_fraction(opts.device, opts.jobs)
    log = parts_dir.parent / "ray.jsonl"
    with session(opts.address, opts.jobs) as ray:
        ctx_ref = ray.put(ctx)
        victim = _victim_files(ctx, ray)
        task = remote(_part_task, num_cpus=threads, num_gpus=gpus)

        def wave(group: Sequence[Part], copy: copies.Copy | None) -> None:
            if not group:
                return
            box = [ray.put(_pack(parts_dir, copy.id))] if copy is not None else []
            job = Job(str(parts_dir.resolve()), token, victim, copy, box)
            refs = [task.remote(run, p, ctx_ref, job, threads) for p in group]
            from stealkit.raytasks import as_completed

            for i, (result, files, where) in as_completed(refs):
                if files is not None:
                    _unpack(files, parts_dir)
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"id": part_id(group[i]), **where, "num_cpus": threads, "num_gpus": gpus,
                                         "elapsed_s": result["elapsed_s"]}) + "\n")
                record(group[i], result)

        free = sorted((p for p in todo if not KINDS[p.kind].needs_copy), key=lambda p: -p.estimate_s)
        wave(free, None)
        rest = [p for p in todo if KINDS[p.kind].needs_copy]
        if rest:
            copy = copies.best_copy([results[part_id(p)] for p in parts if part_id(p) in results], parts_dir,
                                    LADDER_KIND)
            wave(rest, copy)


def _part_task(run: RunPart, part: Part, ctx: RunContext, job: Job, threads: int
               ) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """On a worker: the part through its own metered oracle, as in one process; its record (the driver's paths),
    its folder where the driver cannot see it, and where it ran."""
    import socket

    import ray

    os.environ["STEALKIT_QUIET"] = "1"
    from stealkit.threads import apply_threads

    apply_threads(threads)
    started = time.time()
    shared = bool(job.token) and _reads(Path(job.parts_dir) / TOKEN_FILE) == job.token
    scratch = None if shared else Path(tempfile.mkdtemp(prefix="stealkit-part-"))
    work = Path(job.parts_dir) if scratch is None else scratch / "parts"
    work.mkdir(parents=True, exist_ok=True)
    names = {str(work): str(ctx.parts_dir)}
    target = ctx.target
    try:
        if job.victim is not None:
            here = _victim_here(job.victim, trust_path=bool(job.token))
            target = dataclasses.replace(target, victim=here)
            names[here] = job.victim.location
        copy = job.copy
        if copy is not None:
            if scratch is not None:
                _unpack(ray.get(job.copy_box[0]), work)
            copy = dataclasses.replace(copy, dir=str(work / copy.id))
        result = _rename(run(part, RunContext(target, ctx.options, work), copy), names)
        files = None if scratch is None else _renamed_files(_pack(work, part_id(part)), names)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    where = {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
             "shared_fs": shared, "started": round(started, 3), "finished": round(time.time(), 3)}
    return result, files, where


def _reads(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


# --- a local victim: put in the object store once, read in place where a node sees it ---------------------------

def _victim_files(ctx: RunContext, ray: Any) -> VictimFiles | None:
    """A local model directory or file victim's files in the object store (``None``: an address or a module,
    which travel in the run context)."""
    victim = ctx.target.victim
    if not isinstance(victim, str | os.PathLike):
        return None
    from stealkit.models.foreign_meta import split_victim
    from stealkit.oracle.victim import is_url

    location = os.fspath(victim)
    if is_url(location):
        return None
    path, meta = split_victim(location)
    suffix = location[len(path):] if meta else ""
    root = Path(path).resolve()
    if not root.exists():
        return None  # the run fails as in one process, with the open's own message
    files = _files_of(root)
    return VictimFiles(location, str(root), suffix, _digest(files), root.is_dir(), [ray.put(files)])


def _files_of(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


#: the victim string each digest was given in this worker process (read or written once per process)
_HERE: dict[tuple[str, bool], str] = {}


def _victim_here(v: VictimFiles, *, trust_path: bool) -> str:
    """The victim string a worker opens: the driver's path where this node reads the same files there, else the
    files from the object store written once per node (under the system's temporary folder, by digest)."""
    import ray

    root = Path(v.path)
    if (v.digest, trust_path) in _HERE:
        return _HERE[v.digest, trust_path]
    if trust_path and root.exists() and _digest(_files_of(root)) == v.digest:
        _HERE[v.digest, trust_path] = v.path + v.suffix
        return v.path + v.suffix
    home = _made(Path(tempfile.gettempdir()) / "stealkit-ray-victims" / v.digest[:32])
    dest = home / root.name
    if not dest.exists():
        files = ray.get(v.box[0])
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=home))
        for name, data in files.items():
            out = staging / root.name / name if v.is_dir else staging / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        try:
            os.replace(staging / root.name, dest)
        except OSError:  # another worker of this node wrote it first
            if not dest.exists():
                raise
        shutil.rmtree(staging, ignore_errors=True)
    _HERE[v.digest, trust_path] = str(dest) + v.suffix
    return _HERE[v.digest, trust_path]


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- a part's folder where the worker does not see the driver's ------------------------------------------------

def _pack(parts_dir: Path, pid: str) -> dict[str, bytes]:
    """``parts_dir/<pid>/`` and its siblings ``<pid>.*`` (the answer journal) as relative name -> bytes."""
    files = {}
    for p in sorted(parts_dir.glob(f"{pid}*")):
        if p.name != pid and not p.name.startswith(pid + "."):
            continue
        if p.is_file():
            files[p.name] = p.read_bytes()
        else:
            files.update({str(q.relative_to(parts_dir)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()})
    return files


def _unpack(files: dict[str, bytes], parts_dir: Path) -> None:
    for name, data in files.items():
        out = parts_dir / name
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, out)


def _rename(obj: Any, names: dict[str, str]) -> Any:
    """Every string of a record with the worker's paths written as the driver's (longest first)."""
    pairs = sorted(((a, b) for a, b in names.items() if a != b), key=lambda ab: -len(ab[0]))
    if not pairs:
        return obj

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            for a, b in pairs:
                x = x.replace(a, b)
            return x
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(walk(v) for v in x)
        return x

    return walk(obj)


def _renamed_files(files: dict[str, bytes], names: dict[str, str]) -> dict[str, bytes]:
    out = {}
    for name, data in files.items():
        if name.endswith(TEXT_SUFFIXES):
            with contextlib.suppress(UnicodeDecodeError):
                data = _rename(data.decode("utf-8"), names).encode("utf-8")
        out[name] = data
    return out
