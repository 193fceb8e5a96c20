"""``stealkit audit``: how much does an API leak to model extraction? One command, one report (issue 39).

The audit runs ``stealkit extract surrogate``'s default recipe (:func:`~stealkit.commands.extract_surrogate.
surrogate_config` of :func:`~stealkit.commands.extract_surrogate.command_params`, DFME appendix A with the
``auto`` preset) at a ladder of query budgets, once per answer kind the API gives or could give (labels, top-k,
probabilities) and per attacker: one with data like the victim's (the attacker split, or ``--pool``) and one with
only unrelated natural data (``--unrelated``, by default crops of natural photographs). Its headline is the
fidelity (agreement with the victim on the test split) against queries and Q90/Q95, the fewest measured queries
that reached 90 % / 95 % fidelity; where the plan has room, the ladder of the attacker with data like the victim's
is repeated at other seeds for their spread. When the victim serves explanations, ``stealkit extract
gradient-matching`` (queries to 0.95x the victim's accuracy) and, for a two-layer ReLU victim, ``stealkit extract
exact`` run as parts too (Milli et al. 2019).

Every part (one extraction at one budget) is planned before any query: the plan's total never exceeds
``--max-queries``, and each part's oracle is metered to its own budget, so the ledger enforces it. Each part
writes ``parts/<id>.json`` atomically when it finishes: an interrupted audit run again with the same ``--out``
and plan skips the finished parts and pays for no query twice. Every query count comes from an oracle's ledger.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
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
LADDER = (250, 1000, 4000)
QUICK_LADDER = (50, 100, 200)
#: the default cap on the whole audit's queries: the default ladder for 3 answer kinds x 2 attackers (31,500),
#: the default defence cells (2,500), the transfer attack (1,000), HopSkipJump with and without the stolen copy
#: (20,020), gradient matching (600) and the data-free attacker (5,000) come to 60,620
DEFAULT_MAX_QUERIES = 100_000
#: (transfer images, decision images, decision queries per image, data-free budget cap): the default and --quick.
#: The data-free cap is time, not queries: CoDFe with labels on Fashion-MNIST took 11 min for its first 9,000
#: queries on one core (its student retrains on every answer so far), so 20,000 alone outlasted the 25-min target
DEFAULT_EXTRAS = (500, 10, 1000, 5_000)
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
#: rough seconds per student optimiser step (conv2, batch 64, one shared CPU thread, digits' 64 pixels; a step
#: grows as pixels ** STEP_PIXEL_EXPONENT: a Fashion-MNIST probability part, 3,000 steps, took 208-211 s beside a
#: second worker), per query, per part, and FixMatch's extra (it also trains on the unqueried pool), for the plan's
#: estimate (measured on digits, --quick, and Fashion-MNIST)
STEP_SECONDS = 0.01
STEP_PIXEL_EXPONENT = 0.8
QUERY_SECONDS = 0.0002
PART_SECONDS = 2.0
FIXMATCH_SECONDS = 5.0
#: rough seconds per decision-attack query, per transfer image, per data-free query (digits, one CPU thread); a
#: data-free query grows as pixels ** 1.1 (measured: 2,000 queries 8.9 s on digits, 5,000 356 s on Fashion-MNIST)
DECISION_QUERY_SECONDS = 0.0015
TRANSFER_IMAGE_SECONDS = 0.01
DATAFREE_QUERY_SECONDS = 0.0045
DATAFREE_PIXEL_EXPONENT = 1.1
#: explanations (issue 39, point 4): gradient matching's ladder of inputs queried (each one ``predict`` and one
#: ``explain`` query, so a rung of n costs 2n), the default and --quick; its target, the reconstruction's test
#: accuracy over the victim's (Milli et al. 2019, Sec. 5: "0.95x the victim")
GRADMATCH_LADDER = (30, 100, 300)
QUICK_GRADMATCH_LADDER = (10, 30, 100)
GRADMATCH_TARGET = 0.95
#: ``stealkit extract gradient-matching``'s training minibatches per rung, and rough seconds per minibatch (double
#: back-propagation, conv2, one shared CPU thread): ``a + b * pixels`` (measured: 8 ms on digits' 64 pixels, 76 ms
#: on Fashion-MNIST's 784: 141 s for the rungs 30,100,300)
GRADMATCH_STEPS = 600
GRADMATCH_STEP_SECONDS = (0.002, 9.4e-5)
#: exact recovery's budget: queries per hidden unit (``stealkit extract exact --victim standard:digits-mlp2``, h =
#: 128, spent 15,738 = 6,199 predict + 9,539 explain on all 40 search lines) up to a cap (--exact-budget), and
#: rough seconds per query
EXACT_QUERIES_PER_UNIT = 125
EXACT_BUDGET = 20_000
EXACT_QUERY_SECONDS = 0.0005
#: seeds in all of the spread of Q90/Q95 (the undefended ladder of the attacker with data like the victim's at
#: seeds seed, seed+1, ...), where the plan has room under --max-queries; the default and --quick. The default
#: audit has one: a seed more repeats 9 parts, 3 of them probability parts of ~210 s each on Fashion-MNIST (the
#: recipe's 3,000-step floor), about 7 min on 2 cores over the 25-min target; ask for it with --seeds 3
SEEDS = 1
QUICK_SEEDS = 2


@dataclass(frozen=True)
class Part:
    """One part of the audit, through its own oracle metered to ``budget`` queries. ``kind``:

    - ``extract``: the default surrogate recipe at ``budget`` queries of ``answers`` answers, by the attacker
      ``attacker`` querying images of ``pool`` (through the output defence ``defence``, if any);
    - ``datafree``: the default data-free recipe (``stealkit extract codfe``) at ``budget`` ``answers`` queries;
    - ``transfer``: ``stealkit attack pgd`` from the best stolen copy at the paper's eps on ``n`` test images;
    - ``decision``: ``stealkit attack hopskipjump`` on ``n`` test images at ``per_image`` queries each, with the
      best stolen copy as its substitute (``substitute``) or without it;
    - ``gradmatch``: ``stealkit extract gradient-matching`` (probabilities and gradient explanations) scored at
      each rung of ``ladder`` (inputs queried; ``budget`` = 2 x the top rung: one predict and one explain query
      per input);
    - ``exact``: ``stealkit extract exact`` (two-layer ReLU victim of hidden width ``n``) under ``budget``.

    An ``extract`` part with ``seed_offset`` k repeats its extraction at ``--seed`` + k (the spread over seeds).
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
    ladder: tuple[int, ...] = ()  # gradient matching's rungs (inputs queried)
    seed_offset: int = 0  # an extraction repeated at --seed + seed_offset (the spread over seeds)

    @property
    def id(self) -> str:
        if self.kind == "datafree":
            return f"datafree-{self.answers}-{self.budget}"
        if self.kind == "transfer":
            return f"transfer-pgd-{self.n}"
        if self.kind == "decision":
            return f"hopskipjump-{'with' if self.substitute else 'without'}-copy-{self.n}x{self.per_image}"
        if self.kind == "gradmatch":
            return "gradient-matching-" + "-".join(map(str, self.ladder))
        if self.kind == "exact":
            return f"exact-recovery-h{self.n}-{self.budget}"
        worn = "+" + "".join(c if c.isalnum() or c == "." else "_" for c in self.defence) if self.defence else ""
        again = f"-seed+{self.seed_offset}" if self.seed_offset else ""
        return f"extract-{self.answers}{worn}-{self.attacker}-{self.budget}{again}"


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


def estimate_seconds(budget: int, answers: str, num_classes: int, extra: Sequence[str], pixels: int = 64) -> float:
    """A rough time for one part: the recipe's student optimiser steps at ``STEP_SECONDS`` (scaled to the
    victim's input size), the queries, a fixed cost per part and FixMatch's extra."""
    from stealkit.commands.extract_surrogate import command_params, surrogate_config

    params = command_params(*recipe_args(budget, answers, "pool", 0, extra))
    _, config = surrogate_config(params, budget, num_classes)
    steps = config.student_epochs(budget, budget) * math.ceil(budget / config.batch_size)
    fixmatch = FIXMATCH_SECONDS if config.ssl != "none" else 0.0
    step = STEP_SECONDS * max(1.0, pixels / 64) ** STEP_PIXEL_EXPONENT
    return PART_SECONDS + fixmatch + steps * step + budget * QUERY_SECONDS


def make_plan(answers: Sequence[str], attackers: dict[str, str], ladder: Sequence[int], max_queries: int, *,
              num_classes: int, extra: Sequence[str], defences: Sequence[str] = (),
              extras: Extras = Extras(), reserve: int = 0,
              short_defences: Sequence[str] = (), pixels: int = 64) -> tuple[list[Part], list[str]]:
    """The parts, in the order they run, and notes.

    The extraction ladder first (cheapest rung of every cell first, so a stopped audit has a whole first row; a
    cell is an answer kind and an attacker, or a defence: probabilities through it, the attacker with data like
    the victim's), then the transfer attack and the decision attack without and with the stolen copy, then the
    data-free attacker. To fit ``max_queries``, rungs are dropped from the top of the ladder (down to one), then
    the decision and the transfer parts; the data-free part gets what is left (less ``reserve``, the queries of
    the explanation parts planned after it), up to its cap. ``short_defences`` (the default defence set) are
    defence cells on two rungs of the ladder (:func:`~stealkit.commands.audit_defences.defence_rungs`)."""
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
    parts = [Part(a, name, pool, b, round(estimate_seconds(b, a, num_classes, extra, pixels), 1), d)
             for b in rungs for a, name, pool, d in cell_list if b in cell_rungs(d)]
    if short_defences and defence_rungs(rungs) != rungs:
        notes.append(f"the default defences ({', '.join(short_defences)}) run on two rungs of the ladder, its "
                     f"lowest and its middle ({', '.join(f'{b:,}' for b in defence_rungs(rungs))}): probability "
                     "parts are the audit's slowest; a Q90 above the higher reads 'not reached'")
    parts += attacks
    if extras.datafree_budget:
        budget = min(extras.datafree_budget, max_queries - spend() - reserve)
        if budget >= DATAFREE_MIN:
            parts.append(Part(DATAFREE_ANSWERS, "data-free", "", budget,
                              round(PART_SECONDS + budget * DATAFREE_QUERY_SECONDS
                                    * max(1.0, pixels / 64) ** DATAFREE_PIXEL_EXPONENT, 1), kind="datafree"))
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
    if part.seed_offset:
        kwargs = {**kwargs, "seed": kwargs["seed"] + part.seed_offset}
    if part.kind == "datafree":  # a stopped data-free part resumes from its own checkpoint: no query paid twice
        result = run_datafree_part(part, out, **kwargs)
    else:
        if out.exists():  # a part stopped midway runs again from its start (its queries were spent)
            shutil.rmtree(out)
        if part.kind == "extract":
            result = run_extract_part(part, out, **kwargs)
        elif part.kind in EXPLAIN_KINDS:
            result = run_explanation_part(part, out, **kwargs)
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
        journal = AnswerJournal(v.oracle, out.parent / f"{part.id}.answers")
        result = METHODS["surrogate"].run(
            journal, x_pool, make_student=student_factory(params["student"], v, seed, **kwargs), config=config,
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
            "preset_resolved": resolved, "replayed": journal.replayed}


class AnswerJournal:
    """An oracle that keeps every answer of an extraction part on disk as it arrives (``dir/NNNNNN-DIGEST.pt``,
    each written atomically), so a part stopped midway and run again from its start pays no query twice: while
    its queries are the stopped attempt's (the same images in the same order: the same seed), the journal's
    answers are given back and charged to the oracle's ledger, which therefore counts each of the part's
    queries once (``replayed`` of them paid by the stopped attempt); from the first query that differs, the
    victim answers again and the rest of the old journal is dropped. Everything else is the oracle's."""

    def __init__(self, oracle: Any, path: Path) -> None:
        self.oracle, self.path = oracle, path
        path.mkdir(parents=True, exist_ok=True)
        self.entries = sorted(p for p in path.glob("*.pt") if p.stem.split("-")[0].isdigit())
        self.next = 0
        self.replayed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.oracle, name)

    def query(self, x: Any) -> Any:
        import torch

        from stealkit.oracle.ledger import digest_tensor

        digest = digest_tensor(x)
        if self.next < len(self.entries) and self.entries[self.next].stem == f"{self.next:06d}-{digest}":
            answer = torch.load(self.entries[self.next], weights_only=True)
            self.oracle.ledger.charge("predict", int(x.shape[0]), digest=digest)  # paid by the stopped attempt
            self.replayed += int(x.shape[0])
        else:
            for stale in self.entries[self.next:]:  # another query than the stopped attempt's: start afresh here
                stale.unlink(missing_ok=True)
            self.entries = self.entries[:self.next]
            answer = self.oracle.query(x)
            tmp = self.path / f".{self.next:06d}.tmp"
            torch.save(answer.detach().cpu(), tmp)
            tmp.replace(self.path / f"{self.next:06d}-{digest}.pt")
            self.entries.append(self.path / f"{self.next:06d}-{digest}.pt")
        self.next += 1
        return answer


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


# -- explanations (issue 39, point 4) and the spread over seeds (point 2) -------------------------------------
#: the part kinds of the explanation attacks
EXPLAIN_KINDS = ("gradmatch", "exact")


@dataclass(frozen=True)
class MoreSizes:
    """The explanation parts and the seeds of the spread: gradient matching's ladder (``()`` leaves it out), the
    cap on exact recovery's budget (0 leaves it out) and the seeds in all (1: no spread)."""

    gradmatch: tuple[int, ...] = ()
    exact_budget: int = 0
    seeds: int = 1

    @classmethod
    def default(cls, quick: bool) -> MoreSizes:
        return cls(QUICK_GRADMATCH_LADDER, EXACT_BUDGET, QUICK_SEEDS) if quick else \
            cls(GRADMATCH_LADDER, EXACT_BUDGET, SEEDS)


@dataclass(frozen=True)
class ExplainAccess:
    """What the victim gives the explanation attacks, read without a query: ``why_not`` (``None`` when it serves
    gradient explanations with probabilities, else why not), ``hidden`` (the hidden width of a two-layer ReLU
    victim, else ``None``) and ``why_not_exact``; ``pixels`` sizes the time estimate."""

    why_not: str | None
    hidden: int | None
    why_not_exact: str
    pixels: int


def explanation_access(victim: str, key: str | None, dataset: str | None) -> ExplainAccess:
    """A local model serves explanations when torch has its gradients (a model directory or TorchScript file; an
    ONNX file does not); a ``stealkit serve`` key when its ``explain`` is true and it may ask for probabilities;
    an Open Inference Protocol (v2) endpoint never. Exact recovery: a local ``mlp2`` (a two-layer ReLU network,
    its hidden width from the model spec)."""
    from stealkit.commands.extract_exact import _spec_hidden
    from stealkit.extract.common import open_victim
    from stealkit.oracle.http_v2 import is_v2

    v = open_victim(victim, mode="label", budget=0, key=key, dataset=dataset)
    try:
        pixels = math.prod(v.input_shape)
        info = getattr(v.oracle, "info", None)
        if v.model is not None:
            spec = v.spec
            onnx = getattr(spec, "format", None) == "onnx"
            why = "an ONNX victim gives no gradients (onnxruntime)" if onnx else None
            arch = getattr(spec, "arch", None)
            hidden = _spec_hidden(spec)
            why_exact = "" if hidden is not None else (
                f"the victim is {arch}, not a two-layer ReLU network (mlp2)" if arch else
                "the model file does not say it is a two-layer ReLU network (mlp2)")
            return ExplainAccess(why, None if why else hidden, why or why_exact, pixels)
        if is_v2(victim) or info is None:
            why = "an Open Inference Protocol (v2) server serves no explanations"
        elif not info.get("explain"):
            why = "this API key may not ask for explanations (the server says explain = false)"
        elif "probs" not in info.get("allowed_modes", [info.get("mode")]):
            why = "gradient matching trains on probabilities, and this API key may not ask for them"
        else:
            why = None
        arch = info.get("arch") if info else None
        why_exact = why or ("a remote victim's hidden width is not published; run `stealkit extract exact --hidden "
                            "H` against it" if arch == "mlp2" else
                            f"the victim is {arch or 'of an unknown architecture'}, not a two-layer ReLU network (mlp2)")
        return ExplainAccess(why, None, why_exact, pixels)
    finally:
        _close(v)


def gradmatch_seconds(ladder: Sequence[int], pixels: int) -> float:
    """A rough time for the gradient-matching part: :data:`GRADMATCH_STEPS` minibatches per rung."""
    a, b = GRADMATCH_STEP_SECONDS
    return PART_SECONDS + len(ladder) * GRADMATCH_STEPS * (a + b * pixels)


def plan_explanations(access: ExplainAccess | None, sizes: MoreSizes, room: int) -> tuple[list[Part], list[str]]:
    """The explanation parts that fit in ``room`` queries (what the ladder and the attacks leave under
    ``--max-queries``), gradient matching first; a note for each part left out and why."""
    if access is None or not (sizes.gradmatch or sizes.exact_budget):
        return [], []
    if access.why_not is not None:
        return [], [f"the explanation attacks (gradient matching, exact recovery) left out: {access.why_not}"]
    parts, notes = [], []
    if sizes.gradmatch:
        ladder = tuple(sorted(set(sizes.gradmatch)))
        budget = 2 * ladder[-1]
        if budget <= room:
            parts.append(Part("probs", "explanations", "pool", budget,
                              round(gradmatch_seconds(ladder, access.pixels), 1), kind="gradmatch", ladder=ladder))
            room -= budget
        else:
            notes.append(f"gradient matching left out: its ladder {','.join(map(str, ladder))} needs {budget:,} "
                         f"queries (one answer and one explanation per input), the plan leaves {max(room, 0):,}")
    if sizes.exact_budget:
        if access.hidden is None:
            notes.append(f"exact recovery left out: {access.why_not_exact}")
        else:
            budget = min(sizes.exact_budget, EXACT_QUERIES_PER_UNIT * access.hidden)
            if budget <= room:
                parts.append(Part("logits", "explanations", "", budget, round(PART_SECONDS + budget *
                                  EXACT_QUERY_SECONDS, 1), kind="exact", n=access.hidden))
            else:
                notes.append(f"exact recovery left out: its budget {budget:,} ({EXACT_QUERIES_PER_UNIT} queries per "
                             f"hidden unit, h = {access.hidden}, capped by --exact-budget) is more than the "
                             f"{max(room, 0):,} the plan leaves")
    return parts, notes


def plan_seeds(parts: Sequence[Part], seeds: int, max_queries: int, *, attacker: str = "like"
               ) -> tuple[list[Part], list[str]]:
    """The repeats of the undefended ladder of ``attacker`` (data like the victim's) at ``--seed`` + 1, + 2, ...,
    as many as the plan's room under ``max_queries`` holds, up to ``seeds`` in all; a note says how many fitted."""
    base = [p for p in parts if p.kind == "extract" and p.attacker == attacker and not p.defence]
    if seeds <= 1 or not base:
        return [], []
    cost = sum(p.budget for p in base)
    room = max_queries - sum(p.budget for p in parts)
    extra = max(0, min(seeds - 1, room // cost))
    note = (f"spread over seeds: the ladder of the attacker with data like the victim's at {1 + extra} of --seeds "
            f"{seeds} seeds")
    if extra < seeds - 1:
        note += (f" (each seed more needs {cost:,} queries, the plan leaves {max(room - extra * cost, 0):,} under "
                 f"--max-queries {max_queries:,})")
    repeats = [dataclasses.replace(p, seed_offset=k) for k in range(1, extra + 1) for p in base]
    return repeats, [note]


def more_sizes(quick: bool, gradmatch_budgets: str | None, exact_budget: int | None,
               seeds: int | None) -> MoreSizes:
    """:class:`MoreSizes` from the command's options over the default (or ``--quick``) ones; bad values refused."""
    more = MoreSizes.default(quick)
    if gradmatch_budgets is not None:
        ladder = parse_int_list(gradmatch_budgets)
        if min(ladder) < 0 or (0 in ladder and len(ladder) > 1):
            raise InputError(f"--gradmatch-budgets takes positive numbers of inputs, or 0 to leave gradient "
                             f"matching out; got {gradmatch_budgets}")
        more = dataclasses.replace(more, gradmatch=() if ladder == [0] or tuple(ladder) == (0,) else tuple(ladder))
    if exact_budget is not None:
        if exact_budget < 0:
            raise InputError(f"--exact-budget must be 0 (leave exact recovery out) or positive, got {exact_budget}")
        more = dataclasses.replace(more, exact_budget=exact_budget)
    if seeds is not None:
        if seeds < 1:
            raise InputError(f"--seeds must be at least 1 (the audit's own seed), got {seeds}")
        more = dataclasses.replace(more, seeds=seeds)
    return more


def plan_all(answers: Sequence[str], attackers: dict[str, str], ladder: Sequence[int], max_queries: int, *,
             num_classes: int, extra: Sequence[str], defences: Sequence[str], extras: Extras, more: MoreSizes,
             access: ExplainAccess | None, short_defences: Sequence[str] = (),
             pixels: int = 64) -> tuple[list[Part], list[str]]:
    """The whole plan: :func:`make_plan`'s parts (the ladder, the attacks, the data-free attacker), then the
    explanation parts (room for them is kept from the data-free part, whose budget is what is left), then the
    repeats at other seeds in what the plan still leaves under ``max_queries``."""
    kwargs: dict[str, Any] = {"num_classes": num_classes, "extra": extra, "defences": defences,
                              "short_defences": short_defences, "pixels": pixels}
    base, _ = make_plan(answers, attackers, ladder, max_queries, extras=dataclasses.replace(extras, datafree_budget=0),
                        **kwargs)
    explain, explain_notes = plan_explanations(access, more, max_queries - sum(p.budget for p in base))
    parts, notes = make_plan(answers, attackers, ladder, max_queries, extras=extras,
                             reserve=sum(p.budget for p in explain), **kwargs)
    parts += explain
    repeats, seed_notes = plan_seeds(parts, more.seeds, max_queries, attacker=next(iter(attackers)))
    return parts + repeats, [*notes, *explain_notes, *seed_notes]


def run_explanation_part(part: Part, out: Path, *, victim: str, key: str | None, top_k: int, dataset: str | None,
                         data_dir: str | None, device: str, seed: int, extra: Sequence[str]) -> dict[str, Any]:
    """``stealkit extract gradient-matching --budget <top rung> --checkpoints <ladder>`` run as the command itself
    (figures read back from its summary, queries its ledger's), or ``stealkit extract exact`` through the
    command's own body (:func:`stealkit.commands.extract_exact.run_exact`) on a victim opened as the command opens
    it, metered to the part's budget: a recovery that fails or runs out of budget is a result ("not recovered
    within N"), its queries still the ledger's."""
    common = [*(["--key", key] if key else []), *(["--dataset", dataset] if dataset else []),
              *(["--data-dir", data_dir] if data_dir else [])]
    if part.kind == "gradmatch":
        from stealkit.commands.extract_gradmatch import gradmatch_cmd

        args = ["--victim", victim, "--budget", str(max(part.ladder)), "--checkpoints",
                ",".join(map(str, part.ladder)), "--seed", str(seed), "--out", str(out), "--device", device, *common]
        with _quiet():
            gradmatch_cmd.main(args=args, prog_name="stealkit extract gradient-matching", standalone_mode=False)
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        queries = {k: int(v) for k, v in summary["queries"].items()}
        victim_accuracy = summary.get("victim_accuracy")
        target = None if victim_accuracy is None else GRADMATCH_TARGET * victim_accuracy
        reached = reach_point(summary.get("curve") or [], target)
        return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": summary["accuracy"],
                "fidelity": summary.get("fidelity"), "victim_accuracy": victim_accuracy, "served_accuracy": None,
                "command": "stealkit extract gradient-matching " + " ".join(args), "curve": summary["curve"],
                "target_accuracy": target, "reached": reached}
    from stealkit.commands.extract_exact import run_exact
    from stealkit.errors import BudgetExhausted
    from stealkit.extract.common import open_victim
    from stealkit.extract.explanations.exact_access import RecoveryFailure

    v = open_victim(victim, mode="logits", budget=part.budget, key=key, explain=True, dataset=dataset, device=device,
                    seed=seed)
    failure = None
    try:
        with _quiet():
            run_exact(v, victim=victim, variant="gradient", hidden=part.n, budget=part.budget, data_dir=data_dir,
                      seed=seed, out=str(out), device=device)
    except (BudgetExhausted, RecoveryFailure) as exc:
        failure = str(exc).splitlines()[0]
    finally:
        _close(v)
    queries = v.oracle.ledger.as_dict()
    summary = {} if failure else json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": summary.get("accuracy"),
            "fidelity": summary.get("fidelity"), "victim_accuracy": summary.get("victim_accuracy"),
            "served_accuracy": None, "command": f"stealkit extract exact --hidden {part.n} --budget {part.budget}",
            "recovered": failure is None, "failure": failure, "hidden_found": summary.get("hidden_found"),
            "max_relative_error_test": summary.get("max_relative_error_test")}


def reach_point(curve: Sequence[dict[str, Any]], target: float | None) -> dict[str, Any] | None:
    """The first point of a gradient-matching curve (in queries) whose reconstruction's test accuracy reached
    ``target`` (0.95x the victim's), or ``None``; its ``queries`` are the ledger's (answers and explanations)."""
    if target is None:
        return None
    for p in sorted(curve, key=lambda p: p["queries"]):
        if p.get("accuracy") is not None and p["accuracy"] >= target - TOLERANCE:
            return dict(p)
    return None


def explanation_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per explanation attack: what it aims at, the queries (the ledger's) that reached it or "not
    reached within N", and the copy's accuracy and fidelity there."""
    rows = []
    for r in results:
        kind = r["part"].get("kind")
        if kind == "gradmatch":
            hit, target = r.get("reached"), r.get("target_accuracy")
            at = hit or max(r.get("curve") or [{}], key=lambda p: p.get("queries", 0))  # else the top rung
            rows.append({"attack": "gradient matching (probabilities + gradients)",
                         "target": "–" if target is None else f"0.95x victim accuracy ({target:.3f})",
                         "queries to target": hit["queries"] if hit else
                         ("not measured (no victim accuracy)" if target is None else
                          f"not reached within {r['total_queries']:,}"),
                         "answers": at.get("queries_predict"), "explanations": at.get("queries_explain"),
                         "accuracy": at.get("accuracy"), "fidelity": at.get("fidelity"),
                         "queries spent": r["total_queries"]})
        elif kind == "exact":
            q = r["queries"]
            rows.append({"attack": f"exact recovery (two-layer ReLU, h = {r['part']['n']})",
                         "target": "a functionally equivalent copy",
                         "queries to target": r["total_queries"] if r.get("recovered") else
                         f"not recovered within {r['part']['budget']:,}",
                         "answers": q.get("predict", 0), "explanations": q.get("explain", 0),
                         "accuracy": r.get("accuracy"), "fidelity": r.get("fidelity"),
                         "queries spent": r["total_queries"]})
    return rows


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def seed_spread(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Q90/Q95 over seeds, per answer kind, of the attacker with data like the victim's (the undefended ladder
    at ``--seed`` and its repeats): every seed's value, the median and the range. A seed that did not reach
    the level counts as more than its top rung: the median is "not reached" when it falls there."""
    seeds: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in results:
        p = r["part"]
        if p.get("kind", "extract") == "extract" and p["attacker"] == "like" and not p.get("defence"):
            seeds.setdefault(p["answers"], {}).setdefault(int(p.get("seed_offset") or 0), []).append(r)
    rows = []
    for answers, by_seed in seeds.items():
        if len(by_seed) < 2:
            continue
        row: dict[str, Any] = {"answers": answers, "attacker": "like", "seeds": len(by_seed)}
        for t in THRESHOLDS:
            level = f"Q{round(t * 100)}"
            values, tops = [], []
            for _, points in sorted(by_seed.items()):
                q = q_at(points, t)
                values.append(math.inf if q is None else q)
                tops.append(max(p["total_queries"] for p in points))
            top = max(tops)
            reached = [v for v in values if v != math.inf]
            med = _median(values)
            row[f"{level} per seed"] = ", ".join("–" if v == math.inf else f"{int(v):,}" for v in values)
            row[f"{level} median"] = (f"not reached within {top:,}" if med == math.inf else
                                      int(med) if float(med).is_integer() else med)
            lo, hi = (f"{int(min(reached)):,}", f"{int(max(reached)):,}") if reached else ("", "")
            row[f"{level} range"] = (f"not reached within {top:,}" if not reached else
                                     f"{lo} to not reached within {top:,}" if len(reached) < len(values) else
                                     lo if lo == hi else f"{lo}-{hi}")
        rows.append(row)
    return rows


def explanation_sentences(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's plain words on explanations."""
    out = []
    for r in rows:
        q = r["queries to target"]
        if r["attack"].startswith("gradient matching") and isinstance(q, int):
            out.append(f"If your API also serves input-gradient explanations, gradient matching with data like yours "
                       f"gets a copy with 0.95x your model's accuracy from {q:,} queries ({r['answers']:,} answers "
                       f"and {r['explanations']:,} explanations).")
        elif r["attack"].startswith("exact") and isinstance(q, int):
            fid = "" if r["fidelity"] is None else f" (fidelity {100 * r['fidelity']:.1f} %)"
            out.append(f"Your model is a two-layer ReLU network: from its gradients an attacker recovers a "
                       f"functionally equivalent copy{fid} with {q:,} queries.")
    return out


def spread_sentences(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's plain words on the spread of Q90 over seeds (one sentence for all answer kinds)."""
    words = {"label": "top-1 labels", "topk": "top-k answers", "probs": "probabilities"}
    if not rows:
        return []
    parts = [f"{r['Q90 range']} with {words.get(r['answers'], r['answers'])}" for r in rows]
    return [f"Repeated at {rows[0]['seeds']} seeds with data like yours, Q90 ranges {', '.join(parts)}."]


def more_sections(summary: dict[str, Any]) -> list[Section]:
    """The report's sections on explanations and on the spread of Q90/Q95 over seeds (when the audit has them)."""
    from stealkit.report.html import Figure, Section
    from stealkit.report.plots import line_plot

    out = []
    if summary.get("explanations"):
        sec = Section("Explanations: gradient matching and exact recovery", paragraphs=[
            "When the API serves explanations (input gradients), `stealkit extract gradient-matching` (Milli et al. "
            "2019, Sec. 4: the gradient and membership losses) trains a copy on the answers and explanations of "
            "the attacker's data, scored at each rung; the figure is the queries (one answer and one explanation "
            "per input, from the ledger) to reach 0.95x the victim's test accuracy. `stealkit extract exact` "
            "(Sec. 3, Algorithm 1) recovers a two-layer ReLU network from gradient queries."],
            tables=[("", summary["explanations"])])
        for r in summary.get("parts") or []:
            if r["part"].get("kind") == "gradmatch" and r.get("curve"):
                series = {"gradient matching, test accuracy": ([p["queries"] for p in r["curve"]],
                                                              [p["accuracy"] for p in r["curve"]])}
                hl = {"0.95x victim": r["target_accuracy"]} if r.get("target_accuracy") is not None else {}
                sec.figures.append(Figure(line_plot(series, xlabel="victim queries: answers + explanations (ledger)",
                                                    ylabel="test accuracy", logx=True, hlines=hl, ylim=(0, 1.02)),
                                          "Gradient matching: the copy's test accuracy against queries"))
        out.append(sec)
    if summary.get("spread"):
        out.append(Section("Q90 and Q95 over seeds", paragraphs=[
            "The undefended ladder of the attacker with data like the victim's, repeated at other seeds where the "
            "plan had room: each seed's Q90/Q95 (\"–\": not reached within its top rung), their median and range."],
            tables=[("", summary["spread"])]))
    return out


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
    """The results that are a stolen copy (the extraction ladder and the data-free attacker; the repeats at other
    seeds are the spread's, :func:`seed_spread`)."""
    return [r for r in results if r["part"].get("kind", "extract") in ("extract", "datafree")
            and not r["part"].get("seed_offset")]


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
              jobs: int = 1, **kwargs: Any) -> list[dict[str, Any]]:
    """Run the parts not yet checkpointed in ``run``/parts, each one written atomically when it finishes.

    With ``jobs`` > 1 (and the parts estimated at :data:`PARALLEL_MIN_SECONDS` or more) the parts that need no
    stolen copy (the extraction ladder, the data-free attacker) run in ``jobs`` worker processes of one torch
    thread each (the CPU thread policy: parallel processes, not threads); the attacks from the stolen copy follow, one at a time. Each part has its own seeded oracle and budget, so the
    figures and the queries are those of a run with ``jobs`` = 1."""
    from stealkit.fsutil import atomic_write_json

    parts_dir = run.path / "parts"
    done = load_done(parts_dir, parts)
    results: dict[str, dict[str, Any]] = dict(done)
    finished = [0]

    def record(part: Part, result: dict[str, Any]) -> None:
        atomic_write_json(parts_dir / f"{part.id}.json", result)
        run.append_record(result)
        finished[0] += 1
        echo(f"[{len(done) + finished[0]}/{len(parts)}] {part.id}: {progress(result)}, "
             f"{result['total_queries']:,} queries, {result['elapsed_s']:.0f}s")
        results[part.id] = result
        if on_part is not None:
            on_part(part, result)

    todo = [p for p in parts if p.id not in done]
    free = [p for p in todo if p.kind not in COPY_KINDS]
    if jobs > 1 and len(free) > 1 and sum(p.estimate_s for p in free) >= PARALLEL_MIN_SECONDS:
        workers = _in_workers(free, min(jobs, len(free)), parts_dir=parts_dir, **kwargs)
        try:
            for part, result in workers:
                record(part, result)
        finally:
            workers.close()  # stops the other workers now if a part failed or the hook stopped the audit
    for part in todo:
        if part.id in results:
            continue
        copy = None
        if part.kind in COPY_KINDS:
            copy = best_copy([results[p.id] for p in parts if p.id in results], parts_dir)
        record(part, watched_part(part, parts_dir=parts_dir, copy=copy, **kwargs))
    return [results[p.id] for p in parts]


def watched_part(part: Part, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_part` with PRADA watching the part's own queries, in order (none is sent again for it)."""
    from stealkit.commands.audit_defences import PradaObserver
    from stealkit.oracle.observe import observing

    with observing(PradaObserver()) as watch:
        result = run_part(part, **kwargs)
    result["prada"] = watch.as_dict()
    if result.get("resumed"):
        result["prada"]["note"] = "resumed from its checkpoint: PRADA saw the queries after it only"
    return result


#: the parts that attack from the best stolen copy (they run after every extraction part)
COPY_KINDS = ("transfer", "decision")
#: below this estimated time of the parallel parts together, starting worker processes (a few seconds each:
#: a fresh interpreter imports torch) costs more than it saves, so they run in this process
PARALLEL_MIN_SECONDS = 120.0


def _in_workers(parts: Sequence[Part], jobs: int, **kwargs: Any) -> Iterator[tuple[Part, dict[str, Any]]]:
    """Each part in one of ``jobs`` spawned worker processes, yielded as each finishes (the largest first, so
    the slowest part does not start last). A failure stops the others; the finished parts are already yielded."""
    import functools
    import multiprocessing as mp

    order = sorted(parts, key=lambda p: -p.estimate_s)
    ctx = mp.get_context("spawn")  # not fork: the parent has run torch, and a forked OpenMP runtime can hang
    with ctx.Pool(jobs, initializer=_worker_setup) as pool:
        run_one = functools.partial(_worker_part, **kwargs)
        try:
            yield from pool.imap_unordered(run_one, order)
        finally:
            pool.terminate()


def _worker_setup() -> None:
    """A worker: no progress bars of its own (the audit prints a line per part), one torch thread."""
    import os

    os.environ["STEALKIT_QUIET"] = "1"
    from stealkit.threads import apply_threads, resolve_threads

    apply_threads(resolve_threads())


def _worker_part(part: Part, **kwargs: Any) -> tuple[Part, dict[str, Any]]:
    return part, watched_part(part, **kwargs)


def progress(result: dict[str, Any]) -> str:
    """A finished part's figures in a few words (its progress line)."""
    kind = result["part"].get("kind", "extract")
    if kind == "transfer":
        return f"transfer success {_pct(result['asr'])} ({result['successes']}/{result['attempts']})"
    if kind == "decision":
        l2 = "–" if result.get("median_l2") is None else f"{result['median_l2']:.3f}"
        return f"median L2 {l2}, success {_pct(result['asr'])}"
    if kind == "gradmatch":
        hit = result.get("reached")
        return (f"0.95x the victim's accuracy at {hit['queries']:,} queries" if hit else
                "0.95x the victim's accuracy not reached") + f", accuracy {_pct(result['accuracy'])}"
    if kind == "exact" and not result.get("recovered"):
        return f"not recovered ({result.get('failure')})"
    return f"fidelity {_pct(result['fidelity'])}, accuracy {_pct(result['accuracy'])}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every row's columns in the rows' own order: a column only a later row has (the data-free row's
    ``fidelity @2000``) goes before the first column that follows it there (``Q90``), not at the end."""
    cols: list[str] = []
    for r in rows:
        keys = list(r)
        for i, c in enumerate(keys):
            if c not in cols:
                after = next((k for k in keys[i + 1:] if k in cols), None)
                cols.insert(cols.index(after) if after is not None else len(cols), c)
    return cols


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = _columns(rows)
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
                       f"{_pct(r['served accuracy'])} accuracy and "
                       + (f"puts Q90 at {r['Q90']:,} queries." if isinstance(r["Q90"], int) else
                          f"keeps the copy under 90 % fidelity ({r['Q90']} queries)."))
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
        worn = f" through {r['part']['defence']}" if r["part"].get("defence") else ""
        xs, ys = series.setdefault(f"fidelity, {r['part']['answers']} {r['part']['attacker']}{worn}", ([], []))
        xs.append(r["total_queries"])
        ys.append(r["fidelity"])
    if series:
        uri = line_plot(series, xlabel="victim queries (from the ledger)", ylabel="fidelity on the test split",
                        logx=True, hlines={"90 %": 0.9, "95 %": 0.95}, ylim=(0, 1.02))
        out[1].figures.append(Figure(uri, "Fidelity of the stolen copy against queries, per answer kind and "
                                          "attacker"))
    if summary.get("reconciliation"):
        out.append(Section("Queries reconciled with the server",
                           paragraphs=[reconciliation_line(summary["reconciliation"])]))
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
    out += more_sections(summary)
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
@click.option("--gradmatch-budgets", default=None,
              help="Gradient matching's ladder of inputs queried, each one answer and one explanation (default "
                   f"{','.join(map(str, GRADMATCH_LADDER))}, --quick {','.join(map(str, QUICK_GRADMATCH_LADDER))}; "
                   "0 leaves it out); a victim that serves explanations only.")
@click.option("--exact-budget", type=int, default=None,
              help=f"Cap on exact recovery's queries ({EXACT_QUERIES_PER_UNIT} per hidden unit up to this; default "
                   f"{EXACT_BUDGET:,}; 0 leaves it out); a two-layer ReLU (mlp2) victim that serves explanations only.")
@click.option("--seeds", type=int, default=None,
              help=f"Seeds in all of the spread of Q90/Q95 (the ladder of the attacker with data like the victim's "
                   f"repeated at --seed+1, ... where the plan has room; default {SEEDS}, --quick {QUICK_SEEDS}; 1: "
                   "no spread).")
@click.option("--plan", "plan_only", is_flag=True, help="Print the plan and stop (no query).")
@click.option("--quick", is_flag=True, help=f"A small ladder ({','.join(map(str, QUICK_LADDER))}).")
@click.option("--recipe", "recipe", multiple=True, metavar="ARG",
              help="Extra `stealkit extract surrogate` argument of every part (repeat; e.g. --recipe=--epochs=5).")
@click.option("--dataset", default=None, help="Data set of the victim's task (default: from its model.json).")
@click.option("--data-dir", default=None, type=click.Path(), help="Directory holding data set files.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--out", required=True, type=click.Path(),
              help="Audit directory (run again with the same plan: it resumes).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parts run at once, each a process of one torch thread (default: the CPU cores on the CPU, 1 on "
                   "a GPU); the figures do not depend on it.")
@device_option
def audit_cmd(victim: str, key: str | None, answers: str, top_k: int, pool: str, unrelated: str,
              defences: tuple[str, ...], fail_if: tuple[str, ...], budgets: str | None, max_queries: int,
              transfer_images: int | None, decision_images: int | None, decision_queries: int | None,
              datafree_budget: int | None, gradmatch_budgets: str | None, exact_budget: int | None,
              seeds: int | None, plan_only: bool, quick: bool, recipe: tuple[str, ...],
              dataset: str | None, data_dir: str | None, seed: int, out: str, jobs: int | None,
              device: str) -> None:
    """Audit a victim's exposure to model extraction: the default surrogate recipe at a ladder of budgets, per
    answer kind and attacker, and a data-free attacker; fidelity against queries and Q90/Q95 (with their spread
    over seeds where the plan has room); what the stolen copy enables (transfer PGD, HopSkipJump with and without
    it); explanations (gradient matching, exact recovery of a two-layer ReLU victim) when the victim serves them;
    one report. Prints the plan first."""
    sizes = {"transfer_images": transfer_images, "decision_images": decision_images,
             "decision_queries": decision_queries, "datafree_budget": datafree_budget}
    failed = run_audit_command(victim=victim, key=key, answers=answers, top_k=top_k, pool=pool,
                               unrelated=unrelated, defences=defences, fail_if=fail_if, budgets=budgets,
                               max_queries=max_queries, plan_only=plan_only, quick=quick, recipe=recipe,
                               dataset=dataset, data_dir=data_dir, seed=seed, out=out, device=device,
                               gradmatch_budgets=gradmatch_budgets, exact_budget=exact_budget, seeds=seeds,
                               jobs=jobs or (os.cpu_count() or 1 if device == "cpu" else 1),
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
                      gradmatch_budgets: str | None = None, exact_budget: int | None = None,
                      seeds: int | None = None, jobs: int = 1, **sizes: int) -> list[str]:
    """The command's body (``on_part``: a hook called after each part, e.g. to stop a test's audit; ``sizes``:
    fields of :class:`Extras` over the default, or ``--quick``, ones; ``gradmatch_budgets``, ``exact_budget``,
    ``seeds``: :class:`MoreSizes` over the default ones); returns the ``--fail-if`` gates the audit failed, one
    line each."""
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
    num_classes, pixels = _victim_shape(victim, key, dataset)
    if is_url(victim):
        _check_answers(victim, key, dataset, kinds, top_k)
    attackers = {"like": pool, "unrelated": unrelated}
    more = more_sizes(quick, gradmatch_budgets, exact_budget, seeds)
    parts, notes = plan_all(kinds, attackers, ladder, max_queries, num_classes=num_classes, extra=extra,
                            defences=list(dict.fromkeys(defences)), extras=extras, more=more,
                            access=explanation_access(victim, key, dataset)
                            if more.gradmatch or more.exact_budget else None, short_defences=default_defences,
                            pixels=pixels)
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
    if is_url(victim):  # the server's count at the first start (kept on resume), and at this start
        record_server_count(run.path, parts, victim, key)
    results = run_audit(parts, run, on_part=on_part, echo=lambda s: click.echo(s, err=True), jobs=jobs, victim=victim,
                        key=key, top_k=top_k, dataset=dataset, data_dir=data_dir, device=device, seed=seed,
                        extra=extra)
    summary = summarise(parts, results, max_queries, notes)
    summary["explanations"] = explanation_rows(results)
    summary["spread"] = seed_spread(results)
    summary["sentences"] += spread_sentences(summary["spread"]) + explanation_sentences(summary["explanations"])
    from stealkit.commands.audit_defences import add_serving, serving_costs

    add_serving(summary, serving_costs(victim=victim, answers=kinds, top_k=top_k,
                                       defences=[*defences, *default_defences], dataset=dataset,
                                       data_dir=data_dir, device=device), top_k)
    if usage_path.exists():
        summary["reconciliation"] = reconcile_audit(json.loads(usage_path.read_text(encoding="utf-8")),
                                                    server_count(victim, key), results,
                                                    _read_json(run.path / RESUMED_USAGE))
    run.write_summary(summary)
    from stealkit.fsutil import atomic_write_json

    atomic_write_json(run.path / "audit.json", {"audit": config, "seed": seed, **summary})  # every figure, one file
    from stealkit.report.builders import write_report

    write_report(run)
    click.echo(format_table(summary["headline"]))
    for table in ("enables", "explanations", "spread", "serving"):
        if summary.get(table):
            click.echo("")
            click.echo(format_table(summary[table]))
    click.echo(f"queries {summary['queries']:,} of --max-queries {max_queries:,} (from the ledgers); "
               f"report: {run.report_path}")
    if summary.get("reconciliation"):
        click.echo(reconciliation_line(summary["reconciliation"]))
    return failed_gates(summary["headline"], fail_if)


def server_usage(victim: str, key: str | None) -> dict[str, int] | None:
    """The key's queries used as ``stealkit serve`` counts them (``GET /v1/charges``: ``queries_used``), or
    ``None`` for a victim that is not a stealkit /v1 server (a local model; a v2 endpoint: :func:`v2_usage`)."""
    import httpx

    from stealkit.extract.common import is_url
    from stealkit.oracle.http_v2 import is_v2

    if not is_url(victim) or is_v2(victim):
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


#: where each count comes from, and what it counts (the report and summary.json say which one was read)
V1_CHARGES = "GET /v1/charges: queries_used of this key"
V2_METADATA = "GET /v2/models/NAME: the model metadata's parameters.queries_used of this key (stealkit serve)"
V2_STATS = ("GET /v2/models/NAME/stats: the statistics extension's inference_count (Triton): every client's "
            "inferences of this model, not this key's only")


def server_count(victim: str, key: str | None) -> dict[str, Any]:
    """The server's own count of the queries it answered (``{"source": ..., "counts": {kind: n}}``), from the
    first of: ``stealkit serve``'s ``/v1/charges`` (a /v1 victim); for a v2 (Open Inference Protocol) victim,
    the model metadata's ``parameters.queries_used`` (what ``stealkit serve --protocol v2`` gives a key), else
    the statistics extension Triton serves (``GET /v2/models/NAME/stats``, model-wide). ``counts`` is ``None``
    where the server exposes none of them (the Open Inference Protocol itself has no count): not reconcilable."""
    from stealkit.oracle.http_v2 import is_v2

    if is_v2(victim):
        return v2_usage(victim, key)
    used = server_usage(victim, key)
    return {"source": V1_CHARGES if used is not None else None, "counts": used}


def v2_usage(victim: str, key: str | None, transport: Any = None) -> dict[str, Any]:
    """:func:`server_count` of a v2 endpoint (``transport``: an httpx transport, for a test's fake server)."""
    import urllib.parse

    import httpx

    from stealkit.oracle.http_v2 import parse_v2_address

    base, name, _ = parse_v2_address(victim)
    path = f"/v2/models/{urllib.parse.quote(str(name), safe='')}"
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30, transport=transport) as client:
            meta = client.get(path)
            params = meta.json().get("parameters") if meta.status_code == 200 else None
            used = params.get("queries_used") if isinstance(params, dict) else None
            if isinstance(used, dict) and all(isinstance(v, int) for v in used.values()):
                return {"source": V2_METADATA, "counts": {str(k): int(v) for k, v in used.items()}}
            stats = client.get(path + "/stats")
            rows = stats.json().get("model_stats") if stats.status_code == 200 else None
            if isinstance(rows, list) and rows and all(isinstance(r, dict) and isinstance(r.get("inference_count"),
                                                                                          int) for r in rows):
                return {"source": V2_STATS, "counts": {"predict": sum(int(r["inference_count"]) for r in rows)}}
    except httpx.HTTPError as exc:
        raise InputError(f"{victim} does not answer ({type(exc).__name__}); is the server running?") from None
    except ValueError:  # a body that is not JSON: no count there
        pass
    return {"source": None, "counts": None}


#: the server's count when an audit resumed, and the ledgers of the parts finished by then
RESUMED_USAGE = "server_usage_resumed.json"


def record_server_count(path: Path, parts: Sequence[Part], victim: str, key: str | None) -> None:
    """Write the server's count (:func:`server_count`) at the audit's first start, and on each resume beside the
    ledgers of the parts finished by then: what the server counted beyond them was spent by a part stopped
    midway (run again from its start), which no finished ledger holds."""
    from stealkit.fsutil import atomic_write_json

    first = path / "server_usage_before.json"
    if not first.exists():
        atomic_write_json(first, server_count(victim, key))
        return
    done = load_done(path / "parts", parts)
    atomic_write_json(path / RESUMED_USAGE, server_count(victim, key) | {"finished": _ledgers(done.values())})


def _ledgers(results: Any) -> dict[str, int]:
    spent: dict[str, int] = {}
    for r in results:
        for k, v in r["queries"].items():
            spent[k] = spent.get(k, 0) + int(v)
    return spent


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def reconcile_audit(before: dict[str, Any], after: dict[str, Any], results: Sequence[dict[str, Any]],
                    resumed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The audit's ledgers (summed over its parts) against the server's count over the audit (:func:`server_count`
    at the start and at the end), or why they cannot be reconciled. ``resumed``: the count at the last resume and
    the ledgers finished by then; the server's count then, beyond the start's and those ledgers, is ``stopped``:
    queries a part stopped midway spent before it was run again (they are in ``server``, not in ``audit``)."""
    spent = _ledgers(results)
    if before.get("counts") is None or after.get("counts") is None or before.get("source") != after.get("source"):
        return {"server": None, "audit": spent, "equal": None, "source": None,
                "note": "not reconcilable: the server exposes no count of the queries it answered (no stealkit "
                        "/v1/charges, no queries_used in its v2 model metadata, no v2 statistics extension); the "
                        "audit's ledgers are its only count"}
    stopped: dict[str, int] = {}
    if resumed is not None and resumed.get("counts") is not None and resumed.get("source") == before["source"]:
        finished = resumed.get("finished") or {}
        stopped = {k: resumed["counts"].get(k, 0) - before["counts"].get(k, 0) - finished.get(k, 0)
                   for k in set(resumed["counts"]) | set(before["counts"]) | set(finished)}
    if before["source"] == V2_STATS:  # the statistics extension counts inferences, not explanations
        spent, stopped = {"predict": spent.get("predict", 0)}, {"predict": stopped.get("predict", 0)}
    replayed = sum(int(r.get("replayed") or 0) for r in results)  # answers of stopped attempts, in the ledgers
    if replayed:
        stopped["predict"] = stopped.get("predict", 0) - replayed
    paid = {k: spent.get(k, 0) + stopped.get(k, 0) for k in set(spent) | set(stopped)}
    rec = reconcile(before["counts"], after["counts"], paid)
    return rec | {"audit": spent, "source": before["source"], "replayed": replayed,
                  "stopped": {k: v for k, v in stopped.items() if v} or None}


def reconciliation_line(rec: dict[str, Any]) -> str:
    """The reconciliation in one sentence (the terminal and the report)."""
    if rec.get("server") is None:
        return f"queries {rec.get('note', 'not reconcilable')}: {rec.get('audit')}"
    verdict = "equal" if rec["equal"] else ("NOT EQUAL (another client may share the key"
                                            + (" or the model" if rec.get("source") == V2_STATS else "") + ")")
    stopped = (f" + spent by a part stopped midway and run again: {rec['stopped']}" if rec.get("stopped") else "")
    if rec.get("replayed"):
        stopped += (f" ({rec['replayed']:,} of them paid by a part stopped midway and given back from its answer "
                    "journal)")
    return (f"server's count over the audit ({rec.get('source') or V1_CHARGES}; at the end less at the start): "
            f"{rec['server']}; the audit's ledgers: {rec['audit']}{stopped}: {verdict}")


def _check_answers(victim: str, key: str | None, dataset: str | None, kinds: Sequence[str], top_k: int) -> None:
    """Refuse, before any query, an answer kind the remote victim (this key) does not serve."""
    from stealkit.extract.common import open_victim

    for kind in kinds:
        try:
            _close(open_victim(victim, mode=kind, budget=0, top_k=top_k, key=key, dataset=dataset))
        except InputError as exc:
            raise InputError(f"--answers {kind}: {victim} does not serve it to this key ({exc}); audit the "
                             "answer kinds it serves") from None


def _victim_shape(victim: str, key: str | None, dataset: str | None) -> tuple[int, int]:
    """The victim's number of classes and input size (pixels x channels), read without a query (a model's
    metadata, a server's /v1/info)."""
    from stealkit.extract.common import open_victim

    v = open_victim(victim, mode="label", budget=0, key=key, dataset=dataset)
    close = getattr(v.oracle, "close", None)
    if close is not None:
        close()
    return v.num_classes, math.prod(v.input_shape)


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
