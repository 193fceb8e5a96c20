"""Diagnostic for QEBA-I probes: how much of the true boundary normal lies in the top-k principal subspace of
the attacker's own unlabelled images, against the same k of low-frequency DCT and of a random subspace.

Li, Xu, Zhang, Yang & Li, "QEBA: Query-Efficient Boundary-Based Blackbox Attack" (CVPR 2020), Sec. 3.3
("intrinsic component" subspace, QEBA-I): the probes of the HopSkipJump estimator are drawn in the span of the
top principal components of natural images of the domain. Before building it, this script asks whether that
span holds the normal of this victim at the points the attack visits.

It runs ``--preset tuned`` HopSkipJump with the start pool (``TUNED_POOL``) on the validation images (as
``decision_attacks.py --val``) and records every round's boundary point and the queries each image had spent by
then. Then, **as a white-box diagnostic only** (never used by an attack), at the first recorded point of each
image at or after each of ``--at`` queries, the victim's true input gradient ``g`` of the adversarial margin
``max_{j != y} z_j - z_y``, and the energy share ``||P g||^2 / ||g||^2`` for ``P`` the projection on: the top-k
principal components of the pool (centred, ``--pool`` images of the attacker split), the k lowest 2-D DCT
frequencies (ordered by ``i + j``, then ``max(i, j)``), and a random k-dimensional subspace (``k / d`` on
average; one draw per image shown). ``--simulate w1,w2``: at the same points, one estimate at a flat boundary of
normal ``g`` with the round's probe count, the preset's orthogonal probes against a share ``w`` of them in the
PCA subspace (the estimator over all probes: ``mix``; the best weighting of the two parts knowing ``g``:
``split_best``; :func:`shared_subspace_diag.simulate`), median cosine with ``g``.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice -n 5 .venv/bin/python benchmarks/pca_subspace_diag.py --val 40 \
        --k 25,50,100,200 --at 1000,3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch


def energy(basis: torch.Tensor, g: torch.Tensor) -> float:
    """``||B^T g||^2 / ||g||^2`` for an orthonormal basis ``B`` [d, k]."""
    return float((basis.T @ g).pow(2).sum() / g.pow(2).sum().clamp_min(1e-30))


def dct_basis(h: int, w: int, k: int) -> torch.Tensor:
    """The ``k`` lowest 2-D DCT basis images of an ``h x w`` channel as orthonormal columns [h*w, k]."""
    from stealkit.evade.decision_based.subspace import dct_matrix

    dh, dw = dct_matrix(h).double(), dct_matrix(w).double()
    order = sorted(((i, j) for i in range(h) for j in range(w)), key=lambda p: (p[0] + p[1], max(p), p[0]))[:k]
    return torch.stack([torch.outer(dh[i], dw[j]).flatten() for i, j in order], 1)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, "benchmarks")
    import decision_attacks as bench
    from stealkit.data import load_splits
    from stealkit.evade.decision_based import hopskipjump as hsj
    from stealkit.evade.decision_based.hopskipjump import tuned_settings
    from stealkit.evade.decision_based.pca_subspace import pca_basis

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_validation_arguments(p, val=40)
    p.add_argument("--budget", type=int, default=5800)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=10_000, help="attacker-pool images: the start pool and the PCA")
    p.add_argument("--k", default="25,50,100,200")
    p.add_argument("--at", default="1000,3000", help="queries spent per image at the points scored")
    p.add_argument("--simulate", default="", help="shares w for the flat-boundary simulation, e.g. 0.1,0.3,0.5")
    args = p.parse_args(argv)
    model, xv, yv = bench.validation_images(args)
    pool = load_splits(args.dataset).attacker_pool.x[: args.pool].float()
    rec: list[tuple[list[int], torch.Tensor, list[int], list[int]]] = []
    original = hsj._Run._estimate

    def recorded(self: Any, best: torch.Tensor, idx: torch.Tensor, evals: torch.Tensor, t: int) -> Any:
        rec.append((idx.tolist(), best[idx].clone(), self.access.used[idx].tolist(), evals.tolist()))
        return original(self, best, idx, evals, t)

    hsj._Run._estimate = recorded  # type: ignore[method-assign]
    t0 = time.perf_counter()
    settings = tuned_settings(substitute=False, budgeted=True, pool=True, shape=tuple(xv.shape[1:]))
    norms, _, _ = bench.run_stealkit("hsj", model, xv, yv, args.budget, bench.hsj_config(args.seed, **settings),
                                     None, pool)
    hsj._Run._estimate = original  # type: ignore[method-assign]
    run_s = time.perf_counter() - t0
    shape = tuple(xv.shape[1:])
    d = xv[0].numel()
    ks = [int(s) for s in args.k.split(",")]
    t1 = time.perf_counter()
    pca = pca_basis(pool, max(ks)).double()
    pca_s = time.perf_counter() - t1
    c, h, w = shape
    gen = torch.Generator().manual_seed(args.seed)
    out: dict[str, Any] = {"images": xv.shape[0], "budget": args.budget, "pool": pool.shape[0], "d": d,
                           "median_l2": statistics.median(norms), "run_seconds": round(run_s, 1),
                           "pca_seconds": round(pca_s, 2), "rows": []}
    for at in (int(a) for a in args.at.split(",")):
        points: dict[int, torch.Tensor] = {}
        spent: dict[int, int] = {}
        probes: dict[int, int] = {}
        for ids, pts, used, n_t in rec:
            for j, i in enumerate(ids):
                if i not in points and used[j] >= at:
                    points[i], spent[i], probes[i] = pts[j], used[j], n_t[j]
        ids = sorted(points)
        if not ids:  # no round begins this late (GeoDA's last planned round takes what is left)
            print(json.dumps({"at": at, "images": 0}), file=sys.stderr, flush=True)
            continue
        xb = torch.stack([points[i] for i in ids]).detach().requires_grad_(True)
        z = model(xb)
        yy = yv[ids]
        own = z.gather(1, yy.view(-1, 1)).squeeze(1)
        other = z.scatter(1, yy.view(-1, 1), float("-inf")).amax(1)
        (grad,) = torch.autograd.grad((other - own).sum(), xb)
        gs = grad.flatten(1).double()
        for k in ks:
            dct = torch.block_diag(*[dct_basis(h, w, -(-k // c))] * c)[:, :k] if c > 1 else dct_basis(h, w, k)
            rnd = [torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0] for _ in ids]
            row = {"at": at, "k": k, "images": len(ids), "queries_median": statistics.median(spent.values()),
                   "pca": round(statistics.median(energy(pca[:, :k], g) for g in gs), 4),
                   "dct": round(statistics.median(energy(dct, g) for g in gs), 4),
                   "random": round(statistics.median(energy(r, g) for r, g in zip(rnd, gs, strict=True)), 4),
                   "random_expected": round(k / d, 4),
                   "pca_mean": round(statistics.fmean(energy(pca[:, :k], g) for g in gs), 4),
                   "dct_mean": round(statistics.fmean(energy(dct, g) for g in gs), 4)}
            shares = [float(v) for v in args.simulate.split(",") if v]
            if shares:
                from shared_subspace_diag import simulate

                sims = [simulate(g.float(), pca[:, :k].float(), probes[i], shares,
                                 torch.Generator().manual_seed(1000 * at + i)) for i, g in zip(ids, gs, strict=True)]
                row |= {f"sim_{name}": round(statistics.median(s[name] for s in sims), 4) for name in sims[0]}
                row["probes_median"] = statistics.median(probes[i] for i in ids)
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
