"""``stealkit audit``: how much does an API leak to model extraction? One command, one report (issue 39).

The audit runs ``stealkit extract surrogate``'s default recipe (:func:`~stealkit.commands.extract_surrogate.
surrogate_config` of :func:`~stealkit.commands.extract_surrogate.command_params`, DFME appendix A with the
``auto`` preset) at a ladder of query budgets, once per answer kind the API gives or could give (labels, top-k,
probabilities) and per attacker: one with data like the victim's (the attacker split, or ``--pool``) and one with
only unrelated natural data (``--unrelated``, by default crops of natural photographs). Its headline is the
fidelity (agreement with the victim on the test split) against queries and Q90/Q95, the fewest measured queries
that reached 90 % / 95 % fidelity.

Every part (one extraction at one budget) is planned before any query: the plan's total never exceeds
``--max-queries``, and each part's oracle is metered to its own budget, so the ledger enforces it. Each part
writes ``parts/<id>.json`` atomically when it finishes: an interrupted audit run again with the same ``--out``
and plan skips the finished parts and pays for no query twice. Every query count comes from an oracle's ledger.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stealkit.commands.common import device_option, parse_int_list, victim_option
from stealkit.errors import InputError

if TYPE_CHECKING:
    from stealkit.report.html import Section
    from stealkit.rundir import RunDir

ANSWERS = ("label", "topk", "probs")
#: the default ladder of query budgets of each (answer kind, attacker) cell, and the ``--quick`` one
LADDER = (250, 500, 1000, 2000, 4000)
QUICK_LADDER = (50, 100, 200)
#: the default cap on the whole audit's queries: the default ladder for 3 answer kinds x 2 attackers (46,500),
#: the transfer attack (1,000), HopSkipJump with and without the stolen copy (20,020) and the data-free attacker
#: (20,000) come to 87,520
DEFAULT_MAX_QUERIES = 100_000
#: (transfer images, decision images, decision queries per image, data-free budget cap): the default and --quick
DEFAULT_EXTRAS = (500, 10, 1000, 20_000)
QUICK_EXTRAS = (100, 5, 200, 2000)
#: the data-free part is left out when the plan leaves it fewer queries than this
DATAFREE_MIN = 500
#: the answers the data-free attacker gets (the most restrictive API: top-1 labels)
DATAFREE_ANSWERS = "label"
#: the data-free method of the default recipe (stealkit.extract.datafree.recipes)
DATAFREE_METHOD = "codfe"
#: the unrelated natural data of the second attacker (:mod:`stealkit.data.query_sources`)
DEFAULT_UNRELATED = "patches"
THRESHOLDS = (0.90, 0.95)
#: fidelities are float32 means: 405 of 450 agreeing reads 0.89999998, which reached 90 %
TOLERANCE = 1e-6
#: rough seconds per student optimiser step (conv2, batch 64, one shared CPU thread), per query, per part, and
#: FixMatch's extra (it also trains on the unqueried pool), for the plan's estimate (measured on digits, --quick)
STEP_SECONDS = 0.01
QUERY_SECONDS = 0.0002
PART_SECONDS = 2.0
FIXMATCH_SECONDS = 5.0
#: rough seconds per decision-attack query, per transfer image, per data-free query (digits, one CPU thread)
DECISION_QUERY_SECONDS = 0.0015
TRANSFER_IMAGE_SECONDS = 0.01
DATAFREE_QUERY_SECONDS = 0.01


@dataclass(frozen=True)
class Part:
    """One part of the audit, through its own oracle metered to ``budget`` queries. ``kind``:

    - ``extract``: the default surrogate recipe at ``budget`` queries of ``answers`` answers, by the attacker
      ``attacker`` querying images of ``pool`` (through the output defence ``defence``, if any);
    - ``datafree``: the default data-free recipe (``stealkit extract codfe``) at ``budget`` ``answers`` queries;
    - ``transfer``: ``stealkit attack pgd`` from the best stolen copy at the paper's eps on ``n`` test images;
    - ``decision``: ``stealkit attack hopskipjump`` on ``n`` test images at ``per_image`` queries each, with the
      best stolen copy as its substitute (``substitute``) or without it.
    """

    answers: str
    attacker: str
    pool: str
    budget: int
    estimate_s: float = 0.0
    defence: str = ""  # an output defence the victim wears (a spec of stealkit.serve.defences), "" for none
    kind: str = "extract"
    n: int = 0
    per_image: int = 0
    substitute: bool = False

    @property
    def id(self) -> str:
        if self.kind == "datafree":
            return f"datafree-{self.answers}-{self.budget}"
        if self.kind == "transfer":
            return f"transfer-pgd-{self.n}"
        if self.kind == "decision":
            return f"hopskipjump-{'with' if self.substitute else 'without'}-copy-{self.n}x{self.per_image}"
        worn = "+" + "".join(c if c.isalnum() or c == "." else "_" for c in self.defence) if self.defence else ""
        return f"extract-{self.answers}{worn}-{self.attacker}-{self.budget}"


@dataclass(frozen=True)
class Extras:
    """The sizes of the parts beyond the extraction ladder (0 leaves a part out). ``datafree_budget`` is a cap:
    the data-free part gets what the plan leaves under ``--max-queries``, up to it, and is left out below
    :data:`DATAFREE_MIN`."""

    transfer_images: int = 0
    decision_images: int = 0
    decision_queries: int = 0
    datafree_budget: int = 0

    @classmethod
    def default(cls, quick: bool) -> Extras:
        return cls(*QUICK_EXTRAS) if quick else cls(*DEFAULT_EXTRAS)


#: called after each part with the part and its result (a hook: a test stops the audit here)
PartHook = Callable[[Part, dict[str, Any]], None]


def parse_answers(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [k for k in kinds if k not in ANSWERS]
    if bad or not kinds:
        raise InputError(f"--answers takes a comma-separated list of {', '.join(ANSWERS)}; got {text!r}")
    return kinds


def recipe_args(budget: int, answers: str, pool: str, seed: int, extra: Sequence[str]) -> list[str]:
    """The ``stealkit extract surrogate`` arguments of one part (the command's defaults for all others)."""
    return ["--budget", str(budget), "--mode", answers, "--pool", pool, "--seed", str(seed), *extra]


def estimate_seconds(budget: int, answers: str, num_classes: int, extra: Sequence[str]) -> float:
    """A rough time for one part: the recipe's student optimiser steps at ``STEP_SECONDS``, the queries, a
    fixed cost per part and FixMatch's extra."""
    from stealkit.commands.extract_surrogate import command_params, surrogate_config

    params = command_params(*recipe_args(budget, answers, "pool", 0, extra))
    _, config = surrogate_config(params, budget, num_classes)
    steps = config.student_epochs(budget, budget) * math.ceil(budget / config.batch_size)
    fixmatch = FIXMATCH_SECONDS if config.ssl != "none" else 0.0
    return PART_SECONDS + fixmatch + steps * STEP_SECONDS + budget * QUERY_SECONDS


def make_plan(answers: Sequence[str], attackers: dict[str, str], ladder: Sequence[int], max_queries: int, *,
              num_classes: int, extra: Sequence[str], defences: Sequence[str] = (),
              extras: Extras = Extras(), short_defences: Sequence[str] = ()) -> tuple[list[Part], list[str]]:
    """The parts, in the order they run, and notes.

    The extraction ladder first (cheapest rung of every cell first, so a stopped audit has a whole first row; a
    cell is an answer kind and an attacker, or a defence: probabilities through it, the attacker with data like
    the victim's), then the transfer attack and the decision attack without and with the stolen copy, then the
    data-free attacker. To fit ``max_queries``, rungs are dropped from the top of the ladder (down to one), then
    the decision and the transfer parts; the data-free part gets what is left, up to its cap.
    ``short_defences`` (the default defence set) are defence cells on two rungs of the ladder
    (:func:`~stealkit.commands.audit_defences.defence_rungs`)."""
    from stealkit.commands.audit_defences import defence_rungs

    rungs = sorted(set(ladder))
    notes = []
    like = next(iter(attackers.items()))
    cell_list = [(a, name, pool, "") for a in answers for name, pool in attackers.items()]
    cell_list += [("probs", like[0], like[1], d) for d in [*defences, *short_defences]]
    cells = len(cell_list)

    def cell_rungs(defence: str) -> list[int]:
        return defence_rungs(rungs) if defence in short_defences else rungs

    attacks: list[Part] = []
    if extras.transfer_images:
        n = extras.transfer_images
        attacks.append(Part("label", "copy", "", 2 * n, round(PART_SECONDS + n * TRANSFER_IMAGE_SECONDS, 1),
                            kind="transfer", n=n))
    if extras.decision_images and extras.decision_queries:
        n, q = extras.decision_images, extras.decision_queries
        for sub in (False, True):
            attacks.append(Part("label", "copy" if sub else "none", "", n * (q + 1),
                                round(PART_SECONDS + n * q * DECISION_QUERY_SECONDS, 1), kind="decision", n=n,
                                per_image=q, substitute=sub))

    def spend() -> int:
        return sum(sum(cell_rungs(c[3])) for c in cell_list) + sum(p.budget for p in attacks)

    while len(rungs) > 1 and spend() > max_queries:
        notes.append(f"rung {rungs[-1]:,} dropped: the plan would spend {spend():,} queries, more than "
                     f"--max-queries {max_queries:,}")
        rungs.pop()
    for kind in ("decision", "transfer"):
        if spend() > max_queries and any(p.kind == kind for p in attacks):
            notes.append(f"the {kind} attack left out: the plan would spend {spend():,} queries, more than "
                         f"--max-queries {max_queries:,}")
            attacks = [p for p in attacks if p.kind != kind]
    if spend() > max_queries:
        raise InputError(f"--max-queries {max_queries:,} is too small for any part: the smallest rung "
                         f"({min(ladder):,} queries) for {cells} cells needs {cells * min(ladder):,}; raise "
                         "--max-queries or lower --budgets")
    parts = [Part(a, name, pool, b, round(estimate_seconds(b, a, num_classes, extra), 1), d)
             for b in rungs for a, name, pool, d in cell_list if b in cell_rungs(d)]
    if short_defences and defence_rungs(rungs) != rungs:
        notes.append(f"the default defences ({', '.join(short_defences)}) run on two rungs of the ladder, its "
                     f"lowest and its middle ({', '.join(f'{b:,}' for b in defence_rungs(rungs))}): probability "
                     "parts are the audit's slowest; a Q90 above the higher reads 'not reached'")
    parts += attacks
    if extras.datafree_budget:
        budget = min(extras.datafree_budget, max_queries - spend())
        if budget >= DATAFREE_MIN:
            parts.append(Part(DATAFREE_ANSWERS, "data-free", "", budget,
                              round(PART_SECONDS + budget * DATAFREE_QUERY_SECONDS, 1), kind="datafree"))
        else:
            notes.append(f"the data-free attacker left out: the plan leaves it {max(budget, 0):,} queries under "
                         f"--max-queries {max_queries:,}, fewer than {DATAFREE_MIN:,}")
    return parts, notes


def format_plan(parts: Sequence[Part], max_queries: int, done: set[str]) -> str:
    lines = [f"{'part':<42} {'queries':>8} {'est. time':>10}"]
    for p in parts:
        mark = "  (done: resumed)" if p.id in done else ""
        lines.append(f"{p.id:<42} {p.budget:>8,} {p.estimate_s:>9.0f}s{mark}")
    total = sum(p.budget for p in parts)
    est = sum(p.estimate_s for p in parts)
    lines.append(f"{'total':<42} {total:>8,} {est:>9.0f}s  (of --max-queries {max_queries:,}; "
                 "times are rough, one CPU thread)")
    return "\n".join(lines)


def run_part(part: Part, *, parts_dir: Path, copy: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run one part into ``parts_dir/<id>/`` (the run directory the separate command writes); its result."""
    import shutil

    out = parts_dir / part.id
    started = time.perf_counter()
    if part.kind == "datafree":  # a stopped data-free part resumes from its own checkpoint: no query paid twice
        result = run_datafree_part(part, out, **kwargs)
    else:
        if out.exists():  # a part stopped midway runs again from its start (its queries were spent)
            shutil.rmtree(out)
        if part.kind == "extract":
            result = run_extract_part(part, out, **kwargs)
        elif copy is None:
            raise InputError(f"{part.id}: no stolen copy to attack from (no extraction part finished)")
        else:
            result = run_attack_part(part, out, copy, **kwargs)
    return {"part": asdict(part), "id": part.id, **result, "elapsed_s": round(time.perf_counter() - started, 2)}


def run_extract_part(part: Part, out: Path, *, victim: str, key: str | None, top_k: int, dataset: str | None,
                     data_dir: str | None, device: str, seed: int, extra: Sequence[str]) -> dict[str, Any]:
    """One extraction through a fresh oracle metered to the part's budget: the command's own pieces, in the
    command's order (:func:`stealkit.commands.extract_surrogate.surrogate_cmd`); the stolen copy is saved in
    ``out`` as that command saves it (``out/student``, what ``stealkit attack --substitute out`` reads)."""
    from stealkit.commands.common import parse_kv
    from stealkit.commands.extract_surrogate import command_params, surrogate_config, surrogate_pool
    from stealkit.extract.common import (
        make_evaluator,
        open_victim,
        save_extraction,
        student_factory,
        victim_splits,
    )
    from stealkit.extract.registry import METHODS
    from stealkit.extract.surrogate_data.surrogate import FLIP_INVARIANT
    from stealkit.rundir import RunDir
    from stealkit.serve.defences import parse_defence

    params = command_params(*recipe_args(part.budget, part.answers, part.pool, seed, extra))
    worn = (parse_defence(part.defence),) if part.defence else ()
    v = open_victim(victim, mode=part.answers, budget=part.budget, top_k=top_k, key=key, dataset=dataset,
                    device=device, seed=seed, defences=worn)
    try:
        resolved, config = surrogate_config(params, part.budget, v.num_classes, flip=v.dataset in FLIP_INVARIANT)
        splits = victim_splits(v, data_dir)
        x_pool, labels = surrogate_pool(part.pool, v, config, cap=part.budget, seed=seed, data_dir=data_dir)
        kwargs = parse_kv(tuple(params["student_args"]))
        result = METHODS["surrogate"].run(
            v.oracle, x_pool, make_student=student_factory(params["student"], v, seed, **kwargs), config=config,
            evaluator=make_evaluator(v, splits.test.x, splits.test.y, device), pool_labels=labels, device=device,
            checkpoint_dir=None, resume=False)
    finally:
        _close(v)
    queries = v.oracle.ledger.as_dict()
    cfg = {"victim": victim, "mode": part.answers, "budget": part.budget, "pool": part.pool,
           "student": params["student"], "preset_resolved": resolved, "student_kwargs": kwargs,
           "dataset": v.dataset, "defence": part.defence or None, "audit_part": part.id}
    run = RunDir(out).create(command="extract surrogate", seed=seed, config=cfg)
    save_extraction(run, result, v, student_arch=params["student"], student_kwargs=kwargs, seed=seed, config=cfg,
                    report=False)  # the audit's report covers it (a plot per part would cost ~0.5 s each)
    served = None
    if part.defence and v.model is not None:  # the honest users' cost: top-1 accuracy of what is served (no query)
        from stealkit.studies.defences import served_accuracy

        served = served_accuracy(v.model, parse_defence(part.defence), splits.test.x, splits.test.y)  # fresh noise
    return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": result.accuracy,
            "fidelity": result.fidelity, "victim_accuracy": result.victim_accuracy, "served_accuracy": served,
            "preset_resolved": resolved}


def run_datafree_part(part: Part, out: Path, *, victim: str, key: str | None, top_k: int, dataset: str | None,
                      data_dir: str | None, device: str, seed: int, extra: Sequence[str]) -> dict[str, Any]:
    """``stealkit extract codfe --mode label --budget B`` with the default recipe, through its own function
    (:func:`stealkit.commands.extract_datafree.run_method`); a stopped part resumes from its checkpoint."""
    from stealkit.commands.extract_datafree import run_method
    from stealkit.extract.datafree.recipes import DEFAULT

    resume = (out / "checkpoint" / "checkpoint.json").exists()
    with _quiet():
        result = run_method(DATAFREE_METHOD, victim=victim, key=key, mode=part.answers, temperature=1.0,
                            top_k=top_k, budget=part.budget, dataset=dataset, data_dir=data_dir, student="conv2",
                            student_args=(), batch_size=None, ngf=None, settings={}, eval_every=part.budget,
                            eval_at="", checkpoint_every=100, max_iterations=None, resume=resume, seed=seed,
                            out=str(out), device=device, preset=DEFAULT)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {"queries": dict(result.queries), "total_queries": sum(result.queries.values()),
            "accuracy": result.accuracy, "fidelity": result.fidelity, "victim_accuracy": result.victim_accuracy,
            "served_accuracy": None, "preset_resolved": f"{DATAFREE_METHOD} {DEFAULT}",
            "resumed": resume, "summary_victim_queries": summary.get("queries")}


#: CoDFe's transfer evaluation (DaST's public script, :class:`stealkit.studies.codfe_transfer.StudyConfig`)
def paper_pgd() -> dict[str, float]:
    """The paper's PGD: Linf eps, steps and step size of the CoDFe transfer study (untargeted)."""
    from stealkit.studies.codfe_transfer import StudyConfig

    cfg = StudyConfig().attack("pgd", targeted=False)
    return {"eps": cfg.eps, "steps": cfg.steps, "step": float(cfg.step or 0.0)}


def run_attack_part(part: Part, out: Path, copy: dict[str, Any], *, victim: str, key: str | None, top_k: int,
                    dataset: str | None, data_dir: str | None, device: str, seed: int,
                    extra: Sequence[str]) -> dict[str, Any]:
    """``stealkit attack pgd`` (transfer from the best stolen copy at the paper's eps) or ``stealkit attack
    hopskipjump`` (without or with the copy as its substitute), run as the commands themselves with ``--budget``
    the part's budget and ``--out`` the part's directory; the figures are read back from their summaries."""
    from stealkit.commands.attack import attack

    common = ["--victim", victim, "--n", str(part.n), "--budget", str(part.budget), "--seed", str(seed),
              "--out", str(out), "--device", device, *(["--key", key] if key else []),
              *(["--dataset", dataset] if dataset else []), *(["--data-dir", data_dir] if data_dir else [])]
    if part.kind == "transfer":
        pgd = paper_pgd()
        args = ["pgd", "--substitute", copy["dir"], "--eps", str(pgd["eps"]), "--steps", str(pgd["steps"]),
                "--step", str(pgd["step"]), *common]
    else:
        args = ["hopskipjump", "--max-queries", str(part.per_image), *common,
                *(["--substitute", copy["dir"]] if part.substitute else [])]
    with _quiet():
        attack.main(args=args, prog_name="stealkit attack", standalone_mode=False)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    queries = {k: int(v) for k, v in summary["victim_queries"].items()}
    result: dict[str, Any] = {"queries": queries, "total_queries": sum(queries.values()), "command":
                              "stealkit attack " + " ".join(args), "asr": summary.get("asr"),
                              "attempts": summary.get("attempts"), "successes": summary.get("successes"),
                              "copy": copy["id"], "copy_fidelity": copy.get("fidelity")}
    if part.kind == "transfer":
        result |= {"eps": paper_pgd()["eps"], "victim_accuracy": summary.get("victim_accuracy"),
                   "substitute_agreement": summary.get("substitute_agreement")}
    else:
        result |= {"median_l2": summary.get("median_norm_successful"),
                   "median_queries_per_image": summary.get("median_queries_per_image")}
    return result


def best_copy(results: Sequence[dict[str, Any]], parts_dir: Path) -> dict[str, Any] | None:
    """The stolen copy the attacks start from: the undefended extraction with the highest fidelity (the fewest
    queries on a tie); without fidelities (a remote victim), the largest budget of the richest answers."""
    mine = [r for r in results if r["part"].get("kind", "extract") == "extract" and not r["part"].get("defence")]
    if not mine:
        return None
    rank = {a: i for i, a in enumerate(ANSWERS)}
    if all(r.get("fidelity") is not None for r in mine):
        best = max(mine, key=lambda r: (r["fidelity"], -r["total_queries"]))
    else:
        best = max(mine, key=lambda r: (r["part"]["attacker"] == "like", r["part"]["budget"],
                                        rank.get(r["part"]["answers"], -1)))
    return {"id": best["id"], "dir": str(parts_dir / best["id"]), "fidelity": best.get("fidelity"),
            "queries": best["total_queries"]}


def _close(v: Any) -> None:
    close = getattr(v.oracle, "close", None)
    if close is not None:
        close()


def _quiet() -> Any:
    """The separate commands' own terminal lines are kept out of the audit's (one progress line per part)."""
    import contextlib
    import io

    return contextlib.redirect_stdout(io.StringIO())


def q_at(points: Sequence[dict[str, Any]], threshold: float) -> int | None:
    """The fewest measured queries whose copy reached ``threshold`` fidelity (``None``: not reached)."""
    for p in sorted(points, key=lambda r: r["part"]["budget"]):
        if p.get("fidelity") is not None and p["fidelity"] >= threshold - TOLERANCE:
            return int(p["total_queries"])
    return None


def extractions(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results that are a stolen copy (the extraction ladder and the data-free attacker)."""
    return [r for r in results if r["part"].get("kind", "extract") in ("extract", "datafree")]


def enables(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the stolen copy enables: one row per attack part (transfer success; HopSkipJump's median L2 without
    and with the copy at the same per-image budget)."""
    rows = []
    for r in results:
        p = r["part"]
        if p.get("kind") == "transfer":
            rows.append({"attack": f"PGD transfer, Linf eps {r['eps']:g}", "from copy": r["copy"],
                         "copy fidelity": r.get("copy_fidelity"), "images": p["n"], "attempted": r["attempts"],
                         "success": r["asr"], "median L2": None, "queries per image": 1,
                         "queries": r["total_queries"]})
        elif p.get("kind") == "decision":
            rows.append({"attack": "HopSkipJump " + ("with the copy" if p["substitute"] else "without a copy"),
                         "from copy": r["copy"] if p["substitute"] else "–",
                         "copy fidelity": r.get("copy_fidelity") if p["substitute"] else None, "images": p["n"],
                         "attempted": r["attempts"], "success": r["asr"], "median L2": r.get("median_l2"),
                         "queries per image": p["per_image"], "queries": r["total_queries"]})
    return rows


def headline(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (answer kind, attacker): fidelity at each rung, Q90 and Q95 (or "not reached within N")."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in extractions(results):
        p = r["part"]
        cells.setdefault((p["answers"], p["attacker"], p.get("defence", "")), []).append(r)
    rows = []
    for (answers, attacker, defence), points in cells.items():
        points = sorted(points, key=lambda r: r["part"]["budget"])
        row: dict[str, Any] = {"answers": answers, "attacker": attacker}
        if any(k[2] for k in cells):
            row["defence"] = defence or "none"
            row["served accuracy"] = points[0].get("served_accuracy") if defence else points[0].get("victim_accuracy")
        for p in points:
            row[f"fidelity @{p['part']['budget']}"] = p["fidelity"]
        top = max(p["total_queries"] for p in points)
        for t in THRESHOLDS:
            q = q_at(points, t)
            row[f"Q{round(t * 100)}"] = q if q is not None else f"not reached within {top:,}"
        rows.append(row)
    rungs = sorted({int(k.split("@")[1]) for r in rows for k in r if k.startswith("fidelity @")})
    order = [k for r in rows for k in r if not k.startswith("fidelity @") and not k.startswith("Q")]
    order = [*dict.fromkeys(order), *(f"fidelity @{b}" for b in rungs), *(f"Q{round(t * 100)}" for t in THRESHOLDS)]
    return [{k: r[k] for k in order if k in r} for r in rows]


def parse_fail_if(text: str) -> tuple[str | None, int, int]:
    """``"q90<1000"`` or ``"label:q95<5000"`` -> (answer kind or ``None`` for every kind, 90, 1000)."""
    import re

    m = re.fullmatch(r"(?:(label|topk|probs):)?q(90|95)<(\d+)", text.strip().lower().replace(" ", ""))
    if m is None:
        raise InputError(f"--fail-if takes q90<N or q95<N, optionally after an answer kind (label:q90<N); got {text!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def failed_gates(rows: Sequence[dict[str, Any]], gates: Sequence[str]) -> list[str]:
    """The gates an audit fails: an undefended cell of the attacker with data like the victim's whose Q90 (Q95)
    was reached with fewer queries than the gate's N."""
    out = []
    for gate in gates:
        answers, level, n = parse_fail_if(gate)
        for r in rows:
            q = r.get(f"Q{level}")
            if (r["attacker"] == "like" and r.get("defence", "none") == "none" and isinstance(q, int) and q < n
                    and answers in (None, r["answers"])):
                out.append(f"--fail-if {gate}: {r['answers']} answers reach {level} % fidelity with {q:,} queries")
    return out


def load_done(parts_dir: Path, parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    done = {}
    for p in parts:
        path = parts_dir / f"{p.id}.json"
        if path.exists():
            done[p.id] = json.loads(path.read_text(encoding="utf-8"))
    return done


def run_audit(parts: Sequence[Part], run: RunDir, *, on_part: PartHook | None = None, echo: Callable[[str], None],
              **kwargs: Any) -> list[dict[str, Any]]:
    """Run the parts not yet checkpointed in ``run``/parts, each one written atomically when it finishes."""
    from stealkit.fsutil import atomic_write_json

    parts_dir = run.path / "parts"
    done = load_done(parts_dir, parts)
    results = []
    for i, part in enumerate(parts, 1):
        if part.id in done:
            results.append(done[part.id])
            continue
        copy = best_copy(results, parts_dir) if part.kind in ("transfer", "decision") else None
        from stealkit.commands.audit_defences import PradaObserver
        from stealkit.oracle.observe import observing

        with observing(PradaObserver()) as watch:  # PRADA on the part's own queries, in order: none re-sent
            result = run_part(part, parts_dir=parts_dir, copy=copy, **kwargs)
        result["prada"] = watch.as_dict()
        if result.get("resumed"):
            result["prada"]["note"] = "resumed from its checkpoint: PRADA saw the queries after it only"
        atomic_write_json(parts_dir / f"{part.id}.json", result)
        run.append_record(result)
        echo(f"[{i}/{len(parts)}] {part.id}: {progress(result)}, {result['total_queries']:,} queries, "
             f"{result['elapsed_s']:.0f}s")
        results.append(result)
        if on_part is not None:
            on_part(part, result)
    return results


def progress(result: dict[str, Any]) -> str:
    """A finished part's figures in a few words (its progress line)."""
    kind = result["part"].get("kind", "extract")
    if kind == "transfer":
        return f"transfer success {_pct(result['asr'])} ({result['successes']}/{result['attempts']})"
    if kind == "decision":
        l2 = "–" if result.get("median_l2") is None else f"{result['median_l2']:.3f}"
        return f"median L2 {l2}, success {_pct(result['asr'])}"
    return f"fidelity {_pct(result['fidelity'])}, accuracy {_pct(result['accuracy'])}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [[c for c in cols]] + [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def plain_words(rows: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]]) -> list[str]:
    """The report's opening sentences: the best copy per answer kind, and Q90 against the probabilities'."""
    words = {"label": "top-1 labels", "topk": "top-k answers", "probs": "probabilities"}
    out = []
    stolen = extractions(results)
    for answers in dict.fromkeys(r["part"]["answers"] for r in stolen):
        mine = [r for r in stolen if r["part"]["answers"] == answers and r["fidelity"] is not None]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["fidelity"], -r["total_queries"]))
        p = best["part"]
        data = {"like": f"data like yours ({p['pool']})", "unrelated": f"only unrelated data ({p['pool']})",
                "data-free": "no data at all (a generator makes the queries)"}.get(p["attacker"], p["pool"])
        out.append(f"With {best['total_queries']:,} queries answered with {words[answers]} and {data}, an "
                   f"attacker gets a copy that agrees with your model on {100 * best['fidelity']:.1f} % of test "
                   "inputs.")
    q = {(r["answers"], r["attacker"]): r["Q90"] for r in rows if r.get("defence", "none") == "none"}
    if ("probs", "like") in q and ("label", "like") in q:
        out.append(f"With data like yours, Q90 (queries to a 90 % copy) is {_words(q[('probs', 'like')])} with "
                   f"probabilities and {_words(q[('label', 'like')])} with top-1 labels only.")
    attacks = {r["part"]["kind"] + ("+copy" if r["part"].get("substitute") else ""): r for r in results
               if r["part"].get("kind") in ("transfer", "decision")}
    if "transfer" in attacks:
        t = attacks["transfer"]
        fid = "" if t.get("copy_fidelity") is None else f", {100 * t['copy_fidelity']:.1f} % fidelity"
        out.append(f"From the best stolen copy ({t['copy']}{fid}), PGD at the paper's eps {t['eps']:g} changes your "
                   f"model's answer on {_pct(t['asr'])} of the {t['attempts']:,} test images it gets right, with "
                   "one query each.")
    if "decision" in attacks and "decision+copy" in attacks:
        a, b = attacks["decision"], attacks["decision+copy"]
        out.append(f"At {a['part']['per_image']:,} queries per image, HopSkipJump's median L2 perturbation is "
                   f"{_num(a.get('median_l2'))} without a stolen copy and {_num(b.get('median_l2'))} with it.")
    for r in rows:
        if r.get("defence", "none") != "none":
            out.append(f"Serving probabilities through the defence {r['defence']} gives honest users "
                       f"{_pct(r['served accuracy'])} accuracy and puts Q90 at {_words(r['Q90'])}.")
    return out


def _num(x: float | None) -> str:
    return "– (no success)" if x is None else f"{x:.3f}"


def _words(q: Any) -> str:
    return f"{q:,}" if isinstance(q, int) else str(q)


def summarise(parts: Sequence[Part], results: Sequence[dict[str, Any]], max_queries: int,
              notes: Sequence[str]) -> dict[str, Any]:
    rows = headline(results)
    spent = sum(r["total_queries"] for r in results)
    assert spent <= max_queries, (spent, max_queries)  # the plan fits, and each part's oracle is metered
    victim_accuracy = next((r["victim_accuracy"] for r in results if r.get("victim_accuracy") is not None), None)
    out: dict[str, Any] = {"method": "audit", "victim_accuracy": victim_accuracy, "queries": spent,
                           "max_queries": max_queries, "planned_queries": sum(p.budget for p in parts),
                           "headline": rows, "enables": enables(results), "parts": list(results),
                           "sentences": plain_words(rows, results)}
    stolen = extractions(results)
    if notes or any(r["fidelity"] is None for r in stolen):
        out["notes"] = [*notes] + ([] if all(r["fidelity"] is not None for r in stolen) else [
            "fidelity needs the victim's own labels of the test split, which a remote victim does not give: "
            "Q90/Q95 are not measured"])
    return out


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    """The audit's report: the plain-words headline, fidelity against queries per answer kind and attacker,
    the Q90/Q95 table and every part (kind ``audit`` in :data:`stealkit.report.kinds.BUILDERS`)."""
    from stealkit.report.html import Figure, Section
    from stealkit.report.plots import line_plot

    results = summary.get("parts") or []
    rows = summary.get("headline") or []
    out = [Section("In plain words", paragraphs=[str(s) for s in summary.get("sentences") or []]),
           Section("Extraction risk: fidelity against queries, Q90 and Q95", paragraphs=[
               "Fidelity: agreement of the stolen copy with the victim on the test split. Q90/Q95: the fewest "
               "measured queries whose copy reached 90 %/95 % fidelity (the audit's ladder of budgets; each "
               "point is one run of the default `stealkit extract surrogate` recipe)."], tables=[("", rows)])]
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in sorted(extractions(results), key=lambda r: r["part"]["budget"]):
        if r.get("fidelity") is None:
            continue
        xs, ys = series.setdefault(f"fidelity, {r['part']['answers']} {r['part']['attacker']}", ([], []))
        xs.append(r["total_queries"])
        ys.append(r["fidelity"])
    if series:
        uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="fidelity on the test split",
                        logx=True, hlines={"90 %": 0.9, "95 %": 0.95}, ylim=(0, 1.02))
        out[1].figures.append(Figure(uri, "Fidelity of the stolen copy against queries, per answer kind and "
                                          "attacker"))
    rec = summary.get("reconciliation")
    if rec and rec.get("server") is not None:
        out.append(Section("Queries reconciled with the server", paragraphs=[
            f"The server's count for this key over the audit (GET /v1/charges, queries used at the end less at "
            f"the start): {rec['server']}. The audit's ledgers: {rec['audit']}. "
            + ("Equal." if rec["equal"] else "Not equal: another client may share the key.")]))
    if summary.get("enables"):
        out.append(Section("What the stolen copy enables", paragraphs=[
            "Transfer: `stealkit attack pgd` crafts on the best stolen copy at the paper's eps (CoDFe's transfer "
            "evaluation: PGD, Linf, random start) and sends each example once; success is over the test images "
            "the victim classifies correctly. Decision-based: `stealkit attack hopskipjump` (tuned preset) on the "
            "same test images at the same per-image budget, without a substitute and with the stolen copy as its "
            "substitute (its start and gradient prior); median L2 over the successful images."],
            tables=[("", summary["enables"])]))
    from stealkit.commands.audit_defences import flagged_text, serving_sections

    table = [{"part": r["id"], "queries": r["total_queries"], "fidelity": r.get("fidelity"),
              "accuracy": r.get("accuracy"), "served accuracy": r.get("served_accuracy"),
              "PRADA flagged at": flagged_text(r.get("prada")),
              "recipe": r.get("preset_resolved") or r.get("command"), "seconds": r["elapsed_s"]} for r in results]
    out += serving_sections(summary)
    out.append(Section("Parts", tables=[("", table)]))
    return out


@click.command("audit")
@victim_option()
@click.option("--key", default=None, envvar="STEALKIT_API_KEY", help="API key for an HTTP victim.")
@click.option("--answers", default=",".join(ANSWERS), show_default=True,
              help="Answer kinds to audit (what the API gives, or could give): label, topk, probs.")
@click.option("--top-k", type=int, default=1, show_default=True, help="Classes a topk answer reveals.")
@click.option("--pool", default="pool", show_default=True,
              help="The data of the attacker with data like the victim's: a query source (pool: the attacker split).")
@click.option("--unrelated", default=DEFAULT_UNRELATED, show_default=True,
              help="The data of the attacker with only unrelated natural data: a query source (patches: crops of "
                   "natural photographs; or another data set).")
@click.option("--defence", "defences", multiple=True, metavar="SPEC",
              help="Also audit probabilities served through this output defence, side by side (repeat; the specs "
                   "of stealkit defences --defence and of a serve key's defences, e.g. round:decimals=1, topk:k=1, label, noise:sigma=0.05; a local "
                   "victim only). Without it a local victim's probabilities are audited through round:decimals=2 "
                   "and noise:sigma=0.05 (on the lowest and middle rungs); --defence none turns them off.")
@click.option("--fail-if", "fail_if", multiple=True, metavar="q90<N",
              help="Exit 1 when an attacker with data like the victim's reaches 90 % (q90) or 95 % (q95) fidelity "
                   "with fewer than N queries (repeat; label:q90<N checks one answer kind): a deployment gate.")
@click.option("--budgets", default=None, help="The ladder of query budgets per cell (default "
              f"{','.join(map(str, LADDER))}; --quick {','.join(map(str, QUICK_LADDER))}).")
@click.option("--max-queries", type=int, default=DEFAULT_MAX_QUERIES, show_default=True,
              help="Cap on the whole audit's queries; rungs are dropped from the top of the ladder to fit.")
@click.option("--transfer-images", type=int, default=None,
              help=f"Test images PGD attacks from the best stolen copy (default {DEFAULT_EXTRAS[0]}, --quick "
                   f"{QUICK_EXTRAS[0]}; 0 leaves the part out).")
@click.option("--decision-images", type=int, default=None,
              help=f"Test images HopSkipJump attacks, without and with the copy (default {DEFAULT_EXTRAS[1]}, "
                   f"--quick {QUICK_EXTRAS[1]}; 0 leaves the parts out).")
@click.option("--decision-queries", type=int, default=None,
              help=f"HopSkipJump's queries per image (default {DEFAULT_EXTRAS[2]}, --quick {QUICK_EXTRAS[2]}).")
@click.option("--datafree-budget", type=int, default=None,
              help=f"Cap on the data-free attacker's queries; it gets what the plan leaves, up to this (default "
                   f"{DEFAULT_EXTRAS[3]:,}, --quick {QUICK_EXTRAS[3]:,}; 0 leaves it out).")
@click.option("--plan", "plan_only", is_flag=True, help="Print the plan and stop (no query).")
@click.option("--quick", is_flag=True, help=f"A small ladder ({','.join(map(str, QUICK_LADDER))}).")
@click.option("--recipe", "recipe", multiple=True, metavar="ARG",
              help="Extra `stealkit extract surrogate` argument of every part (repeat; e.g. --recipe=--epochs=5).")
@click.option("--dataset", default=None, help="Data set of the victim's task (default: from its model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--out", required=True, type=click.Path(),
              help="Audit directory (run again with the same plan: it resumes).")
@device_option
def audit_cmd(victim: str, key: str | None, answers: str, top_k: int, pool: str, unrelated: str,
              defences: tuple[str, ...], fail_if: tuple[str, ...], budgets: str | None, max_queries: int,
              transfer_images: int | None, decision_images: int | None, decision_queries: int | None,
              datafree_budget: int | None, plan_only: bool, quick: bool, recipe: tuple[str, ...],
              dataset: str | None, data_dir: str | None, seed: int, out: str, device: str) -> None:
    """Audit a victim's exposure to model extraction: the default surrogate recipe at a ladder of budgets, per
    answer kind and attacker, and a data-free attacker; fidelity against queries and Q90/Q95; what the stolen
    copy enables (transfer PGD, HopSkipJump with and without it); one report. Prints the plan first."""
    sizes = {"transfer_images": transfer_images, "decision_images": decision_images,
             "decision_queries": decision_queries, "datafree_budget": datafree_budget}
    failed = run_audit_command(victim=victim, key=key, answers=answers, top_k=top_k, pool=pool,
                               unrelated=unrelated, defences=defences, fail_if=fail_if, budgets=budgets,
                               max_queries=max_queries, plan_only=plan_only, quick=quick, recipe=recipe,
                               dataset=dataset, data_dir=data_dir, seed=seed, out=out, device=device,
                               **{k: v for k, v in sizes.items() if v is not None})
    for line in failed:
        click.echo(line, err=True)
    if failed:
        click.get_current_context().exit(1)


def run_audit_command(*, victim: str, key: str | None = None, answers: str = ",".join(ANSWERS), top_k: int = 1,
                      pool: str = "pool", unrelated: str = DEFAULT_UNRELATED, defences: Sequence[str] = (),
                      fail_if: Sequence[str] = (), budgets: str | None = None,
                      max_queries: int = DEFAULT_MAX_QUERIES, plan_only: bool = False, quick: bool = False,
                      recipe: Sequence[str] = (), dataset: str | None = None, data_dir: str | None = None,
                      seed: int = 0, out: str, device: str = "cpu", on_part: PartHook | None = None,
                      **sizes: int) -> list[str]:
    """The command's body (``on_part``: a hook called after each part, e.g. to stop a test's audit; ``sizes``:
    fields of :class:`Extras` over the default, or ``--quick``, ones); returns the ``--fail-if`` gates the
    audit failed, one line each."""
    from stealkit.commands.extract_surrogate import command_params
    from stealkit.rundir import RunDir

    kinds = parse_answers(answers)
    for gate in fail_if:
        parse_fail_if(gate)
    if max_queries < 1:
        raise InputError(f"--max-queries must be a positive number of queries, got {max_queries}")
    ladder = parse_int_list(budgets) if budgets else (QUICK_LADDER if quick else LADDER)
    if min(ladder) < 1:
        raise InputError(f"--budgets must be positive query budgets, got {budgets}")
    extra = [a for r in recipe for a in r.split("=", 1)] if recipe else []
    for bad in ("--budget", "--mode", "--pool", "--seed", "--victim", "--out"):
        if bad in extra:
            raise InputError(f"--recipe {bad} is the audit's to set")
    command_params(*recipe_args(1, "label", "pool", seed, extra))  # refuse a bad recipe argument before any work
    from stealkit.commands.audit_defences import resolve_defences
    from stealkit.extract.common import is_url
    from stealkit.serve.defences import parse_defence

    defences, default_defences = resolve_defences(defences, remote=is_url(victim), answers=kinds)
    for spec in defences:
        parse_defence(spec)  # refuse a bad spec before any work
    if defences and is_url(victim):
        raise InputError("--defence audits a local victim; a remote victim's defences are its server's")
    import dataclasses

    bad_sizes = [k for k in sizes if k not in {f.name for f in dataclasses.fields(Extras)}]
    if bad_sizes:
        raise TypeError(f"unknown audit sizes {bad_sizes}")
    extras = dataclasses.replace(Extras.default(quick), **sizes)
    for name, value in dataclasses.asdict(extras).items():
        if value < 0:
            raise InputError(f"--{name.replace('_', '-')} must be 0 (leave the part out) or positive, got {value}")
    num_classes = _num_classes(victim, key, dataset)
    if is_url(victim):
        _check_answers(victim, key, dataset, kinds, top_k)
    attackers = {"like": pool, "unrelated": unrelated}
    parts, notes = make_plan(kinds, attackers, ladder, max_queries, num_classes=num_classes, extra=extra,
                             defences=list(dict.fromkeys(defences)), extras=extras,
                             short_defences=default_defences)
    run = RunDir(out)
    config = {"victim": victim, "answers": list(kinds), "top_k": top_k, "attackers": attackers,
              "defences": list(dict.fromkeys(defences)), "default_defences": default_defences,
              "ladder": sorted({p.budget for p in parts}), "max_queries": max_queries, "recipe": extra,
              "dataset": dataset, "parts": [p.id for p in parts]}
    done = _check_resume(run, config, seed)
    click.echo(format_plan(parts, max_queries, done))
    for n in notes:
        click.echo(f"note: {n}")
    if plan_only:
        return []
    run.create(command="audit", seed=seed, config=config)
    usage_path = run.path / "server_usage_before.json"
    if not usage_path.exists():  # the server's count when the audit first started (a resumed audit keeps it)
        from stealkit.fsutil import atomic_write_json

        before = server_usage(victim, key)
        if before is not None:
            atomic_write_json(usage_path, before)
    results = run_audit(parts, run, on_part=on_part, echo=lambda s: click.echo(s, err=True), victim=victim, key=key,
                        top_k=top_k, dataset=dataset, data_dir=data_dir, device=device, seed=seed, extra=extra)
    summary = summarise(parts, results, max_queries, notes)
    from stealkit.commands.audit_defences import add_serving, serving_costs

    add_serving(summary, serving_costs(victim=victim, answers=kinds, top_k=top_k,
                                       defences=[*defences, *default_defences], dataset=dataset,
                                       data_dir=data_dir, device=device), top_k)
    if usage_path.exists():
        spent: dict[str, int] = {}
        for r in results:
            for k, v in r["queries"].items():
                spent[k] = spent.get(k, 0) + int(v)
        summary["reconciliation"] = reconcile(json.loads(usage_path.read_text(encoding="utf-8")),
                                              server_usage(victim, key), spent)
    run.write_summary(summary)
    from stealkit.report.builders import write_report

    write_report(run)
    click.echo(format_table(summary["headline"]))
    if summary["enables"]:
        click.echo("")
        click.echo(format_table(summary["enables"]))
    if summary.get("serving"):
        click.echo("")
        click.echo(format_table(summary["serving"]))
    click.echo(f"queries {summary['queries']:,} of --max-queries {max_queries:,} (from the ledgers); "
               f"report: {run.report_path}")
    rec = summary.get("reconciliation")
    if rec and rec.get("server") is not None:
        click.echo(f"server's /v1/charges over the audit: {rec['server']}; the audit's ledgers: {rec['audit']}: "
                   + ("equal" if rec["equal"] else "NOT EQUAL"))
    return failed_gates(summary["headline"], fail_if)


def server_usage(victim: str, key: str | None) -> dict[str, int] | None:
    """The key's queries used as ``stealkit serve`` counts them (``GET /v1/charges``: ``queries_used``), or
    ``None`` for a victim that is not a stealkit server (a local model, an Open Inference Protocol endpoint)."""
    import httpx

    from stealkit.extract.common import is_url

    if not is_url(victim) or victim.startswith("v2+"):
        return None
    try:
        r = httpx.get(victim.rstrip("/") + "/v1/charges", params={"limit": 1},
                      headers={"authorization": f"Bearer {key}"} if key else {}, timeout=30)
    except httpx.HTTPError as exc:
        raise InputError(f"{victim} does not answer ({type(exc).__name__}); is the server running?") from None
    if r.status_code != 200:
        return None
    used = r.json().get("queries_used") or {}
    return {k: int(v) for k, v in used.items()}


def reconcile(before: dict[str, int] | None, after: dict[str, int] | None, spent: dict[str, int]) -> dict[str, Any]:
    """The audit's ledgers against the server's count over the audit: equal, or the difference."""
    if before is None or after is None:
        return {"server": None, "note": "the victim is not a stealkit server: no /v1/charges to reconcile with"}
    server = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    kinds = set(server) | set(spent)
    equal = all(server.get(k, 0) == spent.get(k, 0) for k in kinds)
    return {"server": server, "audit": spent, "equal": equal}


def _check_answers(victim: str, key: str | None, dataset: str | None, kinds: Sequence[str], top_k: int) -> None:
    """Refuse, before any query, an answer kind the remote victim (this key) does not serve."""
    from stealkit.extract.common import open_victim

    for kind in kinds:
        try:
            _close(open_victim(victim, mode=kind, budget=0, top_k=top_k, key=key, dataset=dataset))
        except InputError as exc:
            raise InputError(f"--answers {kind}: {victim} does not serve it to this key ({exc}); audit the "
                             "answer kinds it serves") from None


def _num_classes(victim: str, key: str | None, dataset: str | None) -> int:
    """The victim's number of classes, read without a query (a model's metadata, a server's /v1/info)."""
    from stealkit.extract.common import open_victim

    v = open_victim(victim, mode="label", budget=0, key=key, dataset=dataset)
    close = getattr(v.oracle, "close", None)
    if close is not None:
        close()
    return v.num_classes


def _check_resume(run: RunDir, config: dict[str, Any], seed: int) -> set[str]:
    """The finished parts of an earlier audit in ``run`` with the same plan; another plan there is refused."""
    if not (run.path / "parts").is_dir():
        return set()
    old = run.load_config() if run.config_path.exists() else {}
    if old.get("command") != "audit" or old.get("config") != json.loads(json.dumps(config)) or old.get("seed") != seed:
        raise InputError(f"{run.path} holds an audit with another plan; run it with the same options to resume, "
                         "or choose another --out")
    return {p.stem for p in (run.path / "parts").glob("*.json")}


def register(cli: click.Group) -> None:
    cli.add_command(audit_cmd)
