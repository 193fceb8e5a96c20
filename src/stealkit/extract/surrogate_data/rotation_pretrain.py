"""Self-supervised pretraining by rotation prediction (RotNet), on the pool, before any query.

Gidaris, Singh & Komodakis, *Unsupervised Representation Learning by Predicting Image Rotations*, ICLR 2018,
Section 2 (2.1-2.2): a network learns features by predicting which of the four rotations ``{0, 90, 180,
270}`` degrees was applied to an image; every image of the batch is shown in all four rotations (Sec. 2.2,
"feeding all four rotated copies simultaneously") and the loss is the cross entropy of the 4-way prediction
(eq. 1-3). Jagielski et al. (USENIX Security 2020, Section 5.2) use this rotation loss on the attacker's
unqueried pool for extraction. The 4-way head sits on the student's penultimate features; saving, reuse and
initialising the attack's students are :mod:`stealkit.extract.surrogate_data.pretrain`'s.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.pretrain import PretrainConfig, WithHead, fit_pretext


def rotations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The four rotations of every image of ``x`` ``[B, C, H, W]`` (square images) and their labels 0..3."""
    if x.shape[-1] != x.shape[-2]:
        raise InputError(f"rotation pretraining needs square images, got {x.shape[-2]}x{x.shape[-1]}")
    views = torch.cat([torch.rot90(x, k, dims=(2, 3)) for k in range(4)])
    labels = torch.arange(4, device=x.device).repeat_interleave(x.shape[0])
    return views, labels


def pretrain_rotation(student: nn.Module, pool: torch.Tensor, config: PretrainConfig, *, seed: int = 0,
                      device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train ``student`` in place to predict the rotation of the pool's images (Gidaris et al., Sec. 2);
    returns a record of the pretraining (epochs, seconds, last loss, rotation accuracy on the last epoch)."""
    net = WithHead(student, lambda d: nn.Linear(d, 4)).to(device)
    tc = config.train_config(pool.shape[0], seed)
    correct = [0, 0]

    def rotation_loss(model: nn.Module, xb: torch.Tensor, _t: torch.Tensor, _g: torch.Generator) -> torch.Tensor:
        views, labels = rotations(xb)
        logits = model(views)
        correct[0] += int((logits.argmax(1) == labels).sum())
        correct[1] += int(labels.numel())
        return F.cross_entropy(logits, labels)

    t0 = time.perf_counter()
    loss, accuracy = fit_pretext(net, pool, tc, rotation_loss, correct, desc="rotation pretraining", device=device)
    return {"method": "rotation", "epochs": tc.epochs, "pool": int(pool.shape[0]),
            "seconds": round(time.perf_counter() - t0, 2), "loss": loss, "rotation_accuracy": accuracy}
