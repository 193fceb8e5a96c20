"""Decision-based L2 attacks, stealkit (with and without a stolen substitute) against ART, side by side.

Per data set (``digits``, ``fashion-mnist``): the standard victim (``standard_victim("<short>-conv2")``)
behind a label-only oracle; a substitute stolen from it by stealkit's baseline extraction (label queries on
the attacker pool, its query cost printed); ``--n`` test images the victim classifies correctly (a seeded
sample; ``--val`` further, disjoint images form the validation set that ``--tune`` uses, never the reported
ones). Rows:

* ``stealkit-hsj`` / ``stealkit-hsj-sub`` / ``stealkit-boundary`` / ``stealkit-boundary-sub``: one run per
  per-image budget (``--budgets``, ``--max-queries`` of the CLI), queries from the ledger; HopSkipJump with
  the validated settings of ``attack hopskipjump --preset tuned`` (:func:`stealkit.evade.decision_based.hopskipjump.tuned_settings`).
* ``stealkit-hsj-prev``: the tuned settings before the third round (``start_tries=100, semicircle=True``, the
  second round's preset); ``stealkit-hsj-r3``: the third round's preset (before the Triangle Attack opening).
* ``stealkit-ta``: the Triangle Attack (:mod:`stealkit.evade.decision_based.triangle`, Wang et al. ECCV 2022) with the
  settings chosen on the validation images (:data:`stealkit.evade.decision_based.triangle.TUNED`); ``stealkit-ta-paper``:
  with the reference code's (HopSkipJump with the Triangle Attack as its opening is the HopSkipJump setting
  ``opening``).
* ``stealkit-hsj-paper`` / ``stealkit-hsj-paper-sub``: the same with the paper's settings (``--preset paper``).
* ``stealkit-hsj-art-settings``: stealkit HopSkipJump with ART's settings (40 rounds, at most 1,000
  evaluations per estimate, 100 initial), no cap; ``stealkit-hsj-tuned-art-settings``: the same work with the
  ``--preset tuned`` settings (the queries/s comparison of the current preset).
* ``art-hsj`` (40 iterations, max_eval 1,000, init_eval 100, init_size 100) and ``art-boundary``
  (500 iterations, untargeted, ART's other defaults): ART's full run, one image per ``generate`` call. ART
  keeps no query count, so its victim is wrapped in a module that counts every image and remembers the
  nearest adversarial image asked about so far; "ART at budget B" is that anytime best after B queries.
  ART 1.20.1 draws HopSkipJump's start from an unseeded ``np.random.RandomState()``, so one ART run is not
  reproducible across invocations; ``--art-repeats R`` runs ``art-hsj`` R times in the invocation (repeat ``r``:
  numpy and the start draws seeded ``r``, reproducible), spread over the seeds' loops between the stealkit rows,
  and reports the mean and sample std of its full-run median over the repeats beside each stealkit row's mean
  over seeds (``art_anchor`` in the JSON, a table in ``--table``).

Every row reports median L2 over successes, success rate, mean and max queries per image and wall time; the
JSON also holds the L2-vs-queries curve of every tool. Run one data set at a time on a quiet machine:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decision_attacks.py --dataset digits --seeds 0,1
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decision_attacks.py --dataset fashion-mnist --val 30 \
        --tune-budget 5000 --tune '[{"start_tries": 100}, {"start_tries": 100, "init_evals": 50}]'
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

SHORT = {"digits": "digits", "fashion-mnist": "fmnist"}
ART_HSJ = {"max_iter": 40, "max_eval": 1000, "init_eval": 100, "init_size": 100}
#: stealkit's LocalOracle forward chunk (``None``: its device default) and ART HopSkipJump's ``batch_size``
#: (64, ART's default); ``--oracle-chunk`` / ``--art-batch`` set them, every row records both
CHUNKS: dict[str, int | None] = {"oracle_chunk": None, "art_batch": 64}
ART_BOUNDARY = {"max_iter": 500}
#: the ``--preset tuned`` settings without a substitute before the third round (orthogonal probes, GeoDA's
#: allocation) was adopted
PREVIOUS_TUNED = {"start_tries": 100, "semicircle": True}
#: the third round's ``--preset tuned`` without a substitute, with a per-image budget
THIRD_ROUND = {"start_tries": 100, "semicircle": True, "orthogonal": True, "schedule": "geoda", "init_evals": 50,
               "max_evals": 10_000}


class Recorder(nn.Module):
    """Wraps the victim for ART: counts images and keeps the anytime best adversarial L2 of one image."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.reset(None, None)

    def reset(self, x: torch.Tensor | None, y: int | None) -> None:
        self.x, self.y, self.count, self.best = x, y, 0, float("inf")
        self.curve: list[tuple[int, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        with torch.no_grad():
            out = self.model(x)
        if self.x is not None:
            adv = out.argmax(1) != self.y
            for i in adv.nonzero().squeeze(1).tolist():
                d = float((x[i] - self.x).norm())
                if d < self.best:
                    self.best = d
                    self.curve.append((self.count + i + 1, d))
            self.count += x.shape[0]
        return out


def at_budget(curve: list[tuple[int, float]], budget: int) -> float:
    best = float("inf")
    for q, d in curve:
        if q > budget:
            break
        best = d
    return best


def summarise(name: str, budget: int | str, norms: list[float], queries: list[int], seconds: float,
              seed: int) -> dict[str, Any]:
    ok = [d for d in norms if d != float("inf")]
    return {"tool": name, "budget": budget, "seed": seed, "median_l2": statistics.median(ok) if ok else None,
            "geo_mean_l2": math.exp(statistics.fmean(math.log(d) for d in ok)) if ok else None,
            "success": len(ok) / len(norms), "mean_queries": statistics.fmean(queries), "max_queries": max(queries),
            "seconds": round(seconds, 2), "queries_per_s": round(sum(queries) / seconds) if seconds else None,
            # per image, in the order of the attacked images (None: no adversarial point found), so that runs on
            # disjoint image sets can be pooled into one median afterwards
            "l2": [round(d, 6) if d != float("inf") else None for d in norms]}


def steal(victim_dir: str, pool_size: int, epochs: int, log: Any, cache: Path | None = None
          ) -> tuple[nn.Module, dict[str, Any]]:
    """A substitute stolen by stealkit's baseline extraction (kept in ``cache`` so a rerun spends nothing)."""
    from safetensors.torch import load_file, save_file

    from stealkit.extract.common import make_evaluator, open_victim, student_factory, victim_splits
    from stealkit.extract.surrogate_data.baseline import BaselineConfig, extract_baseline
    from stealkit.train import TrainConfig

    v = open_victim(victim_dir, mode="label")
    if cache is not None and (cache / "info.json").exists():
        student = student_factory("conv2", v, 0)()
        student.load_state_dict(load_file(str(cache / "student.safetensors")))
        info = json.loads((cache / "info.json").read_text())
        log(f"substitute (cached in {cache}): {info}")
        return student.eval(), info
    splits = victim_splits(v)
    pool = splits.attacker_pool.x[:pool_size]
    t0 = time.perf_counter()
    r = extract_baseline(v.oracle, pool, make_student=student_factory("conv2", v, 0),
                         evaluator=make_evaluator(v, splits.test.x, splits.test.y),
                         config=BaselineConfig(checkpoints=(pool.shape[0],),
                                               train=TrainConfig(epochs=epochs, batch_size=64)))
    info = {"method": "baseline (labels)", "queries": r.queries["predict"], "accuracy": r.accuracy,
            "fidelity": r.fidelity, "victim_accuracy": r.victim_accuracy, "epochs": epochs,
            "seconds": round(time.perf_counter() - t0, 1)}
    log(f"substitute: {info}")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        save_file({k: t.contiguous() for k, t in r.student.state_dict().items()}, str(cache / "student.safetensors"))
        (cache / "info.json").write_text(json.dumps(info))
    return r.student.eval(), info


def pick_images(model: nn.Module, test: Any, n: int, val: int, offset: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` reported and ``val`` validation images (disjoint) that the victim classifies correctly.

    In a fixed seeded order of the test split's correctly classified images, the reported ones are
    ``[offset, offset + n)`` (``offset`` 0: the first ``n``) and the validation ones ``[n, n + val)``; an
    ``offset`` past every validation set used so far gives a fresh reported set."""
    if offset and offset < n + val and offset + n > n:
        raise SystemExit(f"--offset {offset}: the reported images [{offset}, {offset + n}) overlap the validation "
                         f"images [{n}, {n + val}); use an offset of at least {n + val}")
    size = 4 * (max(offset + n, n + val))
    perm = torch.randperm(len(test.y), generator=torch.Generator().manual_seed(1234))
    x, y = test.x[perm[:size]], test.y[perm[:size]]
    with torch.no_grad():
        ok = (model(x).argmax(1) == y).nonzero().squeeze(1)
    rep, va = ok[offset : offset + n], ok[n : n + val]
    return x[rep], y[rep], x[va], y[va]


def add_validation_arguments(p: argparse.ArgumentParser, *, val: int) -> None:
    """``--dataset``, ``--n`` and ``--val`` as the diagnostics that run on this benchmark's validation images take them."""
    p.add_argument("--dataset", default="fashion-mnist", choices=sorted(SHORT))
    p.add_argument("--n", type=int, default=12, help="reported images skipped before the validation ones")
    p.add_argument("--val", type=int, default=val)


def validation_images(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The standard conv2 victim of ``args.dataset`` (eval mode, one torch thread) and the ``args.val`` validation
    images after the ``args.n`` reported ones (:func:`pick_images`): what every validation-only diagnostic uses."""
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    torch.set_num_threads(1)
    model = standard_victim(f"{SHORT[args.dataset]}-conv2").model.eval()
    _, _, xv, yv = pick_images(model, load_splits(args.dataset).test, args.n, args.val)
    return model, xv, yv


def run_stealkit(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int | None, cfg: Any,
                 sub: nn.Module | None, pool: torch.Tensor | None = None, starts: list[float] | None = None
                 ) -> tuple[list[float], list[int], float]:
    """One stealkit run; ``pool``: the attacker's images for HopSkipJump's ``start_pool``; ``starts`` (a list)
    receives HopSkipJump's per-image L2 when its rounds begin."""
    from stealkit.evade.decision_based.boundary import boundary_attack
    from stealkit.evade.decision_based.hopskipjump import hopskipjump
    from stealkit.oracle import LocalOracle

    oracle = LocalOracle(model, tuple(x.shape[1:]), mode="label", batch_size=CHUNKS["oracle_chunk"])
    t0 = time.perf_counter()
    if isinstance(cfg, TriangleRun):
        from stealkit.evade.decision_based.triangle import TriangleConfig, triangle

        r = triangle(oracle, x, y, max_queries=budget, config=TriangleConfig(**cfg.triangle))
    else:
        if kind == "hsj":
            r = hopskipjump(oracle, x, y, max_queries=budget, config=cfg, substitute=sub, start_pool=pool)
            if starts is not None:
                starts.extend(float(v) for v in r.extra["start_norms"])
        else:
            r = boundary_attack(oracle, x, y, max_queries=budget, config=cfg, substitute=sub)
    secs = time.perf_counter() - t0
    per = r.extra["queries_per_example"].tolist()
    assert sum(per) == oracle.ledger.total
    norms = [float(d) if bool(s) else float("inf") for d, s in zip(r.norms, r.success, strict=True)]
    return norms, per, secs


def pool_starts(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int, seed: int, pool: torch.Tensor
                ) -> tuple[torch.Tensor, list[int]]:
    """The pool starts alone (a noise start, its binary search, then :data:`TUNED_POOL`'s pool tries; no
    opening, no rounds), for ART's ``x_adv_init``: ``(points, stealkit ledger queries per image)``."""
    from stealkit.evade.decision_based.hopskipjump import TUNED_POOL, hopskipjump
    from stealkit.oracle import LocalOracle

    oracle = LocalOracle(model, tuple(x.shape[1:]), mode="label", batch_size=CHUNKS["oracle_chunk"])
    r = hopskipjump(oracle, x, y, max_queries=budget, config=hsj_config(seed, iterations=0, **TUNED_POOL),
                    start_pool=pool)
    per = r.extra["queries_per_example"].tolist()
    assert sum(per) == oracle.ledger.total and bool(r.success.all())
    return r.x_adv, per


def run_art(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int, k: int,
            inits: torch.Tensor | None = None, seeded_starts: bool = False
            ) -> tuple[list[list[tuple[int, float]]], list[int], float]:
    """ART's full run per image; ``inits``: HopSkipJump's ``x_adv_init`` (starting points given to ART);
    ``seeded_starts``: ART's unseeded start draws seeded from ``seed`` and the image (:func:`seeded_start_draws`)."""
    import numpy as np
    from art.attacks.evasion import BoundaryAttack, HopSkipJump
    from art.estimators.classification import PyTorchClassifier

    rec = Recorder(model)
    clf = PyTorchClassifier(rec, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]), nb_classes=k,
                            clip_values=(0.0, 1.0))
    if kind == "hsj":
        attack = HopSkipJump(clf, targeted=False, norm=2, verbose=False, batch_size=CHUNKS["art_batch"], **ART_HSJ)
    else:
        attack = BoundaryAttack(clf, targeted=False, verbose=False, **ART_BOUNDARY)
    curves, counts = [], []
    np.random.seed(seed)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    for i in range(x.shape[0]):
        rec.reset(x[i], int(y[i]))
        onehot = np.eye(k, dtype=np.float32)[[int(y[i])]]
        extra = {} if inits is None else {"x_adv_init": inits[i : i + 1].numpy().copy()}
        with seeded_start_draws(seed * 1_000_003 + i) if seeded_starts else contextlib.nullcontext():
            attack.generate(x[i : i + 1].numpy(), y=onehot, **extra)
        curves.append(rec.curve)
        counts.append(rec.count)
    return curves, counts, time.perf_counter() - t0


@contextlib.contextmanager
def seeded_start_draws(seed: int) -> Iterator[None]:
    """ART 1.20.1's HopSkipJump draws its start from ``np.random.RandomState()`` (``_init_sample``: unseeded, so
    ``np.random.seed`` does not fix it; its estimates draw from the global ``np.random``, which does). Inside this
    block an unseeded ``RandomState()`` is seeded with ``seed`` (same distribution, reproducible draws)."""
    import numpy as np

    base = np.random.RandomState

    class Seeded(base):  # type: ignore[misc, valid-type]
        def __init__(self, s: Any = None) -> None:
            super().__init__(seed if s is None else s)

    np.random.RandomState = Seeded  # type: ignore[misc]
    try:
        yield
    finally:
        np.random.RandomState = base  # type: ignore[misc]


@dataclass(frozen=True)
class TriangleRun:
    """Triangle Attack settings (``triangle``: TriangleConfig fields)."""

    triangle: dict[str, Any]


def hsj_config(seed: int, **kw: Any) -> Any:
    """HopSkipJump settings; with ``triangle`` (TriangleConfig fields) a :class:`TriangleRun` (the Triangle Attack
    alone; as HopSkipJump's opening it is the HopSkipJump setting ``opening``)."""
    from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig

    if "triangle" in kw:
        return TriangleRun(dict(kw.pop("triangle")) | {"seed": seed})
    return HopSkipJumpConfig(**({"iterations": 10_000, "max_evals": 1000, "seed": seed} | kw))


def boundary_config(seed: int, **kw: Any) -> Any:
    from stealkit.evade.decision_based.boundary import BoundaryConfig

    return BoundaryConfig(**({"steps": 100_000, "seed": seed} | kw))


def tune(model: nn.Module, sub: nn.Module, xv: torch.Tensor, yv: torch.Tensor, budget: int, configs: list[Any],
         seeds: list[int], k: int, log: Any, pool: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """Each of ``configs`` (HopSkipJumpConfig fields; ``"substitute": true`` to use the substitute; ``"start_pool":
    N`` for the first N images of the attacker pool ``pool`` as HopSkipJump's start pool; ``{"art": true}`` for
    ART's HopSkipJump full run, the reference) on the validation images at one budget, per seed: the median and
    the geometric mean of the L2 over images (and the median L2 when HopSkipJump's rounds begin)."""
    rows = []
    for extra in configs:
        kw = dict(extra)
        with_sub = bool(kw.pop("substitute", False))
        n_pool = int(kw.pop("start_pool", 0))
        if n_pool and pool is None:
            raise SystemExit("start_pool needs the attacker pool")
        meds, gms, start_meds = [], [], []
        t0 = time.perf_counter()
        load = round(os.getloadavg()[0], 2)
        for seed in seeds:
            if kw.get("art"):
                curves, _, _ = run_art("hsj", model, xv, yv, seed, k)
                norms = [c[-1][1] if c else float("inf") for c in curves]
            else:
                starts: list[float] = []
                norms, _, _ = run_stealkit("hsj", model, xv, yv, budget, hsj_config(seed, **kw),
                                           sub if with_sub else None,
                                           pool[:n_pool] if n_pool and pool is not None else None, starts)
                fin = [s for s in starts if s != float("inf")]
                start_meds.append(round(statistics.median(fin), 4) if fin else None)
            ok = [d for d in norms if d != float("inf")]
            meds.append(round(statistics.median(ok), 4) if ok else None)
            gms.append(round(math.exp(statistics.fmean(math.log(d) for d in ok)), 4) if ok else None)
        row = {"config": extra, "budget": budget, "median_l2": meds, "geo_mean_l2": gms,
               "start_median_l2": start_meds, "seeds": seeds,
               "success": len(ok) / len(norms), "seconds": round(time.perf_counter() - t0, 1),
               "load_avg": [load, round(os.getloadavg()[0], 2)]}
        log(f"tune {json.dumps(row)}")
        rows.append(row)
    return rows


def anchor(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """With ``--art-repeats``: ART HopSkipJump's full-run median L2 over the repeats (mean, sample std, each
    repeat's) and each stealkit row's mean over seeds (per tool and budget) beside it, as a relative
    difference; None without repeated ART rows."""
    art = [r["median_l2"] for r in rows if r["tool"] == "art-hsj" and r["budget"] == "full" and "repeat" in r
           and r["median_l2"] is not None]
    if not art:
        return None
    mean = statistics.fmean(art)
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["tool"].startswith("stealkit-") and r["median_l2"] is not None:
            groups.setdefault((r["tool"], str(r["budget"])), []).append(r["median_l2"])
    beside = [{"tool": t, "budget": b, "median_l2_mean": statistics.fmean(v), "seeds": len(v),
               "vs_art": statistics.fmean(v) / mean - 1} for (t, b), v in sorted(groups.items())]
    return {"art_median_l2_mean": mean, "art_median_l2_std": statistics.stdev(art) if len(art) > 1 else 0.0,
            "art_median_l2": art, "repeats": len(art), "stealkit": beside}


def table(path: str) -> str:
    """Markdown tables from a ``--jsonl`` file: per data set, tool and budget the mean over seeds of the median
    L2 (min-max over seeds in brackets), success, mean queries per image and queries per second."""
    with open(path) as fh:
        rows = [json.loads(line) for line in fh]
    out = []
    for ds in sorted({r["dataset"] for r in rows}):
        out += [f"\n### {ds}\n", "| tool | budget / image | median L2 (seeds) | geo. mean L2 | success | "
                "queries / image | queries/s | seeds |", "|---|---|---|---|---|---|---|---|"]
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            if r["dataset"] == ds:
                groups.setdefault((r["tool"], str(r["budget"])), []).append(r)
        order = {b: int(b) if b.isdigit() else 10**9 for _, b in groups}
        for (tool, budget), g in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
            meds = [r["median_l2"] for r in g if r["median_l2"] is not None]
            med = f"{statistics.fmean(meds):.3f} ({min(meds):.3f}-{max(meds):.3f})" if meds else "-"
            gms = [r["geo_mean_l2"] for r in g if r.get("geo_mean_l2") is not None]
            gm = f"{statistics.fmean(gms):.3f}" if gms else "-"
            qps = [r["queries_per_s"] for r in g if r.get("queries_per_s")]
            rate = f"{statistics.fmean(qps):.0f}" if qps else "-"
            label = f"{budget} (anytime)" if g[0].get("anytime") else budget
            out.append(f"| {tool} | {label} | {med} | {gm} | {statistics.fmean(r['success'] for r in g):.2f} | "
                       f"{statistics.fmean(r['mean_queries'] for r in g):.0f} | {rate} | {len(g)} |")
        anc = anchor([r for r in rows if r["dataset"] == ds])
        if anc is not None:
            out += [f"\nART HopSkipJump's full run, {anc['repeats']} repeats in this invocation: median L2 "
                    f"{anc['art_median_l2_mean']:.3f} (sample std {anc['art_median_l2_std']:.3f}; repeats "
                    + ", ".join(f"{v:.3f}" for v in anc["art_median_l2"]) + "); each stealkit row beside it:\n",
                    "| tool | budget / image | median L2, mean of the seeds | seeds | vs ART's mean |", "|---|---|---|---|---|"]
            out += [f"| {a['tool']} | {a['budget']} | {a['median_l2_mean']:.3f} | {a['seeds']} | {100 * a['vs_art']:+.1f}% |"
                    for a in anc["stealkit"]]
        budgets = sorted({b for _, b in groups}, key=lambda b: order.get(b, 99))
        out += [f"\nL2-vs-queries curve ({ds}, median L2 at each per-image budget, mean over seeds):\n",
                "| tool | " + " | ".join(budgets) + " |", "|---" * (len(budgets) + 1) + "|"]
        for tool in sorted({t for t, _ in groups}):
            cells = []
            for b in budgets:
                meds = [r["median_l2"] for r in groups.get((tool, b), []) if r["median_l2"] is not None]
                cells.append(f"{statistics.fmean(meds):.3f}" if meds else "")
            out.append(f"| {tool} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits", choices=sorted(SHORT))
    p.add_argument("--n", type=int, default=20, help="reported images")
    p.add_argument("--offset", type=int, default=0,
                   help="reported images start at this position of the seeded order (0: the first --n); past "
                        "every validation set (e.g. 400) gives a fresh set never used for tuning")
    p.add_argument("--val", type=int, default=10, help="validation images (for --tune), disjoint from the reported")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--budgets", default="500,1000,2000,5000,10000")
    p.add_argument("--tools", default="hsj,hsj-sub,boundary,boundary-sub,hsj-art-settings,art-hsj,art-boundary")
    p.add_argument("--pool", type=int, default=10_000, help="substitute: attacker-pool images queried (at most)")
    p.add_argument("--sub-epochs", type=int, default=10)
    p.add_argument("--start-pool", type=int, default=10_000,
                   help="attacker-pool images for the hsj-pool / art-hsj-pool rows and --tune's start_pool (at most)")
    p.add_argument("--tune", default=None, metavar="JSON",
                   help="only run these HopSkipJump settings on the validation images, e.g. "
                        "'[{\"start_tries\": 100}, {\"start_tries\": 100, \"substitute\": true}]'")
    p.add_argument("--tune-budget", default="2000", help="per-image budget(s) for --tune, e.g. 1000,5000")
    p.add_argument("--oracle-chunk", type=int, default=None,
                   help="stealkit's oracle forward chunk (default: the device default, 256 for 28x28 conv victims on a CPU)")
    p.add_argument("--art-batch", type=int, default=64, help="ART HopSkipJump's batch_size (default 64, ART's own)")
    p.add_argument("--art-repeats", type=int, default=0, metavar="R",
                   help="art-hsj: ART's full run R times in this invocation (repeat r: numpy seeded r, ART's start "
                        "draws seeded too), spread over the seeds' loops; the mean and std of its median over the "
                        "repeats is the anchor every stealkit row is compared with (0: one run per seed, as before)")
    p.add_argument("--jsonl", default=None, help="also append each row here as soon as it is measured (and write its "
                   ".meta.json at the end: benchmarks/rowmeta.py)")
    p.add_argument("--table", default=None, metavar="JSONL", help="only print markdown tables of a --jsonl file")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.art_repeats < 0 or (args.art_repeats and "art-hsj" not in args.tools.split(",")):
        raise SystemExit("--art-repeats R needs R >= 0 and art-hsj in --tools")
    CHUNKS.update(oracle_chunk=args.oracle_chunk, art_batch=args.art_batch)
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.set_num_threads(1)
    trained = standard_victim(f"{SHORT[args.dataset]}-conv2")
    model = trained.model.eval()
    k = int(trained.spec.num_classes)
    from stealkit.chunking import forward_chunk

    CHUNKS["oracle_chunk_used"] = args.oracle_chunk or forward_chunk(model, tuple(trained.spec.input_shape), "cpu")
    cache = Path("runs/decision_bench") / f"sub-{args.dataset}-{args.pool}-{args.sub_epochs}"
    sub, sub_info = steal(str(trained.path), args.pool, args.sub_epochs, log, cache)
    test = load_splits(args.dataset).test
    x, y, xv, yv = pick_images(model, test, args.n, args.val, args.offset)
    meta = {"dataset": args.dataset, "victim": f"{SHORT[args.dataset]}-conv2", "n": int(x.shape[0]), "offset": args.offset,
            "val": int(xv.shape[0]), "substitute": sub_info, "torch": torch.__version__,
            "machine": f"{platform.machine()} {os.cpu_count()} cores", "load_avg": os.getloadavg(),
            "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M")}
    seeds = [int(s) for s in args.seeds.split(",")]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    row_meta = None if args.tune else rowmeta.start(
        args.jsonl, seeds=args.seeds, victim=meta["victim"], substitute=sub_info,
        art_repeats=args.art_repeats, images=f"{int(x.shape[0])} test images from offset {args.offset}",
        data={"attacked images": x})
    # the attacker's own unlabelled images (disjoint from the test split the attacked images come from)
    attacker_pool = load_splits(args.dataset).attacker_pool.x[: args.start_pool]
    if args.tune:
        rows = [r for b in args.tune_budget.split(",")
                for r in tune(model, sub, xv, yv, int(b), json.loads(args.tune), seeds, k, log, attacker_pool)]
        print(json.dumps(meta | {"tune_budget": args.tune_budget, "tune": rows}, indent=1))
        return 0
    rows: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    budgets = [int(b) for b in args.budgets.split(",")]
    tools = args.tools.split(",")

    def emit(row: dict[str, Any]) -> None:
        row = row | {"load_avg": [round(v, 2) for v in os.getloadavg()], "n": int(x.shape[0]), "offset": args.offset} | CHUNKS
        log(json.dumps(row))
        rows.append(row)
        if args.jsonl:
            with open(args.jsonl, "a") as fh:
                fh.write(json.dumps(row | {"dataset": args.dataset}) + "\n")

    from stealkit.evade.decision_based import triangle
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    for si, seed in enumerate(seeds):
        cfgs = {"hsj": hsj_config(seed, **tuned_settings(substitute=False, budgeted=True, shape=tuple(x.shape[1:]))),
                "hsj-pool": hsj_config(seed, **tuned_settings(substitute=False, budgeted=True, pool=True,
                                                              shape=tuple(x.shape[1:]))),
                "hsj-sub": hsj_config(seed, **tuned_settings(substitute=True)),
                "hsj-prev": hsj_config(seed, **PREVIOUS_TUNED), "hsj-r3": hsj_config(seed, **THIRD_ROUND),
                "hsj-paper": hsj_config(seed), "hsj-paper-sub": hsj_config(seed),
                "boundary": boundary_config(seed), "boundary-sub": boundary_config(seed),
                "ta": hsj_config(seed, triangle=triangle.TUNED), "ta-paper": hsj_config(seed, triangle={})}
        for tool in tools:
            if tool in cfgs:
                kind = "hsj" if tool.startswith("hsj") else "boundary"
                for b in budgets:
                    norms, per, secs = run_stealkit(kind, model, x, y, b, cfgs[tool],
                                                    sub if tool.endswith("-sub") else None,
                                                    attacker_pool if tool == "hsj-pool" else None)
                    emit(summarise(f"stealkit-{tool}", b, norms, per, secs, seed))
            elif tool in ("hsj-art-settings", "hsj-tuned-art-settings"):
                preset = tuned_settings(substitute=False) if tool == "hsj-tuned-art-settings" else {}
                cfg = hsj_config(seed, **(preset | {"iterations": 40, "max_evals": 1000, "init_evals": 100}))
                norms, per, secs = run_stealkit("hsj", model, x, y, None, cfg, None)
                emit(summarise(f"stealkit-{tool}", "full", norms, per, secs, seed))
            elif tool == "art-hsj-pool":  # ART from the pool starts (paid by stealkit, counted apart)
                inits, start_q = pool_starts(model, x, y, max(budgets), seed, attacker_pool)
                art_curves, counts, secs = run_art("hsj", model, x, y, seed, k, inits)
                curves[f"{tool}/{seed}"] = art_curves
                emit(summarise(tool, "full", [c[-1][1] if c else float("inf") for c in art_curves], counts, secs,
                               seed) | {"start_queries_mean": statistics.fmean(start_q),
                                        "start_median_l2": statistics.median((inits - x).flatten(1).norm(dim=1)
                                                                             .tolist())})
            elif tool.startswith("art-"):
                kind = tool.removeprefix("art-")
                # --art-repeats R: ART's full run R times (repeat r seeded r), spread over the seeds' loops
                runs = [(seed, {})] if not (args.art_repeats and tool == "art-hsj") else \
                    [(r, {"repeat": r}) for r in range(si, args.art_repeats, len(seeds))]
                for art_seed, tag in runs:
                    art_curves, counts, secs = run_art(kind, model, x, y, art_seed, k, seeded_starts=bool(tag))
                    curves[f"{tool}/{art_seed}"] = art_curves
                    emit(summarise(tool, "full", [c[-1][1] if c else float("inf") for c in art_curves], counts, secs,
                                   art_seed) | tag)
                    for b in budgets:
                        emit(summarise(tool, b, [at_budget(c, b) for c in art_curves], [min(b, n) for n in counts],
                                       secs, art_seed) | {"anytime": True, "seconds": None, "queries_per_s": None} | tag)
    rowmeta.finish(row_meta)
    print(json.dumps(meta | {"settings": {"art_hsj": ART_HSJ, "art_boundary": ART_BOUNDARY,
                                          "stealkit_hsj_paper": repr(hsj_config(0)),
                                          "stealkit_hsj_tuned": tuned_settings(substitute=False, budgeted=True,
                                                                               shape=tuple(x.shape[1:])),
                                          "stealkit_hsj_sub_tuned": tuned_settings(substitute=True),
                                          "stealkit_ta_tuned": triangle.TUNED},
                             "rows": rows, "art_anchor": anchor(rows), "art_curves": curves}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
