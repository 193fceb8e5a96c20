"""Self-supervised pretraining by contrastive learning (SimCLR), on the pool, before any query.

Chen, Kornblith, Norouzi & Hinton, *A Simple Framework for Contrastive Learning of Visual Representations*,
ICML 2020, Section 2.1 and Algorithm 1: every image of a batch of ``N`` is shown in two random augmented views;
a projection head ``g`` (a 2-layer MLP, Sec. 2.1 and 4.2) maps the encoder's features to ``z``, and the NT-Xent
loss (eq. 1) makes each view's ``z`` pick out its partner among the other ``2N - 1`` by cosine similarity at
temperature ``tau``. The encoder is the student up to its penultimate layer; the head is dropped after.

Views: FixMatch's strong augmentation (:func:`stealkit.extract.surrogate_data.semi_supervised.strong_view`: shift, a
horizontal flip only for flip-invariant data, brightness/contrast jitter, Gaussian noise, Cutout) stands in
for SimCLR's crop + colour distortion, which do not suit 8x8 or 28x28 grayscale images. Hacohen et al.
(ICML 2022) select their cold-start queries (TypiClust) in SimCLR features. Saving, reuse and initialising the
attack's students are :mod:`stealkit.extract.surrogate_data.pretrain`'s.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.surrogate_data.pretrain import PretrainConfig, WithHead, fit_pretext
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig, strong_view


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent loss (eq. 1) over the ``2N`` views: ``z1[i]`` and ``z2[i]`` are a positive pair."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))  # a view is never its own candidate
    n = z1.shape[0]
    partner = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
    return F.cross_entropy(sim, partner)


def pretrain_simclr(student: nn.Module, pool: torch.Tensor, config: PretrainConfig, *, seed: int = 0,
                    flip: bool = False, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train ``student`` in place with SimCLR on the pool (Chen et al., Algorithm 1); returns a record of the
    pretraining (epochs, seconds, last loss, how often a view's nearest other view was its partner)."""
    net = WithHead(student, lambda d: nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 64))).to(device)
    tc = config.train_config(pool.shape[0], seed)
    views_cfg = FixMatchConfig(flip=flip)
    hits = [0, 0]

    def contrastive_loss(model: nn.Module, xb: torch.Tensor, _t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        x = xb.cpu()
        z1, z2 = model(strong_view(x, views_cfg, gen).to(device)), model(strong_view(x, views_cfg, gen).to(device))
        with torch.no_grad():
            z = F.normalize(torch.cat([z1, z2]), dim=1)
            sim = (z @ z.T).fill_diagonal_(float("-inf"))
            n = z1.shape[0]
            partner = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
            hits[0] += int((sim.argmax(1) == partner).sum())
            hits[1] += 2 * n
        return nt_xent(z1, z2, config.temperature)

    t0 = time.perf_counter()
    loss, accuracy = fit_pretext(net, pool, tc, contrastive_loss, hits, desc="SimCLR pretraining", device=device)
    return {"method": "simclr", "epochs": tc.epochs, "pool": int(pool.shape[0]),
            "seconds": round(time.perf_counter() - t0, 2), "loss": loss, "pair_accuracy": accuracy}
