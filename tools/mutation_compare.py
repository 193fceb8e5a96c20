"""Numerical evidence for equivalent mutants of ``certify/bounds.py`` (docs/mutation.md, "Bounds").

Loads the unmutated module and each given mutant (the same mutants ``tools/mutation.py --list bounds`` prints),
evaluates ``renyi_radius`` (or ``--fn pixeldp_radius``) on 12,000 random ``(p1, p2)`` pairs (near ties, ``p1`` near 0 and 1, ``p2`` down to
1e-15 x ``p1``; seed 0), and prints the largest absolute and relative difference and where the grid maximum falls.

    PYTHONPATH=src python tools/mutation_compare.py 62 66 77 90 91 94 95 96 98 243 245 277 281 283
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutation  # noqa: E402


def load(index: int | None) -> types.ModuleType:
    mutants, raw = mutation.enumerate_mutants("bounds")
    src = raw if index is None else mutation._apply(raw, mutants[index])
    mod = types.ModuleType(f"bounds_mutant_{index}")
    exec(compile(src, mutation.MODULES["bounds"][0], "exec"), mod.__dict__)  # noqa: S102 - our own source
    return mod


def pairs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p1 = np.concatenate([rng.uniform(0, 1, 8000), 1 - 10.0 ** rng.uniform(-15, 0, 2000),
                         10.0 ** rng.uniform(-12, 0, 2000)])
    frac = np.concatenate([rng.uniform(0, 1, 8000), 10.0 ** rng.uniform(-15, 0, 4000)])
    return p1, np.minimum(p1 * frac, 1 - p1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("indices", type=int, nargs="+")
    ap.add_argument("--fn", default="renyi_radius", help="the radius compared (renyi_radius or pixeldp_radius)")
    args = ap.parse_args()
    p1, p2 = pairs()
    orig = load(None)
    ref = getattr(orig, args.fn)(p1, p2, 1.0)
    grid = 1.0 + np.exp(orig._RENYI_LOG_GRID)[None, :]
    i = orig.renyi_divergence_bound(p1[:, None], p2[:, None], grid).argmax(axis=1)
    print(f"{len(p1)} pairs; grid argmax index {i.min()}..{i.max()} of {grid.shape[1]}")
    mutants, _ = mutation.enumerate_mutants("bounds")
    for idx in args.indices:
        m = mutants[idx]
        try:
            got = getattr(load(idx), args.fn)(p1, p2, 1.0)
        except Exception as exc:  # noqa: BLE001 - a mutant may raise: that is a difference
            print(f"bounds[{idx}] {m.function}: raises {type(exc).__name__}")
            continue
        diff = np.abs(got - ref)
        rel = np.max(diff[ref > 0] / ref[ref > 0])
        print(f"bounds[{idx}] {m.function} {m.original!r} -> {m.replacement!r}: max abs {diff.max():.2g}, "
              f"max rel {rel:.2g}")


if __name__ == "__main__":
    main()
