"""Per-image records for benchmark rows, and the seed-level interval every "ahead" claim rests on.

A row of a benchmark keeps, beside its summary figure, what each test image did (``correct``: the student was
right on it, packed as hex bits; a decision attack's rows already keep each image's ``l2``). From those,
:func:`seed_interval` gives the interval every verdict uses: the seed is the unit, so it is the wider of a
hierarchical bootstrap (seeds, then images within each seed; :func:`hierarchical_interval`) and a t-interval
over the per-seed figures (:func:`t_interval`). :func:`verdict` turns it into words: "ahead" or "behind" only
when the interval excludes zero, otherwise "level". :func:`paired_interval` (seeds and images resampled
together, normal to three seeds' ten multisets) is kept for comparison only: it under-covers the spread between
seeds and no verdict rests on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _stats

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


def t_interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of per-seed figures (``n - 1`` degrees of freedom).

    Raises ``ValueError`` for fewer than two values: one seed says nothing about the spread between seeds.
    """
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        raise ValueError("a t-interval over seeds needs at least two seeds")
    mean = float(v.mean())
    half = float(_stats.t.ppf((1 + level) / 2, v.size - 1)) * float(v.std(ddof=1)) / float(np.sqrt(v.size))
    return mean, mean - half, mean + half


def hierarchical_interval(stat: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray, *,
                          resamples: int = RESAMPLES, level: float = 0.95,
                          seed: int = SEED) -> tuple[float, float, float]:
    """Point estimate and percentile interval of ``stat(a, b)`` under a two-level bootstrap.

    ``a`` and ``b`` are ``(seeds, images)`` arrays, column ``i`` of each the same image. Each resample first draws
    seeds with replacement (the same draw for both where they have as many rows, row ``s`` of each from the same
    seed; independent draws where they do not), then, for each drawn seed, its own draw of images with
    replacement (the same image draw for the two tools at that position: paired per image).
    """
    if a.shape[1] != b.shape[1]:
        raise ValueError("the two tools must be scored on the same images")
    rng = np.random.default_rng(seed)
    na, nb, n = a.shape[0], b.shape[0], a.shape[1]
    paired_rows = na == nb
    est = stat(a, b)
    sa = rng.integers(0, na, (resamples, na))
    sb = sa if paired_rows else rng.integers(0, nb, (resamples, nb))
    cols = rng.integers(0, n, (resamples, max(na, nb), n))  # one image draw per seed position
    ra, rb = a[sa[:, :, None], cols[:, :na]], b[sb[:, :, None], cols[:, :nb]]
    batch = BATCHED.get(stat)  # the same statistic over every resample at once, where there is one
    vals = batch(ra, rb) if batch is not None else np.array([stat(ra[k], rb[k]) for k in range(resamples)])
    lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    return float(est), float(lo), float(hi)


def per_seed(stat: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray) -> list[float]:
    """The figure of each seed: ``stat`` on row ``s`` of both where they have as many rows (paired seeds), else
    each row of ``a`` against all of ``b`` (e.g. three stealkit seeds against four ART repeats pooled)."""
    if a.shape[0] == b.shape[0]:
        return [stat(a[s:s + 1], b[s:s + 1]) for s in range(a.shape[0])]
    return [stat(a[s:s + 1], b) for s in range(a.shape[0])]


@dataclass(frozen=True)
class SeedInterval:
    """The verdict interval of a comparison with the seed as the unit, and both intervals it was chosen from."""

    estimate: float  #: ``stat`` on all seeds and images
    lo: float
    hi: float
    method: str  #: "t" or "hierarchical": the wider of the two, the one the verdict uses
    t: tuple[float, float]  #: t-interval over the per-seed figures
    hierarchical: tuple[float, float]  #: percentile interval of the two-level bootstrap
    seeds: tuple[float, ...]  #: the per-seed figures


def seed_interval(stat: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray, *,
                  resamples: int = RESAMPLES, level: float = 0.95, seed: int = SEED) -> SeedInterval:
    """The interval a verdict uses: the wider of :func:`hierarchical_interval` and :func:`t_interval` over
    :func:`per_seed` figures (ties go to the t-interval). Needs at least two seeds of ``a``."""
    est, hlo, hhi = hierarchical_interval(stat, a, b, resamples=resamples, level=level, seed=seed)
    figures = per_seed(stat, a, b)
    _, tlo, thi = t_interval(figures, level=level)
    if thi - tlo >= hhi - hlo:
        return SeedInterval(est, tlo, thi, "t", (tlo, thi), (hlo, hhi), tuple(figures))
    return SeedInterval(est, hlo, hhi, "hierarchical", (tlo, thi), (hlo, hhi), tuple(figures))


def accuracy_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean accuracy of ``a`` minus that of ``b``, in points."""
    return 100.0 * (float(a.mean()) - float(b.mean()))


def median_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """Median over images of ``a``'s per-image mean over seeds, over the same for ``b`` (e.g. L2 distortion)."""
    return float(np.median(a.mean(axis=0)) / np.median(b.mean(axis=0)))


def ratio_of_means(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of ``a`` over the mean of ``b`` (a student's accuracy over the victim's on the same images)."""
    return float(a.mean() / b.mean())


#: statistic -> the same over a stack of resamples ``(resamples, seeds, images)``, one value per resample
BATCHED: dict[Callable[..., float], Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    accuracy_difference: lambda a, b: 100.0 * (a.mean(axis=(1, 2)) - b.mean(axis=(1, 2))),
    median_ratio: lambda a, b: np.median(a.mean(axis=1), axis=1) / np.median(b.mean(axis=1), axis=1),
    ratio_of_means: lambda a, b: a.mean(axis=(1, 2)) / b.mean(axis=(1, 2)),
}


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
