"""Search directions from the attacker's own natural images, for the Triangle Attack's candidates.

The Triangle Attack (Wang et al., ECCV 2022, Sec. 3, Alg. 1) places each candidate in a plane through the
attacked image ``x`` spanned by the current perturbation ``u`` and one random direction; the paper draws
that direction in the low-frequency DCT space. Here a share of the directions is instead the difference
``x' - x`` to one of the attacker's unlabelled natural images ``x'`` (the rest stay DCT): the plane then
turns the perturbation towards a real image, usually of another class. The candidate images are the nearest
pool image to ``x`` in each of ``dirs`` k-means clusters of the pool (:func:`~stealkit.evade.decision_based.image_starts.spread`,
pixel L2, no query), so that the directions cover the pool's modes rather than images like ``x``. Directions
taken from the statistics of natural images follow QEBA (Li et al., CVPR 2020, Sec. 3.3: QEBA-I draws its
perturbation subspace from natural images rather than noise) and the Boundary Attack's other-class image as
a direction (Brendel et al., ICLR 2018, Sec. 3); using raw pool differences as the Triangle's 2-D subspace
is this project's choice. No query is spent here; the Triangle Attack pays one per candidate as before.
"""

from __future__ import annotations

import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.image_starts import check_pool, kmeans, spread


class PoolDirections:
    """Per image (rows of ``x``), the pool images that give its directions; :meth:`mix` swaps a share of a
    batch of random directions for ``x' - x`` with ``x'`` drawn uniformly among them."""

    def __init__(self, pool: torch.Tensor, x: torch.Tensor, *, dirs: int, share: float) -> None:
        if not (0 < share <= 1) or dirs < 1:
            raise InputError(f"pool directions need a share in (0, 1] and dirs >= 1, got {share!r}, {dirs!r}")
        self.pool = check_pool(pool, tuple(x.shape[1:]))
        self.x, self.share = x, share
        #: [B, c] pool indices, the nearest image of each k-means cluster (c <= dirs)
        self.cand = spread(self.pool, x, kmeans(self.pool, dirs), dirs)

    def mix(self, r: torch.Tensor, rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``r`` ([n, D] flat directions of the images ``rows``) with each row replaced, with probability
        ``share``, by ``x' - x`` for a random one of its pool images (two draws from ``gen`` per call)."""
        n = rows.numel()
        pick = torch.rand(n, generator=gen) < self.share
        j = torch.randint(self.cand.shape[1], (n,), generator=gen)
        if not bool(pick.any()):
            return r
        out = r.clone()
        k = pick.nonzero().squeeze(1)
        ends = self.pool[self.cand[rows[k], j[k]]].to(self.x.device, self.x.dtype)
        out[k.to(r.device)] = (ends - self.x[rows[k].to(self.x.device)]).flatten(1).to(r.dtype)
        return out


__all__ = ["PoolDirections"]
