"""Diagnostic: a ceiling for HopSkipJump's boundary-normal estimator, from the victim's true normal.

**White-box, a diagnostic only; never part of an attack.** It runs ``--preset tuned`` HopSkipJump (budgeted:
the Triangle opening, noise tries, semicircle search, orthogonal probes, GeoDA's schedule) on the validation
images of ``decision_attacks.py --val`` and the same attack with the estimate of step 2 (Chen et al. 2020,
Sec. 4.1, Eq. 9 and 16) replaced by the victim's true boundary normal at the current boundary point: the unit
input gradient of the adversarial margin ``max_{j != y} z_j - z_y`` (the decision the attack crosses), as in
``shared_subspace_diag.py``. Two variants:

* ``same``, "oracle, same spend": the probes are still drawn and paid on the ledger (the same count per round,
  so the same rounds); only the direction that the search uses is replaced.
* ``cosC`` (e.g. ``cos0.9``): paid as ``same``; the direction is the unit vector at cosine ``C`` with the true
  normal in the plane of the true normal and the estimate (an estimator of that exact quality in every round).
* ``free``, "oracle, free": the estimate costs no query; every round only pays its search (a round is started
  while an image can still pay :attr:`reserve` queries), so the budget buys more rounds, at most ``--rounds``.

The attack itself is not changed: the two methods of its private round object are swapped for the duration of
a row and put back after (the same way ``shared_subspace_diag.py`` records the estimates). Every query still
goes through the oracle's ledger and the per-image cap; the gradients are taken on the local model, outside it.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/estimator_ceiling.py --val 150 --seeds 0,1 \
        --variants same,free,preset --out runs/r7/ceiling.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

VARIANTS = ("preset", "same", "free")


def true_normal(model: nn.Module, points: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Unit input gradients of ``max_{j != y} z_j - z_y`` at ``points`` (white-box; untargeted)."""
    xb = points.detach().clone().requires_grad_(True)
    z = model(xb)
    own = z.gather(1, y.view(-1, 1)).squeeze(1)
    other = z.scatter(1, y.view(-1, 1), float("-inf")).amax(1)
    (g,) = torch.autograd.grad((other - own).sum(), xb)
    return g / g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (g.dim() - 1)))


def at_cosine(g: torch.Tensor, est: torch.Tensor, c: float) -> torch.Tensor:
    """Per row, the unit vector ``c g + sqrt(1 - c^2) p``, ``p`` the estimate's unit part orthogonal to the unit
    ``g`` (its cosine with ``g`` is exactly ``c``)."""
    gf, ef = g.flatten(1), est.flatten(1)
    p = ef - (ef * gf).sum(1, keepdim=True) * gf
    p = p / p.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (c * gf + math.sqrt(max(0.0, 1 - c * c)) * p).view_as(g)


@contextlib.contextmanager
def oracle_normal(model: nn.Module, variant: str) -> Iterator[None]:
    """Swap the round object's estimate (and, for ``free``, its probe counts) for the true normal."""
    from stealkit.evade.decision_based import hopskipjump as hsj

    run_cls: Any = hsj._Run
    estimate, evals = run_cls._estimate, run_cls._evals

    def paid(self: Any, best: torch.Tensor, idx: torch.Tensor, n: torch.Tensor, t: int) -> Any:
        g = estimate(self, best, idx, n, t)  # the probes are paid exactly as in the preset
        if g is None:
            return None
        g_true = true_normal(model, best[idx.to(best.device)], self.y[idx.to(best.device)])
        return g_true if cos is None else at_cosine(g_true, g, cos)

    def free(self: Any, best: torch.Tensor, idx: torch.Tensor, n: torch.Tensor, t: int) -> Any:
        return true_normal(model, best[idx.to(best.device)], self.y[idx.to(best.device)])

    def free_evals(self: Any, idx: torch.Tensor, t: int) -> torch.Tensor:
        # a token count (>= 2 keeps the image active) while the image can still pay one search; nothing is queried
        can = self.access.left(idx) >= self.reserve
        return torch.where(can, torch.full_like(idx, 2), torch.zeros_like(idx))

    cos = float(variant[3:]) if variant.startswith("cos") else None
    try:
        if variant == "same" or cos is not None:
            run_cls._estimate = paid
        elif variant == "free":
            run_cls._estimate, run_cls._evals = free, free_evals
        yield
    finally:
        run_cls._estimate, run_cls._evals = estimate, evals


def run_row(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int, seed: int, variant: str,
            rounds: int) -> dict[str, Any]:
    """One row: the preset (or an oracle variant) on ``x`` at ``budget`` per image, queries from the ledger."""
    from stealkit.evade.decision_based.hopskipjump import HopSkipJumpConfig, hopskipjump, tuned_settings
    from stealkit.oracle import LocalOracle

    settings = tuned_settings(substitute=False, budgeted=True, shape=tuple(x.shape[1:]))
    iterations = rounds if variant == "free" else 10_000  # 10,000: as decision_attacks.hsj_config
    cfg = HopSkipJumpConfig(**({"iterations": iterations, "max_evals": 1000, "seed": seed} | settings))
    oracle = LocalOracle(model, tuple(x.shape[1:]), mode="label")
    t0 = time.perf_counter()
    with oracle_normal(model, variant):
        r = hopskipjump(oracle, x, y, max_queries=budget, config=cfg)
    secs = time.perf_counter() - t0
    per = r.extra["queries_per_example"].tolist()
    assert sum(per) == oracle.ledger.total and max(per) <= budget
    norms = [float(d) if bool(s) else math.inf for d, s in zip(r.norms, r.success, strict=True)]
    finite = [v for v in norms if math.isfinite(v)]
    gm = math.exp(statistics.fmean(math.log(v) for v in finite)) if finite else math.inf
    done = r.extra["rounds"].tolist()
    return {"variant": variant, "seed": seed, "budget": budget, "images": x.shape[0],
            "median_l2": round(statistics.median(norms), 4), "gm": round(gm, 4),
            "success": sum(map(math.isfinite, norms)), "queries_total": oracle.ledger.total,
            "queries_max": max(per), "rounds_median": statistics.median(done), "rounds_max": max(done),
            "seconds": round(secs, 1), "load": os.getloadavg()[0], "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, "benchmarks")
    import decision_attacks as bench

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_validation_arguments(p, val=150)
    p.add_argument("--budgets", default="5800")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=1000, help="round cap of the free variant")
    p.add_argument("--out", default=None, help="append one JSON row per run here")
    args = p.parse_args(argv)
    model, xv, yv = bench.validation_images(args)
    for prm in model.parameters():
        prm.requires_grad_(False)
    for seed in (int(s) for s in args.seeds.split(",")):
        for variant in args.variants.split(","):
            if variant not in VARIANTS and not variant.startswith("cos"):
                raise SystemExit(f"unknown variant {variant!r}; one of {VARIANTS}")
            for budget in (int(b) for b in args.budgets.split(",")):
                row = {"start_load": os.getloadavg()[0]} | run_row(model, xv, yv, budget, seed, variant,
                                                                     args.rounds)
                print(json.dumps(row), flush=True)
                if args.out:
                    with Path(args.out).open("a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
