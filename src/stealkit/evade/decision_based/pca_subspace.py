"""HopSkipJump probes in the principal subspace of the attacker's own natural images (QEBA-I).

Li, Xu, Zhang, Yang & Li, "QEBA: Query-Efficient Boundary-Based Blackbox Attack" (CVPR 2020), Sec. 3.3: the
random directions of the HopSkipJump gradient estimator are drawn in a subspace of dimension ``k << d`` instead
of the full pixel space, so that each sign answer tells more about the part of the boundary normal inside it;
their "intrinsic component" subspace (QEBA-I) is spanned by the top principal components of natural images of
the domain (Sec. 3.3 and the experiments of Sec. 4). Here the images are the attacker's unlabelled pool (the
``start_pool`` of :mod:`stealkit.evade.decision_based.image_starts`; never the attacked images): the basis is the top ``k``
eigenvectors of the pool's covariance (centred, double precision), computed once before the first query.

With ``HopSkipJumpConfig(pca_k=k, pca_w=w, pca_rounds=r)`` a share ``w`` of each image's probes in rounds
``1..r`` (0: every round) is drawn in that span (Gaussian coefficients, normalised;
:func:`~stealkit.evade.decision_based.shared_subspace.subspace_probes`) and the rest as before (the orthogonal frame or
isotropic); HopSkipJump's sign estimator with its baseline (Chen et al. 2020, Eq. 9 and 16) is kept over all
probes, so the per-image budget is unchanged. ``w = 1`` is QEBA-I itself (every probe in the subspace).
"""

from __future__ import annotations

import torch

from stealkit.errors import InputError
from stealkit.evade.decision_based.image_starts import check_pool


def pca_basis(pool: torch.Tensor, k: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Orthonormal columns [d, k] (float32): the top-``k`` principal components of the images ``pool`` [N, ...]
    (centred; eigenvectors of the covariance, largest eigenvalue first; signs made deterministic). ``shape``:
    the attacked images' shape, which the pool must have; a pool of another shape, empty, with NaN/inf pixels or
    outside [0, 1] is one :class:`InputError`, as is ``k`` outside ``[1, d]``."""
    p = check_pool(pool, tuple(pool.shape[1:]) if shape is None else tuple(shape))
    flat = p.flatten(1).double().cpu()
    d = flat.shape[1]
    if not 1 <= k <= d:
        raise InputError(f"pca_k must be in [1, {d}] (the pixels per image), got {k}")
    if flat.shape[0] < 2:
        raise InputError("the pool needs at least two images for principal components")
    flat = flat - flat.mean(0, keepdim=True)
    cov = flat.T @ flat / (flat.shape[0] - 1)
    vals, vecs = torch.linalg.eigh(cov)
    top = vecs[:, vals.argsort(descending=True)[:k]]
    # a deterministic sign per component (the largest-magnitude entry positive); a subspace does not care
    sign = torch.sign(top.gather(0, top.abs().argmax(0, keepdim=True)))
    return (top * torch.where(sign == 0, torch.ones_like(sign), sign)).float().contiguous()


__all__ = ["pca_basis"]
