"""Per-image records for benchmark rows, and the paired bootstrap every "ahead" claim rests on.

A row of a benchmark keeps, beside its summary figure, what each test image did (``correct``: the student was
right on it, packed as hex bits; a decision attack's rows already keep each image's ``l2``). From those,
:func:`paired_interval` gives a percentile interval of a difference between two tools, resampling test images
and seeds together with the same draws for both tools (paired), and :func:`verdict` turns it into words:
"ahead" or "behind" only when the interval excludes zero, otherwise "level".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: resamples of every interval in docs/results.md; the generator's seed is fixed so the tables regenerate exactly
RESAMPLES = 2000
SEED = 20261126


def pack_bits(flags: Any) -> str:
    """A boolean vector as hex (8 images a byte, numpy's big-endian bit order)."""
    arr = np.asarray(flags, dtype=bool).ravel()
    return np.packbits(arr).tobytes().hex()


def unpack_bits(text: str, n: int) -> np.ndarray:
    """The inverse of :func:`pack_bits` for a vector of ``n`` images."""
    arr = np.unpackbits(np.frombuffer(bytes.fromhex(text), dtype=np.uint8))[:n]
    if arr.size != n:
        raise ValueError(f"a per-image record of {arr.size} images where {n} were expected")
    return arr.astype(bool)


def per_image(evaluator: Any, accuracy: float) -> dict[str, Any]:
    """The per-image record of the model an evaluator scored last, checked against the row's accuracy.

    Raises ``RuntimeError`` when the last scored model is not the row's (its accuracy differs by half an image or more): a record that
    does not belong to its row must never be written.
    """
    pred = evaluator.last_pred
    if pred is None:
        raise RuntimeError("the evaluator has scored no model yet")
    correct = (pred.cpu() == evaluator.y.cpu()).numpy()
    if abs(float(correct.mean()) - float(accuracy)) > 0.5 / correct.size:  # within half an image
        raise RuntimeError(f"the last scored model has accuracy {correct.mean():.6f}, the row says {accuracy:.6f}")
    out = {"n_test": int(correct.size), "correct": pack_bits(correct)}
    if evaluator.victim_labels is not None:  # the victim on the same images, for ratios to the victim
        out["victim_correct"] = pack_bits((evaluator.victim_labels.cpu() == evaluator.y.cpu()).numpy())
    return out


def paired_interval(stat: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray, *,
                    resamples: int = RESAMPLES, level: float = 0.95, seed: int = SEED) -> tuple[float, float, float]:
    """Point estimate and percentile interval of ``stat(a, b)`` under a paired bootstrap.

    ``a`` and ``b`` are ``(seeds, images)`` arrays of the two tools, column ``i`` of each the same image. Each
    resample draws images with replacement, the same draw for both tools, and rows (seeds) with replacement:
    the same draw for both where they have as many rows (row ``s`` of each from the same seed), independent
    draws where they do not (e.g. three stealkit seeds against four ART repeats).
    """
    if a.shape[1] != b.shape[1]:
        raise ValueError("the two tools must be scored on the same images")
    rng = np.random.default_rng(seed)
    paired_rows = a.shape[0] == b.shape[0]
    est = stat(a, b)
    vals = np.empty(resamples)
    for k in range(resamples):
        sa = rng.integers(0, a.shape[0], a.shape[0])
        sb = sa if paired_rows else rng.integers(0, b.shape[0], b.shape[0])
        cols = rng.integers(0, a.shape[1], a.shape[1])
        vals[k] = stat(a[np.ix_(sa, cols)], b[np.ix_(sb, cols)])
    lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    return float(est), float(lo), float(hi)


def accuracy_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean accuracy of ``a`` minus that of ``b``, in points."""
    return 100.0 * (float(a.mean()) - float(b.mean()))


def median_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """Median over images of ``a``'s per-image mean over seeds, over the same for ``b`` (e.g. L2 distortion)."""
    return float(np.median(a.mean(axis=0)) / np.median(b.mean(axis=0)))


def verdict(lo: float, hi: float, zero: float = 0.0, *, higher_is_better: bool = True) -> str:
    """"ahead" / "behind" where the interval excludes ``zero``, else "level"."""
    if lo > zero:
        return "ahead" if higher_is_better else "behind"
    if hi < zero:
        return "behind" if higher_is_better else "ahead"
    return "level"


def stack(rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """``(rows, images)`` correctness of rows that carry a per-image record."""
    return np.stack([unpack_bits(r["correct"], int(r["n_test"])) for r in rows])
