"""The audit's explanation parts (Milli et al. 2019), when the victim serves input-gradient explanations:
gradient matching (Sec. 4-5: queries to a copy with 0.95x the victim's accuracy) and, for a two-layer ReLU
victim, exact recovery (Sec. 3, Algorithm 1), through :mod:`stealkit.extract.explanations.run`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit.parts import (
    PART_SECONDS,
    TOLERANCE,
    Copy,
    Part,
    PlanContext,
    RunContext,
    close,
    kind_of,
    pct,
)

if TYPE_CHECKING:
    from stealkit.oracle.victim import Target
    from stealkit.report.html import Section

#: gradient matching's target, the reconstruction's test accuracy over the victim's (Milli et al. 2019, Sec. 5:
#: "0.95x the victim")
GRADMATCH_TARGET = 0.95
#: training minibatches per rung, and rough seconds per minibatch (double back-propagation, conv2, one shared CPU
#: thread): ``a + b * pixels`` (measured: 8 ms on digits' 64 pixels, 76 ms on Fashion-MNIST's 784: 141 s for the
#: rungs 30,100,300)
GRADMATCH_STEPS = 600
GRADMATCH_STEP_SECONDS = (0.002, 9.4e-5)
#: exact recovery's budget: queries per hidden unit (``stealkit extract exact --victim standard:digits-mlp2``, h =
#: 128, spent 15,738 = 6,199 predict + 9,539 explain on all 40 search lines) up to a cap (--exact-budget), and
#: rough seconds per query
EXACT_QUERIES_PER_UNIT = 125
EXACT_QUERY_SECONDS = 0.0005


@dataclass(frozen=True)
class ExplainAccess:
    """What the victim gives the explanation attacks, read without a query: ``why_not`` (``None`` when it serves
    gradient explanations with probabilities, else why not), ``hidden`` (the hidden width of a two-layer ReLU
    victim, else ``None``) and ``why_not_exact``; ``pixels`` sizes the time estimate."""

    why_not: str | None
    hidden: int | None
    why_not_exact: str
    pixels: int


def explanation_access(target: Target) -> ExplainAccess:
    """A local model serves explanations when torch has its gradients (a model directory, a TorchScript file or a
    module; an ONNX file does not); a ``stealkit serve`` key when its ``explain`` is true and it may ask for
    probabilities; an Open Inference Protocol (v2) endpoint never. Exact recovery: a local ``mlp2`` (a two-layer
    ReLU network, its hidden width from the model spec)."""
    from stealkit.extract.explanations.run import spec_hidden
    from stealkit.oracle.http_v2 import is_v2

    v = target.open(mode="label", budget=0)
    try:
        pixels = math.prod(v.input_shape)
        info = getattr(v.oracle, "info", None)
        if v.model is not None:
            spec = v.spec
            onnx = getattr(spec, "format", None) == "onnx"
            why = "an ONNX victim gives no gradients (onnxruntime)" if onnx else None
            arch = getattr(spec, "arch", None)
            hidden = spec_hidden(spec)
            why_exact = "" if hidden is not None else (
                f"the victim is {arch}, not a two-layer ReLU network (mlp2)" if arch else
                "the model file does not say it is a two-layer ReLU network (mlp2)")
            return ExplainAccess(why, None if why else hidden, why or why_exact, pixels)
        if is_v2(target.location) or info is None:
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
        close(v)


def _access(ctx: PlanContext) -> ExplainAccess:
    if "explain" not in ctx.memo:
        ctx.memo["explain"] = explanation_access(ctx.target)
    return ctx.memo["explain"]


def gradmatch_seconds(ladder: Sequence[int], pixels: int) -> float:
    """A rough time for the gradient-matching part: :data:`GRADMATCH_STEPS` minibatches per rung."""
    a, b = GRADMATCH_STEP_SECONDS
    return PART_SECONDS + len(ladder) * GRADMATCH_STEPS * (a + b * pixels)


def reach_point(curve: Sequence[dict[str, Any]], target: float | None) -> dict[str, Any] | None:
    """The first point of a gradient-matching curve (in queries) whose reconstruction's test accuracy reached
    ``target`` (0.95x the victim's), or ``None``; its ``queries`` are the ledger's (answers and explanations)."""
    if target is None:
        return None
    for p in sorted(curve, key=lambda p: p["queries"]):
        if p.get("accuracy") is not None and p["accuracy"] >= target - TOLERANCE:
            return dict(p)
    return None


def explanations_section(summary: dict[str, Any]) -> list[Section]:
    """The report's section on explanations (once, for both kinds), with gradient matching's curve."""
    from stealkit.report.html import Figure, Section
    from stealkit.report.plots import line_plot

    if not summary.get("explanations"):
        return []
    sec = Section("Explanations: gradient matching and exact recovery", paragraphs=[
        "When the API serves explanations (input gradients), `stealkit extract gradient-matching` (Milli et al. "
        "2019, Sec. 4: the gradient and membership losses) trains a copy on the answers and explanations of "
        "the attacker's data, scored at each rung; the figure is the queries (one answer and one explanation "
        "per input, from the ledger) to reach 0.95x the victim's test accuracy. `stealkit extract exact` "
        "(Sec. 3, Algorithm 1) recovers a two-layer ReLU network from gradient queries."],
        tables=[("", summary["explanations"])])
    for r in summary.get("parts") or []:
        if kind_of(r) == "gradmatch" and r.get("curve"):
            series = {"gradient matching, test accuracy": ([p["queries"] for p in r["curve"]],
                                                          [p["accuracy"] for p in r["curve"]])}
            hl = {"0.95x victim": r["target_accuracy"]} if r.get("target_accuracy") is not None else {}
            sec.figures.append(Figure(line_plot(series, xlabel="victim queries: answers + explanations (ledger)",
                                                ylabel="test accuracy", logx=True, hlines=hl, ylim=(0, 1.02)),
                                      "Gradient matching: the copy's test accuracy against queries"))
    return [sec]


class GradientMatching:
    """``gradmatch``: gradient matching (probabilities and gradient explanations) scored at each rung of
    ``ladder`` (inputs queried; ``budget`` = 2 x the top rung: one predict and one explain query per input)."""

    name = "gradmatch"
    claim = "room"
    needs_copy = False
    makes_copy = False

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        if not ctx.sizes.gradmatch:
            return [], []
        access = _access(ctx)
        if access.why_not is not None:
            return [], [f"the explanation attacks (gradient matching, exact recovery) left out: {access.why_not}"]
        ladder = tuple(sorted(set(ctx.sizes.gradmatch)))
        budget = 2 * ladder[-1]
        if budget > room:
            return [], [f"gradient matching left out: its ladder {','.join(map(str, ladder))} needs {budget:,} "
                        f"queries (one answer and one explanation per input), the plan leaves {max(room, 0):,}"]
        source = ctx.options.pool if ctx.shape.features else "pool"  # a feature-vector victim: the owner's rows
        return [Part("probs", "explanations", source, budget, round(gradmatch_seconds(ladder, access.pixels), 1),
                     kind=self.name, ladder=ladder)], []

    def part_id(self, part: Part) -> str:
        return "gradient-matching-" + "-".join(map(str, part.ladder))

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        from stealkit.extract.explanations.run import GradMatchOptions, run_gradient_matching
        from stealkit.rundir import rounded, to_jsonable

        run = run_gradient_matching(ctx.target, max(part.ladder), checkpoints=part.ladder, out=out,
                                    options=GradMatchOptions(pool=part.pool))
        queries = dict(run.queries)
        # the figures as the run's summary.json keeps them (rounded), the audit's since the first version
        victim_accuracy = rounded(run.victim_accuracy)
        target = None if victim_accuracy is None else GRADMATCH_TARGET * victim_accuracy
        curve = rounded(to_jsonable(list(run.result.curve)))
        return {"queries": queries, "total_queries": sum(queries.values()), "accuracy": rounded(run.accuracy),
                "fidelity": rounded(run.fidelity), "victim_accuracy": victim_accuracy, "served_accuracy": None,
                "command": f"stealkit extract gradient-matching --victim {ctx.target.location} --budget "
                           f"{max(part.ladder)} --checkpoints {','.join(map(str, part.ladder))} --seed "
                           f"{ctx.options.seed} --out {out} --device {ctx.options.device}",
                "curve": curve, "target_accuracy": target, "reached": reach_point(curve, target)}

    def progress(self, result: dict[str, Any]) -> str:
        hit = result.get("reached")
        return (f"0.95x the victim's accuracy at {hit['queries']:,} queries" if hit else
                "0.95x the victim's accuracy not reached") + f", accuracy {pct(result['accuracy'])}"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for r in results:
            if kind_of(r) != self.name:
                continue
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
        return {"explanations": rows}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        out = []
        for r in summary.get("explanations") or []:
            q = r["queries to target"]
            if r["attack"].startswith("gradient matching") and isinstance(q, int):
                out.append(f"If your API also serves input-gradient explanations, gradient matching with data like "
                           f"yours gets a copy with 0.95x your model's accuracy from {q:,} queries ({r['answers']:,} "
                           f"answers and {r['explanations']:,} explanations).")
        return out

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return explanations_section(summary)


class ExactRecovery:
    """``exact``: exact recovery of a two-layer ReLU victim of hidden width ``n`` under ``budget``."""

    name = "exact"
    claim = "room"
    needs_copy = False
    makes_copy = False

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        if not ctx.sizes.exact_budget:
            return [], []
        access = _access(ctx)
        if access.why_not is not None:
            if ctx.sizes.gradmatch:
                return [], []  # gradient matching's note says why
            return [], [f"the explanation attacks (gradient matching, exact recovery) left out: {access.why_not}"]
        if access.hidden is None:
            return [], [f"exact recovery left out: {access.why_not_exact}"]
        budget = min(ctx.sizes.exact_budget, EXACT_QUERIES_PER_UNIT * access.hidden)
        if budget > room:
            return [], [f"exact recovery left out: its budget {budget:,} ({EXACT_QUERIES_PER_UNIT} queries per "
                        f"hidden unit, h = {access.hidden}, capped by --exact-budget) is more than the "
                        f"{max(room, 0):,} the plan leaves"]
        return [Part("logits", "explanations", "", budget, round(PART_SECONDS + budget * EXACT_QUERY_SECONDS, 1),
                     kind=self.name, n=access.hidden)], []

    def part_id(self, part: Part) -> str:
        return f"exact-recovery-h{part.n}-{part.budget}"

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        """A recovery that fails or runs out of budget is a result ("not recovered within N"), its queries still
        the ledger's."""
        from stealkit.errors import BudgetExhausted
        from stealkit.extract.explanations.exact_access import RecoveryFailure
        from stealkit.extract.explanations.run import open_exact, run_exact

        v = open_exact(ctx.target, budget=part.budget)
        failure, run = None, None
        try:
            run = run_exact(ctx.target, hidden=part.n, budget=part.budget, out=out, victim=v)
        except (BudgetExhausted, RecoveryFailure) as exc:
            failure = str(exc).splitlines()[0]
        finally:
            close(v)
        queries = v.oracle.ledger.as_dict()
        extra = run.result.extra if run is not None else {}
        return {"queries": queries, "total_queries": sum(queries.values()),
                "accuracy": run.accuracy if run else None, "fidelity": run.fidelity if run else None,
                "victim_accuracy": run.victim_accuracy if run else None, "served_accuracy": None,
                "command": f"stealkit extract exact --hidden {part.n} --budget {part.budget}",
                "recovered": failure is None, "failure": failure, "hidden_found": extra.get("hidden_found"),
                "max_relative_error_test": extra.get("max_relative_error_test")}

    def progress(self, result: dict[str, Any]) -> str:
        if not result.get("recovered"):
            return f"not recovered ({result.get('failure')})"
        return f"fidelity {pct(result['fidelity'])}, accuracy {pct(result['accuracy'])}"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for r in results:
            if kind_of(r) != self.name:
                continue
            q = r["queries"]
            rows.append({"attack": f"exact recovery (two-layer ReLU, h = {r['part']['n']})",
                         "target": "a functionally equivalent copy",
                         "queries to target": r["total_queries"] if r.get("recovered") else
                         f"not recovered within {r['part']['budget']:,}",
                         "answers": q.get("predict", 0), "explanations": q.get("explain", 0),
                         "accuracy": r.get("accuracy"), "fidelity": r.get("fidelity"),
                         "queries spent": r["total_queries"]})
        return {"explanations": rows}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        out = []
        for r in summary.get("explanations") or []:
            q = r["queries to target"]
            if r["attack"].startswith("exact") and isinstance(q, int):
                fid = "" if r["fidelity"] is None else f" (fidelity {100 * r['fidelity']:.1f} %)"
                out.append(f"Your model is a two-layer ReLU network: from its gradients an attacker recovers a "
                           f"functionally equivalent copy{fid} with {q:,} queries.")
        return out

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return [] if any(kind_of(r) == "gradmatch" for r in summary.get("parts") or []) else \
            explanations_section(summary)
