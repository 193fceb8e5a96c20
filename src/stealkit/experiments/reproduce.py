"""``stealkit reproduce``: run every paper study at a scale and write one report, the papers beside ours.

The studies are the TOML configs in ``experiments/reproduce/<scale>/`` (``small``: CPU scale, all of it within
90 minutes on 2 cores; ``full``: the papers' own settings, for GPUs and clusters). Each config's ``paper``
table lists the results it reproduces::

    [[paper.rows]]
    result = "CoDFe substitute accuracy, MNIST, probabilities"
    paper = "91%"
    ours = "final.accuracy"        # a dotted path into the last step's summary.json (or "STEP:path")
    settings = "digits, 200k queries"

A restarted reproduction skips every finished step (see :mod:`stealkit.experiments.runner`).
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any

from stealkit import __version__
from stealkit.errors import InputError, StealkitError
from stealkit.experiments.config import ExperimentConfig, load_config
from stealkit.experiments.runner import run_experiment
from stealkit.fsutil import atomic_write_json, atomic_write_text
from stealkit.rundir import RunDir, environment

log = logging.getLogger(__name__)
SCALES = ("small", "full")


def config_paths(scale: str) -> list[Path]:
    if scale not in SCALES:
        raise InputError(f"unknown scale {scale!r}; expected one of {SCALES}")
    root = resources.files("stealkit.experiments") / "reproduce" / scale
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml"))


def lookup(summary: dict[str, Any], path: str) -> Any:
    """Follow a dotted path into a summary; ``None`` when the path is absent.

    ``lookup({"a": [{"b": 1}]}, "a.0.b") == 1``. A dict key may itself hold dots (``"0.5"``, ``"sigma=0.5"``):
    the longest key that matches wins. In a list, ``key=value`` selects the first dict whose ``key`` is
    ``value`` (``rows.substitute=CoDFe-P.pgd_untargeted``; ``a=1&b=2`` for several keys).
    """
    return _follow(summary, path.removeprefix("final.").split("."))


def _follow(node: Any, parts: list[str]) -> Any:
    if not parts:
        return node
    for k in range(len(parts), 0, -1):
        head = ".".join(parts[:k])
        if isinstance(node, dict) and head in node:
            found = _follow(node[head], parts[k:])
            if found is not None:
                return found
        elif isinstance(node, list):
            if head.lstrip("-").isdigit() and -len(node) <= int(head) < len(node):
                return _follow(node[int(head)], parts[k:])
            conds = [c.partition("=") for c in head.split("&")]
            if all(eq for _, eq, _ in conds):
                match = next((d for d in node if isinstance(d, dict)
                              and all(str(d.get(k)) == v for k, _, v in conds)), None)
                if match is not None:
                    return _follow(match, parts[k:])
    return None


def study_aliases(configs: list[Any]) -> dict[str, set[str]]:
    """Every other name a user may know a reproduce study by -> the reproduce names it selects: the study's
    name in ``stealkit study list`` (and its ``stealkit study NAME`` subcommand) for each study a config runs."""
    from stealkit.studies.registry import STUDIES

    by_command = {study.KIND: name for name, study in STUDIES.items()}
    out: dict[str, set[str]] = {}
    for c in configs:
        for step in c.steps:
            name = by_command.get(step.command)
            if name is None and step.command.startswith("study "):
                name = step.command.split(" ", 1)[1]
            if name is not None and name != c.name:
                out.setdefault(name, set()).add(c.name)
    return out


#: former reproduce names (before each study had one name), still accepted by ``--only``
FORMER_NAMES = {"milli-figures-2-4": "explanations", "milli-exact-recovery": "exact-recovery",
                "stn-certified-robustness": "stn-certify"}


def resolve_only(configs: list[Any], only: tuple[str, ...]) -> set[str]:
    """The reproduce names ``--only`` selects: a reproduce name, or a study's name from ``stealkit study list``."""
    names, aliases = {c.name for c in configs}, study_aliases(configs)
    aliases |= {old: {new} for old, new in FORMER_NAMES.items() if new in names and old not in names}
    unknown = sorted(set(only) - names - set(aliases))
    if unknown:
        raise InputError(f"unknown studies {', '.join(unknown)}; available: {', '.join(c.name for c in configs)} "
                         f"(or a study name from `stealkit study list`: {', '.join(sorted(aliases))})")
    return {x for o in only for x in ({o} if o in names else aliases[o])}


def reproduce(scale: str, out: str | Path, *, only: tuple[str, ...] = (), force: bool = False,
              jobs: int = 1, device: str | None = None, backend: str = "local",
              address: str | None = None) -> dict[str, Any]:
    """Run every study of ``scale`` (or ``only`` these) into ``out``; ``jobs`` studies at a time, each in its own
    process with its own thread budget (see :mod:`stealkit.threads`). Finished steps are skipped on restart and
    the output is one report whatever ``jobs`` is. ``device`` goes to every step that takes ``--device``.
    ``backend="ray"``: each study a Ray task of one CPU (:mod:`stealkit.raytasks`, the sweeps' engine) on the
    cluster at ``address`` (default: a local Ray of ``jobs`` CPUs); ``out`` must be a folder every node sees."""
    from stealkit.raytasks import check_backend

    check_backend(backend, address)
    out = Path(out)
    configs = [load_config(p) for p in config_paths(scale)]
    if only:
        names = resolve_only(configs, only)
        configs = [c for c in configs if c.name in names]
    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    t0, env = time.perf_counter(), environment()  # the load average is the machine's when the run began
    n = len(configs)
    log.info("reproduce: %d studies at scale %s, %d at a time", n, scale, min(jobs, n))
    from stealkit.progress import progress

    bar = progress(total=n, desc="reproduce", unit="study")
    if backend == "ray":
        from stealkit.raytasks import gpu_fraction, run_all

        finished: list[int] = []

        def done_one(_i: int, study: dict[str, Any]) -> None:
            finished.append(_i)
            bar.update(1)
            _progress(study, len(finished), n, t0, jobs)

        studies = run_all(run_study, [(cfg, out.resolve(), force, device) for cfg in configs], address=address,
                          workers=jobs, gpus=gpu_fraction(device, jobs), on_done=done_one)
    elif jobs == 1 or n == 1:
        studies = []
        for cfg in configs:
            studies.append(run_study(cfg, out, force, device))
            bar.update(1)
            _progress(studies[-1], len(studies), n, t0, jobs)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a fresh interpreter per worker (no forked torch thread pools); results kept in config order
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_study, cfg, out, force, device): i for i, cfg in enumerate(configs)}
            done: dict[int, dict[str, Any]] = {}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
                bar.update(1)
                _progress(done[futures[future]], len(done), n, t0, jobs)
            studies = [done[i] for i in range(n)]
    bar.close()
    summary = {"scale": scale, "wall_seconds": round(time.perf_counter() - t0, 1), **env,
               "compute_seconds": round(sum(s["seconds"] for s in studies), 1), "jobs": jobs,
               "failed": [s["name"] for s in studies if s.get("error")], "studies": studies, "backend": backend,
               "stealkit_version": __version__, "device": device}
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "report.html", render(summary, configs))
    atomic_write_text(out / "results.md", markdown(summary))
    return summary


def _progress(study: dict[str, Any], finished: int, total: int, t0: float, jobs: int) -> None:
    """One progress line per finished study: which, how far, its time, and an ETA at the pace so far."""
    elapsed = time.perf_counter() - t0
    left = total - finished
    eta = f"; about {elapsed / finished * left / 60:.0f} min left at this pace" if left else ""
    outcome = "failed" if study.get("error") else f"done in {study['seconds']:.0f} s"
    log.info("reproduce: %d/%d studies finished (%s %s, %.0f s since the start, %d at a time)%s", finished, total,
             study["name"], outcome, elapsed, jobs, eta)


def study_ledger(path: Path) -> dict[str, int] | None:
    """What a study spent: the sum of the query ledgers of every run under ``path`` (the ``queries`` of an
    extraction's summary.json, the ``victim_queries`` of an attack's), never arithmetic on its settings;
    ``None`` where no run of the study queried a victim."""
    import json

    total: dict[str, int] = {}
    for summary in sorted(path.rglob("summary.json")):
        try:
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        for key in ("queries", "victim_queries"):
            ledger = data.get(key) if isinstance(data, dict) else None
            if isinstance(ledger, dict) and ledger and all(type(v) is int for v in ledger.values()):
                for kind, n in ledger.items():
                    total[kind] = total.get(kind, 0) + n
    return total or None


def run_study(cfg: ExperimentConfig, out: Path, force: bool, device: str | None = None) -> dict[str, Any]:
    """Run one study's steps into ``out/NAME``; its entry of the reproduction's summary (an error is reported in
    it, never raised, so one failed study does not lose the others)."""
    s0 = time.perf_counter()
    try:
        outcomes = run_experiment(cfg, out / cfg.name, force=force, device=device)
    except Exception as exc:  # one failed study must not lose the others; it is reported and re-run next time
        if not isinstance(exc, StealkitError):  # a bug, not a user error: keep the traceback in the log
            log.exception("study %s failed with an internal error", cfg.name)
            exc = StealkitError(f"internal error {type(exc).__name__}: {exc}")
        log.error("study %s failed: %s", cfg.name, exc)
        return {"name": cfg.name, "description": cfg.description, "dir": str(out / cfg.name),
                "seconds": round(time.perf_counter() - s0, 1), "step_seconds": {}, "queries": None,
                "rows": [], "final_step": None, "error": str(exc)}
    return {
        "name": cfg.name,
        "description": cfg.description,
        "dir": str(out / cfg.name),
        "seconds": round(sum(o.seconds for o in outcomes), 1),
        "step_seconds": {o.id: round(o.seconds, 1) for o in outcomes},
        "skipped_steps": [o.id for o in outcomes if o.skipped],
        "queries": study_ledger(out / cfg.name),
        "rows": [{**row, "ours": _fmt_ours(_row_value(outcomes, str(row.get("ours", ""))), row)}
                 for row in cfg.paper.get("rows", [])],
        "final_step": str(outcomes[-1].out),
    }


def markdown(summary: dict[str, Any]) -> str:
    """The papers' results beside ours as one Markdown table (what ``docs/`` and the README quote)."""
    lines = [f"Scale `{summary['scale']}`: {summary.get('compute_seconds')} s of study time "
             f"(table written with {summary.get('threads')} torch threads at commit "
             f"`{str(summary.get('git_commit'))[:10]}`, stealkit {summary.get('stealkit_version')}; each step's own "
             f"commit is in its `config.json`); failed studies: {summary.get('failed') or 'none'}.",
             "", "| study | result | paper | ours | settings | study time (s) |", "| --- | --- | --- | --- | --- | --- |"]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            v = f"{v:.3g}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    for st in summary["studies"]:
        if st.get("error"):
            lines.append(f"| {st['name']} | failed: {cell(st['error'])} | | | | {st['seconds']} |")
        for row in st["rows"]:
            lines.append(f"| {st['name']} | {cell(row.get('result'))} | {cell(row.get('paper'))} | "
                         f"{cell(row.get('ours'))} | {cell(row.get('settings', ''))} | {st['seconds']} |")
    return "\n".join(lines) + "\n"


def _row_value(outcomes: list[Any], path: str) -> Any:
    """``final.PATH`` reads the last step's summary; ``STEP:PATH`` the summary of step ``STEP``."""
    step, colon, rest = path.partition(":")
    if colon and "." not in step:
        by_id = {o.id: o.summary for o in outcomes}
        return lookup(by_id[step], rest) if step in by_id else None
    return lookup(outcomes[-1].summary, path)


def _fmt_ours(value: Any, row: dict[str, Any]) -> Any:
    if isinstance(value, float) and row.get("percent", True) and 0 <= value <= 1:
        return f"{100 * value:.1f}%"
    return value


def render(summary: dict[str, Any], configs: list[ExperimentConfig]) -> str:
    from stealkit.fmt import queries
    from stealkit.report.builders import build_sections
    from stealkit.report.html import Section, fmt, markup, render_report

    top_rows = []
    sections: list[Section] = []
    for study in summary["studies"]:
        for row in study["rows"]:
            top_rows.append({"study": study["name"], "result": row.get("result"), "paper": row.get("paper"),
                             "ours": row.get("ours"), "settings": row.get("settings", "")})
        head = Section(
            study["name"],
            paragraphs=[study["description"] or "",
                        markup("<b>Failed:</b> {}", study["error"]) if study.get("error") else
                        markup("Study time {} s (steps: {}); queries {}; run directory <code>{}</code>.",
                               fmt(study["seconds"]), fmt(study["step_seconds"]) or "none run",
                               queries(study["queries"]) if study["queries"] else "none", study["dir"])],
            tables=[("The paper beside ours", [{k: r.get(k) for k in ("result", "paper", "ours", "settings")}
                                                for r in study["rows"]])] if study["rows"] else [],
        )
        sections.append(head)
        if not study.get("final_step"):
            continue
        try:
            for sec in build_sections(RunDir(study["final_step"])):
                sec.title = f"{study['name']}: {sec.title}"
                sections.append(sec)
        except Exception as exc:  # a study's own report must not break the combined one
            log.warning("could not build the sections of %s: %s", study["name"], exc)
    overview = Section("Overview", paragraphs=[markup(
        "Scale <b>{}</b>: the studies' own times add up to {} s; this invocation took {} s of wall time with {} "
        "studies at a time (steps finished by an earlier invocation keep their own time). A study's time includes "
        "training any victim it needed that was not cached yet, and the start-up of its commands. Failed "
        "studies: {}. Commit <code>{}</code>, torch {}, {} intra-op thread(s) per process, {} cores, load average "
        "{} at the start.",
        summary["scale"], summary.get("compute_seconds"), summary["wall_seconds"], summary.get("jobs", 1),
        summary.get("failed") or "none", summary.get("git_commit"), summary.get("torch"), summary.get("threads"),
        summary.get("cpus"), fmt(summary.get("load_average")))],
        tables=[("Every paper result beside ours", top_rows)])
    headline = {"studies": len(summary["studies"]), "compute_seconds": summary.get("compute_seconds"),
                "failed": len(summary.get("failed", [])),
                "scale": summary["scale"]}
    return render_report("stealkit reproduce", headline, [overview, *sections])
