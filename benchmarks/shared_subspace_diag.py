"""Diagnostic for a subspace shared across images: how much of each image's boundary normal lies in the top-k
right singular vectors of the OTHER images' normal estimates (uncentred SVD).

Runs ``--preset tuned`` HopSkipJump on the validation images (as ``decision_attacks.py``), records every
round's unit estimates and the boundary points they were made at, and, as a white-box diagnostic only (never
used by an attack), the victim's true input gradient of the adversarial margin at those points. For each image
and round ``t`` it builds ``U_k`` from the other images' estimates of rounds ``t - window + 1 .. t`` and reports
``||U_k^T g|| / ||g||`` for the true normal ``g`` and for the image's own estimate; a random ``k``-dimensional
subspace gives ``sqrt(k / d)`` on average.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/shared_subspace_diag.py --val 20 --k 10,30,60
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch


def share(basis: torch.Tensor, v: torch.Tensor) -> float:
    """``||B^T v|| / ||v||`` for an orthonormal basis ``B`` [d, k]."""
    return float((basis.T @ v).norm() / v.norm().clamp_min(1e-12))


def hsj_cos(g: torch.Tensor, u: torch.Tensor) -> tuple[float, torch.Tensor]:
    """HopSkipJump's estimate (Eq. 9 with the baseline of Eq. 16) from the sign answers of a flat boundary with
    normal ``g`` at the unit probes ``u`` [m, d]: ``(cosine with g, the estimate)``."""
    phi = torch.sign(u @ g)
    est = ((phi - phi.mean()).unsqueeze(1) * u).mean(0)
    return float(est @ g / (est.norm() * g.norm()).clamp_min(1e-12)), est


def simulate(g: torch.Tensor, basis: torch.Tensor, m: int, shares: list[float], gen: torch.Generator
             ) -> dict[str, float]:
    """Flat-boundary simulation of one estimate with ``m`` probes: the preset's orthogonal probes against a share
    ``w`` of them drawn in span(basis) (Gaussian coefficients) and the rest from the orthogonal frame, with
    HopSkipJump's estimator over all probes (``mix``) and, as an upper bound for any weighting of the two parts,
    the best combination of the subspace part's and the rest's estimates projected on span(basis) and its
    complement (``split_best``: the weights chosen knowing g)."""
    from stealkit.evade.decision_based.orthogonal import orthogonal_directions

    d = g.numel()
    frame = orthogonal_directions(m, (d,), gen, "cpu")
    out = {"iso": hsj_cos(g, frame)[0]}
    gu = g / g.norm()
    for w in shares:
        ms = round(w * m)
        sub = basis @ torch.randn(basis.shape[1], ms, generator=gen)
        u = torch.cat([(sub / sub.norm(dim=0)).T, frame[: m - ms]])
        out[f"mix{w}"] = hsj_cos(g, u)[0]
        _, e_sub = hsj_cos(g, u[:ms])
        _, e_rest = hsj_cos(g, u[ms:])
        e_sub = basis @ (basis.T @ e_sub)
        e_rest = e_rest - basis @ (basis.T @ e_rest)
        c1 = max(0.0, float(e_sub @ gu / e_sub.norm().clamp_min(1e-12)))
        c2 = max(0.0, float(e_rest @ gu / e_rest.norm().clamp_min(1e-12)))
        out[f"split_best{w}"] = math.sqrt(c1 * c1 + c2 * c2)
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, "benchmarks")
    import decision_attacks as bench
    from stealkit.evade.decision_based import hopskipjump as hsj
    from stealkit.evade.decision_based.hopskipjump import tuned_settings

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_validation_arguments(p, val=20)
    p.add_argument("--budget", type=int, default=5800)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", default="10,30,60")
    p.add_argument("--window", default="3", help="rounds of other images' estimates in the buffer (comma list)")
    p.add_argument("--eval", type=int, default=40, help="images scored (the first ones; the buffer uses all)")
    p.add_argument("--cache", default=None, help="save the recorded run here (or load it if it exists)")
    p.add_argument("--simulate", default="", help="shares w for the flat-boundary simulation, e.g. 0.3,0.5,0.7")
    p.add_argument("--per-class", action="store_true", help="U_k from the other images of the same label only")
    args = p.parse_args(argv)
    model, xv, yv = bench.validation_images(args)
    # (round, images, points, estimates, probes per image)
    rec: list[tuple[int, list[int], torch.Tensor, torch.Tensor, list[int]]] = []
    original = hsj._Run._estimate

    def recorded(self: Any, best: torch.Tensor, idx: torch.Tensor, evals: torch.Tensor, t: int) -> Any:
        g = original(self, best, idx, evals, t)
        if g is not None:
            rec.append((t, idx.tolist(), best[idx].clone(), g.clone(), evals.tolist()))
        return g

    if args.cache and Path(args.cache).exists():
        rec, norms = torch.load(args.cache)
    else:
        hsj._Run._estimate = recorded  # type: ignore[method-assign]
        settings = tuned_settings(substitute=False, budgeted=True, shape=tuple(xv.shape[1:]))
        norms, _, _ = bench.run_stealkit("hsj", model, xv, yv, args.budget, bench.hsj_config(args.seed, **settings),
                                         None)
        if args.cache:
            torch.save((rec, norms), args.cache)
    # the true normal (white-box, diagnostic only): gradient of max_{j != y} z_j - z_y at the boundary point
    est: dict[tuple[int, int], torch.Tensor] = {}
    true: dict[tuple[int, int], torch.Tensor] = {}
    evals: dict[tuple[int, int], int] = {}
    for t, ids, pts, g, n_t in rec:
        xb = pts.detach().requires_grad_(True)
        z = model(xb)
        yy = yv[ids]
        own = z.gather(1, yy.view(-1, 1)).squeeze(1)
        other = z.scatter(1, yy.view(-1, 1), float("-inf")).amax(1)
        (grad,) = torch.autograd.grad((other - own).sum(), xb)
        for j, i in enumerate(ids):
            est[(t, i)] = g[j].flatten()
            true[(t, i)] = grad[j].flatten()
            evals[(t, i)] = n_t[j]
    d = xv[0].numel()
    rounds = sorted({t for t, _ in est})
    out: dict[str, Any] = {"images": xv.shape[0], "budget": args.budget, "per_class": args.per_class,
                           "median_l2": statistics.median(norms), "d": d, "rows": []}
    label = {i: int(yv[i]) for i in range(xv.shape[0])}
    ks = [int(s) for s in args.k.split(",")]
    for window in (int(w) for w in args.window.split(",")):
        for t in rounds:
            acc: dict[int, dict[str, list[float]]] = {k: {"true": [], "est": [], "tt": [], "rows": []} for k in ks}
            shares = [float(w) for w in args.simulate.split(",") if w]
            cos = []
            for (tt, i), v in est.items():
                if tt != t or i >= args.eval:
                    continue
                keep = [(r, j) for (r, j) in est if j != i and t - window < r <= t
                        and (not args.per_class or label[j] == label[i])]
                # one SVD per image and round (the top-k rows for every k); uncentred
                u_all = torch.linalg.svd(torch.stack([est[key] for key in keep]), full_matrices=False)[2].T
                ut_all = torch.linalg.svd(torch.stack([true[key] for key in keep]), full_matrices=False)[2].T
                g = true[(t, i)]
                cos.append(float(v @ g / g.norm().clamp_min(1e-12)))
                for k in ks:
                    if len(keep) < k:
                        continue
                    acc[k]["true"].append(share(u_all[:, :k], g))
                    acc[k]["est"].append(share(u_all[:, :k], v))
                    acc[k]["tt"].append(share(ut_all[:, :k], g))
                    acc[k]["rows"].append(len(keep))
                    if shares:
                        sim = simulate(g, u_all[:, :k], evals[(t, i)], shares,
                                       torch.Generator().manual_seed(1000 * t + i))
                        for name, c in sim.items():
                            acc[k].setdefault(f"sim_{name}", []).append(c)
            for k in ks:
                a = acc[k]
                if not a["true"]:
                    continue
                row = {"k": k, "window": window, "round": t, "images": len(a["true"]),
                       "buffer_rows": statistics.median(a["rows"]),
                       "true_in_U_from_estimates": round(statistics.median(a["true"]), 3),
                       "estimate_in_U": round(statistics.median(a["est"]), 3),
                       "true_in_U_from_true_normals": round(statistics.median(a["tt"]), 3),
                       "cos_estimate_true": round(statistics.median(cos), 3),
                       "random_subspace": round(math.sqrt(k / d), 3)}
                row |= {name: round(statistics.median(v), 3) for name, v in a.items() if name.startswith("sim_")}
                row["probes"] = statistics.median(evals[(t, i)] for (tt, i) in est if tt == t and i < args.eval)
                out["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
