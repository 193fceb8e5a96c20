"""The README results rows that regenerate from a benchmark's raw rows once those rows are committed.

Each :class:`Figure` names its README row (by the row's link, ``docs/results.md#ANCHOR``), the rows files it reads
(``results/rows/STEM.jsonl`` with ``STEM.meta.json``, written by the benchmark's ``--jsonl``) and a function
giving the ``docs/results.md`` block ``<!-- BEGIN rows:NAME -->`` and the README's figures from them.
``benchmarks/results_tables.py --check`` regenerates every figure whose files exist and compares; a figure
whose files are absent is skipped, and said to be, only while its README row says "no raw rows".
Figures come from what the rows hold: nothing here knows a result.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evidence import (  # noqa: E402
    accuracy_difference,
    hierarchical_interval,
    median_ratio,
    seed_interval,
    stack,
    t_interval,
    unpack_bits,
    verdict,
)

ROOT = Path(__file__).resolve().parents[1]
#: where the rows are read from (tests point it at a folder of tiny rows)
ROWS = ROOT / "results" / "rows"
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def load(stem: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = ROWS / f"{stem}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta_path = ROWS / f"{stem}.meta.json"
    return rows, json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}


def footer(meta: dict[str, Any], label: str = "") -> list[str]:
    keys = ("command", "plan", "commit", "date", "device", "torch", "seeds", "images", "data", "load")
    head = [f"Rows {label}:"] if label else []
    return ["", *head, *[f"- command: `{meta[k]}`" if k == "command" else f"- {k}: {meta[k]}"
                         for k in keys if k in meta]]


def _span(values: list[float], fmt: str = ".3f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def _words(verdicts: list[str]) -> str:
    return verdicts[0] if len(set(verdicts)) == 1 else " / ".join(verdicts)


@dataclass(frozen=True)
class Figure:
    """One README row's figures: its ``docs/results.md`` anchor, the rows files, the block and the cells."""

    name: str  #: the docs/results.md block ``rows:NAME``
    anchor: str  #: the README row's link ``docs/results.md#ANCHOR``
    files: tuple[str, ...]  #: the stems of its rows files under results/rows/
    make: Callable[[], tuple[str, list[str]]]  #: the block's text and the README figures

    def missing(self) -> list[str]:
        """What keeps it from regenerating: a rows file not there, or one without its meta (a run not finished:
        the meta is written after the last row)."""
        out = []
        for s in self.files:
            if not (ROWS / f"{s}.jsonl").exists():
                out.append(f"results/rows/{s}.jsonl not committed")
            elif not (ROWS / f"{s}.meta.json").exists():
                out.append(f"results/rows/{s}.jsonl has no .meta.json (its run has not finished)")
        return out

    def present(self) -> bool:
        return not self.missing()


# -- surrogate extraction ------------------------------------------------------------------------------------------

def surrogate_probs() -> tuple[str, list[str]]:
    """ours-default against ART's best thief at each budget (docs/results.md#surrogate-probs)."""
    from results_tables import _surrogate

    rows, meta = load("surrogate-fmnist-probs")
    ours_means, art_means, every, verdicts = [], [], [], []
    for budget in sorted({int(r["budget"]) for r in rows}):
        cell = [r for r in rows if int(r["budget"]) == budget]
        ours = sorted((r for r in cell if r["attack"] == "ours-default"), key=lambda r: r["seed"])
        arts: dict[str, list[dict[str, Any]]] = {}
        for r in cell:
            if str(r["attack"]).startswith("art"):
                arts.setdefault(str(r["attack"]), []).append(r)
        best = sorted(max(arts.values(), key=lambda rs: statistics.fmean(r["accuracy"] for r in rs)),
                      key=lambda r: r["seed"])
        ours_means.append(statistics.fmean(r["accuracy"] for r in ours))
        art_means.append(statistics.fmean(r["accuracy"] for r in best))
        every.append(all(o["accuracy"] > a["accuracy"] for o, a in zip(ours, best, strict=True)))
        si = seed_interval(accuracy_difference, stack(ours), stack(best))
        verdicts.append(verdict(si.lo, si.hi))
    higher = "higher in every seed" if all(every) else "not higher in every seed"
    cells = [" / ".join(f"{m:.3f}" for m in ours_means),
             f"ART's best thief at the same epochs {' / '.join(f'{m:.3f}' for m in art_means)}; {higher}, "
             f"{_words(verdicts)}"]
    return _surrogate(rows, meta), cells


def surrogate_10k() -> tuple[str, list[str]]:
    """The default's student over the victim with the whole pool answered (docs/results.md#surrogate-10k)."""
    rows, meta = load("surrogate-fmnist-10k")
    out = ["| answers | budget | seeds | ours, per seed | victim | x victim |", "|---|---|---|---|---|---|"]
    ratios = {}
    for mode, budget in sorted({(r["mode"], int(r["budget"])) for r in rows if r["attack"] == "ours-default"}):
        runs = sorted((r for r in rows if (r["mode"], int(r["budget"])) == (mode, budget)
                       and r["attack"] == "ours-default"), key=lambda r: r["seed"])
        victim = float(unpack_bits(runs[0]["victim_correct"], int(runs[0]["n_test"])).mean())
        mean = statistics.fmean(r["accuracy"] for r in runs)
        ratios[mode] = mean / victim  # the largest budget's, where a file holds several
        seeds = ", ".join(str(r["seed"]) for r in runs)
        each = " / ".join(f"{r['accuracy']:.4f}" for r in runs)
        out.append(f"| {mode} | {runs[0]['budget']:,} | {seeds} | {mean:.4f} ({each}) | {victim:.4f} | "
                   f"{ratios[mode]:.3f} |")
    names = {"label": "labels", "probs": "probabilities"}
    cell = ", ".join(f"{names.get(m, m)} {v:.3f}x" for m, v in ratios.items()) + " the victim"
    return "\n".join(out + footer(meta)), [cell]


# -- data-free: CoDFe against DaST --------------------------------------------------------------------------------

def codfe_dast() -> tuple[str, list[str]]:
    """CoDFe and DaST as published at equal substitute updates, per seed (docs/results.md#datafree-codfe-dast)."""
    codfe, cmeta = load("datafree-codfe-digits")
    dast, dmeta = load("datafree-dast-digits")
    out = ["| answers | seed | CoDFe (queries) | DaST (queries) | CoDFe higher |", "|---|---|---|---|---|"]
    spans, every = {}, []
    for mode in ("probs", "label"):
        c = {r["seed"]: r for r in codfe if r["mode"] == mode}
        d = {r["seed"]: r for r in dast if r["mode"] == mode}
        seeds = sorted(set(c) & set(d))
        for s in seeds:
            higher = c[s]["final_accuracy"] > d[s]["final_accuracy"]
            every.append(higher)
            out.append(f"| {mode} | {s} | {c[s]['final_accuracy']:.3f} ({c[s]['queries']['predict']:,}) | "
                       f"{d[s]['final_accuracy']:.3f} ({d[s]['queries']['predict']:,}) | {'yes' if higher else 'no'} |")
        spans[mode] = (_span([c[s]["final_accuracy"] for s in seeds]), _span([d[s]["final_accuracy"] for s in seeds]))
    higher = "CoDFe higher in every seed" if all(every) else f"CoDFe higher in {sum(every)} of {len(every)} runs"
    cells = [f"probabilities {spans['probs'][0]}, labels {spans['label'][0]}",
             f"DaST {spans['probs'][1]} / {spans['label'][1]}; {higher}"]
    return "\n".join(out + footer(cmeta, "CoDFe") + footer(dmeta, "DaST")), cells


# -- exact recovery --------------------------------------------------------------------------------------------------

def exact_recovery() -> tuple[str, list[str]]:
    """Algorithm 1 with the secant search per setting, and ART's output-only attack (docs/results.md#exact-recovery)."""
    rows, meta = load("exact-recovery")
    goal = 1e-6
    settings = sorted({(r["net"], r["d"], r["h"]) for r in rows})
    out = ["| net | d | h | secant: recovered | median queries | worst error | ART: models | ART runs cut by the "
           "timeout |", "|---|---|---|---|---|---|---|---|"]
    oks, medians, worst = [], [], []
    for s in settings:
        mine = [r for r in rows if (r["net"], r["d"], r["h"]) == s and r["variant"] == "secant"]
        art = [r for r in rows if (r["net"], r["d"], r["h"]) == s and r["variant"] == "art"]
        ok = sum(r["max_rel_error"] is not None and r["max_rel_error"] <= goal for r in mine)
        oks.append((ok, len(mine)))
        medians.append(statistics.median(r["queries"] for r in mine))
        errs = [r["max_rel_error"] for r in mine if r["max_rel_error"] is not None]
        worst.append(max(errs) if errs else float("inf"))
        art_ok = sum(r["max_rel_error"] is not None and r["max_rel_error"] <= goal for r in art)
        cut = sum(r.get("stopped") == "timeout" for r in art)
        out.append(f"| {s[0]} | {s[1]} | {s[2]} | {ok}/{len(mine)} | {medians[-1]:,.0f} | {worst[-1]:.1e} | "
                   f"{art_ok}/{len(art)} | {cut}/{len(art)} |")
    art_all = [r for r in rows if r["variant"] == "art"]
    art_ok = sum(r["max_rel_error"] is not None and r["max_rel_error"] <= goal for r in art_all)
    cut = sum(r.get("stopped") == "timeout" for r in art_all)
    n = oks[0][1]
    every = all(o == (n, n) for o in oks)
    ours = (f"{n}/{n} attack seeds on that one network in every setting" if every else
            f"{min(o for o, _ in oks)}-{max(o for o, _ in oks)}/{n} attack seeds on that one network per setting")
    queries = _span(medians, ",.0f")
    cells = [f"{ours}, error ≤ {max(worst):.1e}, {queries} queries",
             f"ART (output-only) {'no model' if not art_ok else f'{art_ok} models'}; {cut} of {len(art_all)} runs "
             f"cut by a {meta.get('art_timeout', '?'):g} s timeout"]
    return "\n".join(out + footer(meta)), cells


# -- gradient matching -----------------------------------------------------------------------------------------------

def _reach(curve: list[dict[str, Any]], target: float) -> tuple[int | None, int | None]:
    """The first grid point at or above ``target`` and the grid point before it (the crossing lies between)."""
    for i, p in enumerate(curve):
        if p["accuracy"] >= target:
            return int(p["n"]), int(curve[i - 1]["n"]) if i else None
    return None, None


def gradient_matching() -> tuple[str, list[str]]:
    """Queries to 0.95x the victim with gradients and with membership only (docs/results.md#gradient-matching)."""
    rows, meta = load("gradient-matching-fmnist")
    seeds = sorted({r["seed"] for r in rows})
    out = ["| seed | victim | target | gradients: queries to target | membership only | membership over "
           "gradients (the crossings lie between grid points) |", "|---|---|---|---|---|---|"]
    grads, membs, los, his = [], [], [], []
    for s in seeds:
        g = next(r for r in rows if r["seed"] == s and r["kind"] == "gradient")
        m = next(r for r in rows if r["seed"] == s and r["kind"] == "membership")
        (gq, gprev), (mq, mprev) = _reach(g["curve"], g["target"]), _reach(m["curve"], m["target"])
        grads.append(gq)
        membs.append(mq)
        if gq and mq and gprev and mprev:
            lo, hi = mprev / gq, mq / gprev
            los.append(lo)
            his.append(hi)
            ratio = f"{lo:g}x to {hi:.3g}x"
        else:
            ratio = "not bounded on this grid"
        out.append(f"| {s} | {g['victim_accuracy']:.4f} | {g['target']:.3f} | {gq or 'not reached'} | "
                   f"{f'{mq:,}' if mq else 'not reached'} | {ratio} |")
    if all(grads) and all(membs) and len(los) == len(seeds):
        m_text = f"{min(membs):,}" if min(membs) == max(membs) else f"{min(membs):,}-{max(membs):,}"
        cells = [f"gradients {_span([float(x) for x in grads], '.0f')}",
                 f"membership-only {m_text}: {min(los):g}-{max(his):.3g}x more (grid resolution)"]
    else:
        cells = ["a curve did not reach the target on this grid"]
    return "\n".join(out + footer(meta)), cells


# -- HopSkipJump with a substitute ---------------------------------------------------------------------------------

def decision_substitute() -> tuple[str, list[str]]:
    """stealkit-hsj-sub against ART's full run, with the substitute's queries (docs/results.md#decision-substitute)."""
    rows, meta = load("decision-substitute-fmnist")
    sub = [r for r in rows if r["tool"] == "stealkit-hsj-sub" and r.get("l2")]
    budgets = sorted({int(r["budget"]) for r in sub})
    budget = 2000 if 2000 in budgets else budgets[-1]
    mine = sorted((r for r in sub if int(r["budget"]) == budget), key=lambda r: r["seed"])
    art = sorted((r for r in rows if r["tool"] == "art-hsj" and str(r["budget"]) == "full" and r.get("l2")),
                 key=lambda r: r.get("repeat", r["seed"]))
    a = np.array([[np.inf if v is None else v for v in r["l2"]] for r in mine], dtype=float)
    b = np.array([[np.inf if v is None else v for v in r["l2"]] for r in art], dtype=float)
    ours = statistics.fmean(r["median_l2"] for r in mine)
    anchor = statistics.fmean(r["median_l2"] for r in art)
    si = seed_interval(median_ratio, a, b)
    n, subq = a.shape[1], int(meta["substitute"]["queries"])
    art_q = statistics.fmean(r["mean_queries"] for r in art)
    per_image = statistics.fmean(r["mean_queries"] for r in mine)
    share_n = art_q / ((n * per_image + subq) / n)
    share_1000 = art_q / (per_image + subq / 1000)
    word = _WORDS.get(len(mine), str(len(mine)))
    out = ["| tool | budget / image | seeds | median L2 (mean over seeds) | queries / image with the substitute's | "
           "ratio to ART [95 % CI, seed-level] | verdict |", "|---|---|---|---|---|---|---|",
           f"| stealkit-hsj-sub | {budget:,} | {len(mine)} | {ours:.3f} | {per_image:,.0f} + {subq:,} / {n} | "
           f"{si.estimate:.3f} [{si.lo:.3f}, {si.hi:.3f}] | {verdict(si.lo, si.hi, 1.0, higher_is_better=False)} |",
           f"| ART HopSkipJump, full run | - | {len(art)} | {anchor:.3f} | {art_q:,.0f} | - | - |"]
    cells = [f"{ours:.3f} median L2 (mean over {word} seeds of the median over the images",
             f"1/{share_n:.1f} of ART's queries with the substitute's {subq:,}, 1/{share_1000:.1f} at 1,000 images",
             f"ART's full run {anchor:.3f}: {verdict(si.lo, si.hi, 1.0, higher_is_better=False)}"]
    return "\n".join(out + footer(meta)), cells


# -- speed: PGD, certification, the oracle and HTTP ------------------------------------------------------------------

def _ratio_verdict(ours: list[float], theirs: list[float]) -> tuple[str, float, float]:
    """Time ratio ours/theirs paired by repeat: its t-interval over the repeats and "level" where it holds 1."""
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    _, lo, hi = t_interval(ratios)
    return verdict(lo, hi, 1.0, higher_is_better=False), lo, hi


def pgd_speed() -> tuple[str, list[str]]:
    """PGD's median time per library and batch, paired by repeat (docs/results.md#pgd-speed)."""
    rows, meta = load("pgd-speed-fmnist-cpu")
    batches = sorted({r["batch"] for r in rows})
    libs = sorted({r["library"] for r in rows})

    def times(lib: str, b: int) -> list[float]:
        return [r["seconds"] for r in sorted(rows, key=lambda r: r["repeat"]) if r["library"] == lib and r["batch"] == b]

    out = ["| batch | " + " | ".join(f"{lib} median s" for lib in libs) + " | stealkit / torchattacks [95 % CI over "
           "repeats] |", "|---" * (len(libs) + 2) + "|"]
    verdicts = []
    for b in batches:
        cmp = "not measured"
        if "torchattacks" in libs:
            word, lo, hi = _ratio_verdict(times("stealkit", b), times("torchattacks", b))
            verdicts.append(word)
            cmp = f"[{lo:.3f}, {hi:.3f}] ({word})"
        out.append(f"| {b} | " + " | ".join(f"{statistics.median(times(lib, b)):.2f}" for lib in libs) + f" | {cmp} |")
    ours = " / ".join(f"{statistics.median(times('stealkit', b)):.2f}" for b in batches)
    cells = [f"CPU {ours} s"]
    if "torchattacks" in libs:
        theirs = " / ".join(f"{statistics.median(times('torchattacks', b)):.2f}" for b in batches)
        cells.append(f"torchattacks CPU {theirs} s ({_words(verdicts)})")
    return "\n".join(out + footer(meta)), cells


def certify_art() -> tuple[str, list[str]]:
    """Cohen certified accuracy of stealkit and ART on the same images (docs/results.md#certify-art)."""
    rows, meta = load("certify-fmnist-art")
    acc = {r["certifier"]: r for r in rows if r["part"] == "accuracy" and not r.get("error")}
    radii = (0.0, 0.25, 0.5, 0.75, 1.0)

    def right(r: dict[str, Any], radius: float) -> np.ndarray:
        return np.array([lb == t and lb != -1 and rd >= radius for t, lb, rd in
                         zip(r["y"], r["labels"]["cohen"], r["radii"]["cohen"], strict=True)])

    out = ["| certifier | " + " | ".join(f"r = {x:g}" for x in radii) + " |", "|---" * (len(radii) + 1) + "|"]
    for name in ("stealkit", "art"):
        out.append(f"| {name} | " + " | ".join(f"{right(acc[name], x).mean():.3f}" for x in radii) + " |")
    words = []
    for x in (0.5, 1.0):
        _, lo, hi = hierarchical_interval(accuracy_difference, right(acc["stealkit"], x)[None],
                                          right(acc["art"], x)[None])
        words.append(verdict(lo, hi))
    out.append(f"\nDifference at r = 0.5 / 1.0, bootstrap over the images (one Monte-Carlo seed): {' / '.join(words)}.")
    ours, art = (" / ".join(f"{right(acc[n], x).mean():.3f}" for x in (0.5, 1.0)) for n in ("stealkit", "art"))
    cells = [ours, f"ART {art}: {_words(words)}"]
    return "\n".join(out + footer(meta)), cells


def certify_speed() -> tuple[str, list[str]]:
    """Images/s of stealkit and ART at equal batch, interleaved repeats (docs/results.md#certify-speed)."""
    rows, meta = load("certify-fmnist-speed")
    timed = [r for r in rows if r["part"] == "equal-batch" and not r.get("error")]
    out = ["| batch | stealkit images/s (median) | ART images/s (median) | ratio |", "|---|---|---|---|"]
    ratios = []
    for b in sorted({r["batch"] for r in timed}):
        med = {n: statistics.median(r["images_per_second"] for r in timed if r["batch"] == b and r["certifier"] == n)
               for n in ("stealkit", "art")}
        ratios.append(med["stealkit"] / med["art"])
        out.append(f"| {b} | {med['stealkit']:.2f} | {med['art']:.2f} | {ratios[-1]:.2f}x |")
    return "\n".join(out + footer(meta)), [f"{_span(ratios, '.1f')}x ART's images/s at equal batch"]


def oracle_http() -> tuple[str, list[str]]:
    """The oracle's images/s over the bare forward; HTTP over in-process (docs/results.md#oracle-overhead)."""
    rows, meta = load("oracle-overhead-fmnist")
    http, hmeta = load("http-throughput-fmnist")
    med = {v: statistics.median(r["images_per_s"] for r in rows if r["variant"] == v) for v in
           sorted({r["variant"] for r in rows})}
    ratios = {v: m / med["bare_forward"] for v, m in med.items() if v != "bare_forward"}
    out = ["| variant | images/s (median over repeats) | over the bare forward |", "|---|---|---|",
           *[f"| {v} | {m:,.1f} | {m / med['bare_forward']:.3f} |" for v, m in med.items()], "",
           "| transport | workers | batch | images/s | p50 ms | fraction of in-process |", "|---|---|---|---|---|---|",
           *[f"| {r['transport']} | {r['workers']} | {r['batch']} | {r['images_per_s']:,.1f} | {r['p50_ms']:.1f} | "
             f"{r['fraction_of_local']:.2f} |" for r in http]]
    big = max(r["batch"] for r in http)
    frac = {r["workers"]: r["fraction_of_local"] for r in http if r["transport"] == "http" and r["batch"] == big}
    workers = " / ".join(f"{frac[w]:.2f} ({w} worker{'s' if w > 1 else ''})" for w in sorted(frac))
    cells = [f"{_span(list(ratios.values()))}x the bare forward; HTTP {workers} of in-process"]
    return "\n".join(out + footer(meta, "oracle") + footer(hmeta, "HTTP")), cells


FIGURES: tuple[Figure, ...] = (
    Figure("surrogate-fmnist-probs", "surrogate-probs", ("surrogate-fmnist-probs",), surrogate_probs),
    Figure("surrogate-fmnist-10k", "surrogate-10k", ("surrogate-fmnist-10k",), surrogate_10k),
    Figure("datafree-codfe-dast", "datafree-codfe-dast", ("datafree-codfe-digits", "datafree-dast-digits"), codfe_dast),
    Figure("exact-recovery", "exact-recovery", ("exact-recovery",), exact_recovery),
    Figure("gradient-matching-fmnist", "gradient-matching", ("gradient-matching-fmnist",), gradient_matching),
    Figure("decision-substitute-fmnist", "decision-substitute", ("decision-substitute-fmnist",), decision_substitute),
    Figure("pgd-speed-fmnist-cpu", "pgd-speed", ("pgd-speed-fmnist-cpu",), pgd_speed),
    Figure("certify-fmnist-art", "certify-art", ("certify-fmnist-art",), certify_art),
    Figure("certify-fmnist-speed", "certify-art", ("certify-fmnist-speed",), certify_speed),
    Figure("oracle-http", "oracle-overhead", ("oracle-overhead-fmnist", "http-throughput-fmnist"), oracle_http),
)
