"""Cold-start selection: which images to ask about before any answer exists (TypiClust; k-center).

Today's active strategies (:mod:`stealkit.extract.surrogate_data.active`) score the pool with a substitute trained on answers,
so their first round is random. With a representation learnt from the pool itself
(:mod:`stealkit.extract.surrogate_data.rotation_pretrain`), the first round can be chosen in that feature space:

* ``typiclust`` -- Hacohen, Dekel & Weinshall, *Active Learning on a Budget: Opposite Strategies Suit High and
  Low Budgets*, ICML 2022, Section 3 (3.1 typicality, 3.2 the algorithm): at a low budget the best queries are
  *typical* and *diverse*. The pool's (L2-normalised) features are clustered by k-means into
  ``|answered| + m`` clusters; from each of the ``m`` largest clusters holding no answered image the most
  typical point is taken, typicality being the inverse mean distance to the point's ``K`` nearest neighbours
  in its cluster (``K = min(20, size // 2)``, as the authors' code does). Clusters smaller than
  ``min_cluster`` (5, as theirs) are passed over while larger ones are left.
* ``kcenter`` -- k-center greedy (Sener & Savarese, ICLR 2018, Sec. 4.2, Algorithm 1) in the same features:
  the coverage strategy, run before any answer (it tends to pick outliers, the paper's own caveat).

Features are the pretrained student's penultimate layer; without pretraining, the flattened pixels.

Budget-aware (:func:`budget_aware_start`, ``--set cold_start_size=N``; fifth pass): Hacohen et al.'s own
result (Sec. 2, Fig. 1) is that typical points help only in the *low-budget* regime, and that from a few tens
of labels per class the opposite (uncertain or plain random) queries win. So the cold start chooses only the
first ``N`` queries (default 10 per class, :data:`PER_CLASS`); the rest of the round is the plain attack's
images (the shuffled pool's first ones not yet chosen), so a budget much larger than ``N`` queries almost what
the plain attack queries. ``N`` at least the budget is the fourth pass's cold start (the whole first round).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import kcenter_greedy
from stealkit.kmeans import kmeans

ColdStart = Literal["random", "typiclust", "kcenter"]
COLD_STARTS = ("random", "typiclust", "kcenter")
PER_CLASS = 10  # the default cold start: 10 queries per class, Hacohen et al.'s low-budget regime


def typicality(x: torch.Tensor, k_nn: int = 20) -> torch.Tensor:
    """Hacohen et al., Sec. 3.1: ``1 / mean distance to the K nearest neighbours`` (``K = min(k_nn, n // 2)``)."""
    n = x.shape[0]
    k = max(1, min(k_nn, n // 2))
    if n == 1:
        return torch.ones(1)
    d = torch.cdist(x, x)
    d.fill_diagonal_(math.inf)
    return 1.0 / (d.topk(min(k, n - 1), dim=1, largest=False).values.mean(1) + 1e-8)


def typiclust(feats: torch.Tensor, m: int, answered: torch.Tensor, gen: torch.Generator, *,
              min_cluster: int = 5, k_nn: int = 20) -> torch.Tensor:
    """Hacohen et al., Sec. 3.2: ``m`` indices of ``feats`` (not in ``answered``), the most typical point of
    each of the ``m`` largest clusters that hold no answered point."""
    n = feats.shape[0]
    m = min(m, n - answered.numel())
    x = F.normalize(feats.float(), dim=1)
    assign = kmeans(x, answered.numel() + m, gen)
    sizes = torch.bincount(assign, minlength=int(assign.max()) + 1)
    covered = torch.zeros_like(sizes)
    covered.index_add_(0, assign[answered], torch.ones_like(answered))
    taken = torch.zeros(n, dtype=torch.bool)
    taken[answered] = True
    picked: list[int] = []
    while len(picked) < m:
        free = torch.bincount(assign[~taken], minlength=sizes.numel())
        # fewest answered first, then the largest; clusters below min_cluster only when nothing else is left
        small = (sizes < min_cluster) & (free > 0) & bool(((sizes >= min_cluster) & (free > 0)).any())
        key = covered.double() * (n + 1) - sizes.double()
        key[(free == 0) | small] = math.inf
        c = int(key.argmin())
        rows = ((assign == c) & ~taken).nonzero().flatten()
        members = (assign == c).nonzero().flatten()
        scores = typicality(x[members], k_nn)
        best = members[scores.argsort(descending=True)]
        j = int(best[torch.isin(best, rows)][0])
        picked.append(j)
        taken[j] = True
        covered[c] += 1
    return torch.tensor(picked, dtype=torch.long)


def cold_start(kind: ColdStart, feats: torch.Tensor, m: int, gen: torch.Generator) -> torch.Tensor:
    """The first ``m`` queries (indices into ``feats``, one row per pool image) chosen with no answer yet."""
    empty = torch.empty(0, dtype=torch.long)
    if kind == "typiclust":
        return typiclust(feats, m, empty, gen)
    if kind == "kcenter":
        return kcenter_greedy(F.normalize(feats.float(), dim=1), feats.new_zeros((0, feats.shape[1])), m)
    if kind == "random":
        return torch.randperm(feats.shape[0], generator=gen)[:m]
    raise InputError(f"unknown cold start {kind!r}; expected one of {', '.join(COLD_STARTS)}")


def budget_aware_start(kind: ColdStart, feats: torch.Tensor, m: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """The first round's ``m`` indices: ``min(m, size)`` chosen by the cold start ``kind``, the rest the
    lowest indices not chosen (the pool is already in the attack's shuffled order: the plain attack's images)."""
    picked = cold_start(kind, feats, min(m, size), gen)
    taken = torch.zeros(feats.shape[0], dtype=torch.bool)
    taken[picked] = True
    rest = (~taken).nonzero().flatten()[: m - picked.numel()]
    return torch.cat([picked, rest])
