"""A subspace of boundary normals shared by the images of one run: HopSkipJump probes biased towards it.

The attack moves all its images in lock-step, so after each round it holds a unit boundary-normal estimate for
every image. The normals of one network at different inputs are far from isotropic: Moosavi-Dezfooli, Fawzi,
Fawzi & Frossard, "Universal adversarial perturbations" (CVPR 2017), Sec. 4, find that the normals to the
decision boundary near many data points span a low-dimensional subspace (the reason universal perturbations
exist). Query attacks that reuse a gradient subspace -- from reference models (Yan, Guo & Zhang, "Subspace
Attack", NeurIPS 2019, Sec. 3) or from surrogate gradients (Maheswaranathan et al., "Guided Evolutionary
Strategies", ICML 2019, Sec. 3: probes from ``alpha/n I + (1 - alpha)/k U U^T``) -- sample part of their
search directions inside it. Here the subspace comes from no model at all: it is the span of the top ``k``
right singular vectors (uncentred SVD; signs do not matter for a subspace) of the estimates that the attack
itself has made, from its own label queries, for the images of the same run over the last ``window`` rounds.

With ``HopSkipJumpConfig(shared_k=k, shared_w=w)`` a share ``w`` of each image's probes in rounds 2.. (up to
``shared_rounds``; 0: every round) is drawn in span(U_k) (Gaussian coefficients, normalised) and the rest as
before (the orthogonal frame or isotropic); HopSkipJump's sign estimator with its baseline (Chen et al. 2020,
Eq. 9 and 16) is kept over all probes. ``shared_prior``: instead, the image's previous estimate projected
on span(U_k) is the prior of the P-RGF estimator (:func:`~stealkit.evade.decision_based.priors.prior_estimate`, Cheng et al.
NeurIPS 2019, Sec. 3.2; images whose label has no subspace under ``shared_class`` keep the estimate itself). ``shared_class``: one subspace per original label instead of one for
all. The subspace needs estimates of at least two images (of the same label with ``shared_class``): with one
image (``--n 1``) the option is a no-op, and the image's own estimates are 1/n of the rows (they are the
attack's own queries too). The per-image budget is unchanged: the probes are as many as without the option.

Off by default: on Fashion-MNIST validation images it was level at best and up to 63% worse in median L2
(docs/decision-attacks.md, sixth round).
"""

from __future__ import annotations

import torch

from stealkit.errors import InputError


class SharedSubspace:
    """The last ``window`` unit estimates of every image, and the top-``k`` subspace of them per group (one
    group, or one per label of ``labels`` with ``per_class``)."""

    def __init__(self, labels: torch.Tensor, *, k: int, window: int, per_class: bool) -> None:
        if k < 1 or window < 1:
            raise InputError(f"shared_k and shared_window must be positive, got {k!r}, {window!r}")
        self.k, self.window = k, window
        self.groups = labels.long().cpu() if per_class else torch.zeros_like(labels.long().cpu())
        self.rows: dict[int, list[torch.Tensor]] = {}

    def add(self, idx: torch.Tensor, grads: torch.Tensor) -> None:
        """Store this round's unit estimates ``grads`` [len(idx), ...] of the images ``idx``."""
        for j, i in enumerate(idx.tolist()):
            buf = self.rows.setdefault(i, [])
            buf.append(grads[j].detach().flatten().cpu())
            del buf[: -self.window]

    def bases(self, idx: torch.Tensor) -> list[torch.Tensor | None]:
        """For each image of ``idx`` its group's orthonormal basis [d, k'] (``k' <= k``), or ``None`` where
        the group has estimates of fewer than two images."""
        out: dict[int, torch.Tensor | None] = {}
        res: list[torch.Tensor | None] = []
        for i in idx.tolist():
            g = int(self.groups[i])
            if g not in out:
                owners = [j for j in self.rows if int(self.groups[j]) == g]
                if len(owners) < 2:
                    out[g] = None
                else:
                    m = torch.stack([r for j in sorted(owners) for r in self.rows[j]])
                    v = torch.linalg.svd(m, full_matrices=False)[2]
                    out[g] = v[: min(self.k, v.shape[0])].T.contiguous()
            res.append(out[g])
        return res


    def project(self, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """Each row of ``v`` [len(idx), ...] projected on its image's subspace and normalised (the row itself
        where that image has none); ``None`` if no image has a subspace."""
        bases = self.bases(idx)
        if all(b is None for b in bases):
            return None
        out = v.clone()
        for j, b in enumerate(bases):
            if b is not None:
                p = b @ (b.T @ v[j].flatten().cpu())
                out[j] = (p / p.norm().clamp_min(1e-12)).view_as(v[j]).to(v.device)
        return out


def subspace_probes(basis: torch.Tensor, n: int, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """``n`` unit directions of shape ``shape`` in span(``basis``) [d, k]: Gaussian coefficients, normalised."""
    u = (torch.randn((n, basis.shape[1]), generator=gen) @ basis.T)
    return (u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)).view(n, *shape)


__all__ = ["SharedSubspace", "subspace_probes"]
