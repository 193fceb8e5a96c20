"""Learning from the images that were never queried: FixMatch consistency on the unqueried pool.

Jagielski et al. (*High Accuracy and High Fidelity Extraction of Neural Networks*, USENIX Security 2020,
Section 5.2 "Semi-supervised learning") show that an extraction attacker holding an unlabelled pool many times
larger than its query budget gains most at small budgets by training the student on that pool with a
semi-supervised loss (they use MixMatch and rotation prediction). We use FixMatch (Sohn et al., *FixMatch:
Simplifying Semi-Supervised Learning with Consistency and Confidence*, NeurIPS 2020, Section 2.2, eq. 2-4),
which is simpler and as strong:

* the labelled term is the extraction loss on the queried images and their (cached) victim answers -- labels
  or probabilities, whatever the oracle returns (:func:`stealkit.extract.surrogate.make_student_loss`);
* for each labelled batch of ``B`` images, ``mu * B`` pool images (queried or not: they cost nothing) are
  drawn; the student's own prediction ``q = softmax(s(alpha(u)))`` on a *weak* view ``alpha(u)`` gives a hard
  pseudo-label ``argmax q`` kept only where ``max q >= threshold`` (eq. 4), and the student is trained to
  predict it on a *strong* view ``A(u)``: ``l_u = mean_b 1[max q_b >= tau] H(argmax q_b, s(A(u_b)))``;
* the loss is ``l_s + lambda_u * l_u`` (eq. 2-4); ``q`` is computed without gradient (FixMatch's stop-gradient).

Augmentations are those this data allows (small grayscale images, Section 2.3 adapted): the weak view shifts
by up to ``shift`` pixels (and flips horizontally only where the data set is flip-invariant, e.g. Fashion-
MNIST, never digits); the strong view shifts by up to twice that, flips likewise, jitters brightness and
contrast, adds Gaussian noise and cuts out a random square (Cutout, DeVries & Taylor 2017, which FixMatch's
strong augmentation always ends with). Differences from the paper: no RandAugment (its colour and shear ops
do not suit 8x8 or 28x28 grayscale images), no EMA of the weights, and training runs for the extraction's own
number of epochs, an epoch being one pass over the pool (``epoch="pool"``: the labelled images cycle) or over
the queried images (``epoch="labelled"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError

SSL = Literal["none", "fixmatch"]


@dataclass(frozen=True)
class FixMatchConfig:
    """FixMatch settings (Sohn et al. 2020, Section 2.2 and Table 9's defaults where they fit small data).

    ``mu``: unlabelled images per labelled one in each step (paper 7). ``threshold``: confidence needed to
    keep a pseudo-label (paper 0.95). ``lambda_u``: weight of the unlabelled term (paper 1). ``shift``: the
    weak view's largest translation in pixels (0: automatic, 1/8 of the image side, at least 1). ``flip``:
    horizontal flips in both views (only for flip-invariant data). ``noise``: standard deviation of the strong
    view's Gaussian noise. ``cutout``: side of the strong view's cut-out square as a fraction of the image.
    ``epoch``: ``pool`` -- an epoch ends when ``mu`` times the labelled images drawn cover the pool once (the
    labelled images are cycled; FixMatch measures training by unlabelled data); ``labelled`` -- one pass over
    the queried images, the plain attack's epoch (few steps at small budgets).
    """

    mu: int = 3
    threshold: float = 0.95
    lambda_u: float = 1.0
    shift: int = 0
    flip: bool = False
    noise: float = 0.1
    cutout: float = 0.4
    epoch: Literal["pool", "labelled"] = "pool"

    def __post_init__(self) -> None:
        if self.mu < 1 or not 0.0 <= self.threshold <= 1.0 or self.lambda_u < 0 or self.shift < 0:
            raise InputError("fixmatch: mu must be >= 1, threshold in [0, 1], lambda_u >= 0, shift >= 0")
        if self.epoch not in ("pool", "labelled"):
            raise InputError(f"fixmatch epoch must be pool or labelled, got {self.epoch!r}")
        if self.noise < 0 or not 0.0 <= self.cutout < 1.0:
            raise InputError("fixmatch: noise must be >= 0 and cutout in [0, 1)")

    def pixels(self, side: int) -> int:
        return self.shift if self.shift > 0 else max(1, side // 8)


def shift_images(x: torch.Tensor, pad: int, gen: torch.Generator, *, flip: bool = False) -> torch.Tensor:
    """Translate each image by up to ``pad`` pixels (zero fill), then flip half of them if ``flip``."""
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    rows = dy[:, None] + torch.arange(h)[None]  # [B, H]
    cols = dx[:, None] + torch.arange(w)[None]  # [B, W]
    out = padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None],
                 rows[:, None, :, None], cols[:, None, None, :]]
    if flip:
        mask = torch.rand(b, generator=gen) < 0.5
        out = torch.where(mask[:, None, None, None], out.flip(3), out)
    return out


def weak_view(x: torch.Tensor, config: FixMatchConfig, gen: torch.Generator) -> torch.Tensor:
    """FixMatch's weak augmentation alpha: a small shift (and a flip where the data allows it)."""
    return shift_images(x, config.pixels(x.shape[-1]), gen, flip=config.flip)


def strong_view(x: torch.Tensor, config: FixMatchConfig, gen: torch.Generator) -> torch.Tensor:
    """FixMatch's strong augmentation A: a larger shift, brightness/contrast jitter, noise, then Cutout."""
    b, _, h, w = x.shape
    out = shift_images(x, 2 * config.pixels(w), gen, flip=config.flip)
    contrast = 0.6 + 0.8 * torch.rand(b, 1, 1, 1, generator=gen)
    bright = 0.2 * (torch.rand(b, 1, 1, 1, generator=gen) - 0.5)
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = (out - mean) * contrast + mean + bright
    if config.noise > 0:
        out = out + config.noise * torch.randn(out.shape, generator=gen)
    side = max(1, round(config.cutout * min(h, w))) if config.cutout > 0 else 0
    if side:
        cy = torch.randint(0, h, (b,), generator=gen)
        cx = torch.randint(0, w, (b,), generator=gen)
        ys, xs = torch.arange(h)[None], torch.arange(w)[None]
        in_y = ((ys - cy[:, None]).abs() <= side // 2)[:, :, None]  # [B, H, 1]
        in_x = ((xs - cx[:, None]).abs() <= side // 2)[:, None, :]  # [B, 1, W]
        out = out.masked_fill((in_y & in_x)[:, None], 0.0)
    return out.clamp(0.0, 1.0)


def fixmatch_unlabelled_loss(model: nn.Module, u: torch.Tensor, config: FixMatchConfig, gen: torch.Generator,
                             device: str | torch.device = "cpu") -> tuple[torch.Tensor, float]:
    """FixMatch's ``l_u`` (eq. 4) on the unlabelled batch ``u`` (views are drawn on the CPU with ``gen``, then
    moved to ``device``); returns it and the fraction of pseudo-labels kept."""
    weak = weak_view(u, config, gen).to(device)
    strong = strong_view(u, config, gen).to(device)
    with torch.no_grad():
        q = torch.softmax(model(weak), dim=1)
    conf, pseudo = q.max(dim=1)
    mask = (conf >= config.threshold).float()
    per = F.cross_entropy(model(strong), pseudo, reduction="none")
    return (per * mask).mean(), float(mask.mean())


def with_fixmatch(labelled_loss: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor],
                  pool: torch.Tensor, config: FixMatchConfig,
                  device: str | torch.device = "cpu") -> Callable[..., torch.Tensor]:
    """A ``batch_loss`` for :func:`stealkit.train.fit`: ``labelled_loss`` plus ``lambda_u * l_u`` on ``mu``
    times as many images drawn (with the loop's generator) from the unlabelled ``pool``."""
    if pool.shape[0] == 0:
        raise InputError("fixmatch needs an unlabelled pool; it is empty")

    def batch_loss(model: nn.Module, idx: torch.Tensor, target: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        loss = labelled_loss(model, idx, target, gen)
        if config.lambda_u == 0:
            return loss
        pick = torch.randint(0, pool.shape[0], (config.mu * idx.shape[0],), generator=gen)
        lu, _ = fixmatch_unlabelled_loss(model, pool[pick], config, gen, device)
        return loss + config.lambda_u * lu

    return batch_loss
