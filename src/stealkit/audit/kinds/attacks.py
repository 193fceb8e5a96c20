"""What the stolen copy enables: PGD transfer from the best copy at CoDFe's eps, and HopSkipJump (tuned preset)
without and with the copy as its substitute at the same per-image budget (:mod:`stealkit.evade.run`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stealkit.audit.parts import PART_SECONDS, Copy, Part, PlanContext, RunContext, kind_of, pct

if TYPE_CHECKING:
    from stealkit.report.html import Section

#: rough seconds per transfer image and per decision-attack query (digits, one CPU thread)
TRANSFER_IMAGE_SECONDS = 0.01
DECISION_QUERY_SECONDS = 0.0015


def _num(x: float | None) -> str:
    return "– (no success)" if x is None else f"{x:.3f}"


def _figures(run: Any, copy: Copy) -> dict[str, Any]:
    queries = run.queries
    return {"queries": queries, "total_queries": sum(queries.values()), "asr": run.asr, "attempts": run.attempts,
            "successes": run.successes, "copy": copy.id, "copy_fidelity": copy.fidelity}


def _command(head: list[str], part: Part, ctx: RunContext, out: Path) -> str:
    """The separate ``stealkit attack`` command that reruns a part (the API key is left out; test data given as
    arrays from Python is named as the .npz file to save them in)."""
    from stealkit.data.own import ArrayData

    o = ctx.options
    test_data = f"TEST.npz (the {o.test_data} arrays, saved with numpy.savez)" if isinstance(
        o.test_data, ArrayData) else o.test_data
    return " ".join(["stealkit attack", *head, "--victim", ctx.target.location, "--n", str(part.n), "--budget",
                     str(part.budget), "--seed", str(o.seed), "--out", str(out), "--device", o.device,
                     *(["--dataset", o.dataset] if o.dataset else []),
                     *(["--data-dir", o.data_dir] if o.data_dir else []),
                     *(["--test-data", test_data] if test_data else [])])


def _no_copy(part_id: str) -> Exception:
    from stealkit.errors import InputError

    return InputError(f"{part_id}: no stolen copy to attack from (no extraction part finished)")


class Transfer:
    """``transfer``: ``stealkit attack pgd`` from the best stolen copy at the paper's eps on ``n`` test images."""

    name = "transfer"
    claim = "fixed"
    needs_copy = True
    makes_copy = False

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        n = ctx.sizes.transfer_images
        if not n:
            return [], []
        return [Part("label", "copy", "", 2 * n, round(PART_SECONDS + n * TRANSFER_IMAGE_SECONDS, 1),
                     kind=self.name, n=n)], []

    def part_id(self, part: Part) -> str:
        return f"transfer-pgd-{part.n}"

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        from stealkit.evade.gradient_based.transfer import CODFE_PGD
        from stealkit.evade.run import run_transfer

        if copy is None:
            raise _no_copy(self.part_id(part))
        pgd = CODFE_PGD
        run = run_transfer(ctx.target, "pgd", copy.dir, n=part.n, budget=part.budget, eps=pgd["eps"],
                           steps=int(pgd["steps"]), step=pgd["step"], out=out)
        return _figures(run, copy) | {
            "command": _command(["pgd", "--substitute", copy.dir, "--eps", str(pgd["eps"]), "--steps",
                                 str(pgd["steps"]), "--step", str(pgd["step"])], part, ctx, out),
            "eps": pgd["eps"], "victim_accuracy": run.victim_accuracy,
            "substitute_agreement": run.substitute_agreement}

    def progress(self, result: dict[str, Any]) -> str:
        return f"transfer success {pct(result['asr'])} ({result['successes']}/{result['attempts']})"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        return {"enables": [{"attack": f"PGD transfer, Linf eps {r['eps']:g}", "from copy": r["copy"],
                             "copy fidelity": r.get("copy_fidelity"), "images": r["part"]["n"],
                             "attempted": r["attempts"], "success": r["asr"], "median L2": None,
                             "queries per image": 1, "queries": r["total_queries"]}
                            for r in results if kind_of(r) == self.name]}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        out = []
        for t in (r for r in summary.get("parts") or [] if kind_of(r) == self.name):
            fid = "" if t.get("copy_fidelity") is None else f", {100 * t['copy_fidelity']:.1f} % fidelity"
            out.append(f"From the best stolen copy ({t['copy']}{fid}), PGD at the paper's eps {t['eps']:g} changes "
                       f"your model's answer on {pct(t['asr'])} of the {t['attempts']:,} test images it gets right, "
                       "with one query each.")
        return out

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return enables_section(summary)


class Decision:
    """``decision``: ``stealkit attack hopskipjump`` on ``n`` test images at ``per_image`` queries each, with the
    best stolen copy as its substitute (``substitute``) or without it."""

    name = "decision"
    claim = "fixed"
    needs_copy = True
    makes_copy = False

    def plan(self, ctx: PlanContext, room: int) -> tuple[list[Part], list[str]]:
        n, q = ctx.sizes.decision_images, ctx.sizes.decision_queries
        if not (n and q):
            return [], []
        return [Part("label", "copy" if sub else "none", "", n * (q + 1),
                     round(PART_SECONDS + n * q * DECISION_QUERY_SECONDS, 1), kind=self.name, n=n, per_image=q,
                     substitute=sub) for sub in (False, True)], []

    def part_id(self, part: Part) -> str:
        return f"hopskipjump-{'with' if part.substitute else 'without'}-copy-{part.n}x{part.per_image}"

    def run(self, part: Part, ctx: RunContext, out: Path, copy: Copy | None) -> dict[str, Any]:
        from stealkit.evade.run import run_decision

        if copy is None:
            raise _no_copy(self.part_id(part))
        run = run_decision(ctx.target, "hopskipjump", max_queries=part.per_image, n=part.n, budget=part.budget,
                           substitute=copy.dir if part.substitute else None, out=out)
        return _figures(run, copy) | {
            "command": _command(["hopskipjump", "--max-queries", str(part.per_image)], part, ctx, out)
            + (f" --substitute {copy.dir}" if part.substitute else ""),
            "median_l2": run.median_l2, "median_queries_per_image": run.median_queries_per_image}

    def progress(self, result: dict[str, Any]) -> str:
        l2 = "–" if result.get("median_l2") is None else f"{result['median_l2']:.3f}"
        return f"median L2 {l2}, success {pct(result['asr'])}"

    def rows(self, results: Sequence[dict[str, Any]], kinds: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for r in results:
            if kind_of(r) != self.name:
                continue
            p = r["part"]
            rows.append({"attack": "HopSkipJump " + ("with the copy" if p["substitute"] else "without a copy"),
                         "from copy": r["copy"] if p["substitute"] else "–",
                         "copy fidelity": r.get("copy_fidelity") if p["substitute"] else None, "images": p["n"],
                         "attempted": r["attempts"], "success": r["asr"], "median L2": r.get("median_l2"),
                         "queries per image": p["per_image"], "queries": r["total_queries"]})
        return {"enables": rows}

    def sentences(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[str]:
        mine = {bool(r["part"].get("substitute")): r for r in summary.get("parts") or [] if kind_of(r) == self.name}
        if False not in mine or True not in mine:
            return []
        a, b = mine[False], mine[True]
        return [f"At {a['part']['per_image']:,} queries per image, HopSkipJump's median L2 perturbation is "
                f"{_num(a.get('median_l2'))} without a stolen copy and {_num(b.get('median_l2'))} with it."]

    def sections(self, summary: dict[str, Any], kinds: Mapping[str, Any]) -> list[Section]:
        return [] if any(kind_of(r) == "transfer" for r in summary.get("parts") or []) else enables_section(summary)


def enables_section(summary: dict[str, Any]) -> list[Section]:
    """The report's section on what the stolen copy enables (once, for both attack kinds)."""
    from stealkit.report.html import Section

    if not summary.get("enables"):
        return []
    return [Section("What the stolen copy enables", paragraphs=[
        "Transfer: `stealkit attack pgd` crafts on the best stolen copy at the paper's eps (CoDFe's transfer "
        "evaluation: PGD, Linf, random start) and sends each example once; success is over the test images "
        "the victim classifies correctly. Decision-based: `stealkit attack hopskipjump` (tuned preset) on the "
        "same test images at the same per-image budget, without a substitute and with the stolen copy as its "
        "substitute (its start and gradient prior); median L2 over the successful images."],
        tables=[("", summary["enables"])])]
