"""Lloyd's k-means on the rows of a matrix, shared by Knockoff's action clusters, TypiClust's cold start and the
decision attacks' pool starts."""

from __future__ import annotations

from typing import Literal

import torch


def kmeans(x: torch.Tensor, k: int, gen: torch.Generator, *, iters: int = 50, chunk: int = 4096,
           init: Literal["plusplus", "random"] = "plusplus") -> torch.Tensor:
    """Each row's cluster ``[N]`` after at most ``iters`` Lloyd steps (stops early once nothing moves).

    ``init="plusplus"``: k-means++ seeding (Arthur & Vassilvitskii 2007); ``"random"``: ``k`` distinct rows drawn
    by one ``randperm``. An empty cluster keeps its centre.
    """
    n = x.shape[0]
    k = max(1, min(k, n))
    if init == "random":
        centres = x[torch.randperm(n, generator=gen)[:k]].clone()
    else:
        centres = torch.empty((k, x.shape[1]), dtype=x.dtype)
        centres[0] = x[torch.randint(n, (1,), generator=gen)]
        d2 = ((x - centres[0]) ** 2).sum(1)
        for j in range(1, k):
            total = float(d2.sum())
            i = (int(torch.multinomial(d2 / total, 1, generator=gen)) if total > 0
                 else int(torch.randint(n, (1,), generator=gen)))
            centres[j] = x[i]
            d2 = torch.minimum(d2, ((x - centres[j]) ** 2).sum(1))
    assign = torch.full((n,), -1, dtype=torch.long)
    for _ in range(iters):
        new = torch.cat([torch.cdist(x[i : i + chunk], centres).argmin(1) for i in range(0, n, chunk)])
        if torch.equal(new, assign):
            break
        assign = new
        sums = torch.zeros_like(centres).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)
        filled = counts > 0
        centres[filled] = sums[filled] / counts[filled, None]
    return assign
