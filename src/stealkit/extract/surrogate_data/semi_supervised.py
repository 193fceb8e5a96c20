"""Learning from the images that were never queried: FixMatch consistency on the unqueried pool.

Jagielski et al. (*High Accuracy and High Fidelity Extraction of Neural Networks*, USENIX Security 2020,
Section 5.2 "Semi-supervised learning") show that an extraction attacker holding an unlabelled pool many times
larger than its query budget gains most at small budgets by training the student on that pool with a
semi-supervised loss (they use MixMatch and rotation prediction). We use FixMatch (Sohn et al., *FixMatch:
Simplifying Semi-Supervised Learning with Consistency and Confidence*, NeurIPS 2020, Section 2.2, eq. 2-4),
which is simpler and as strong:

* the labelled term is the extraction loss on the queried images and their (cached) victim answers -- labels
  or probabilities, whatever the oracle returns (:func:`stealkit.extract.surrogate_data.surrogate.make_student_loss`);
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
do not suit 8x8 or 28x28 grayscale images), and training runs for the extraction's own number of epochs, an
epoch being one pass over the pool (``epoch="pool"``: the labelled images cycle) or over the queried images
(``epoch="labelled"``).

Against confirmation bias with a weak start (a student that has seen 100 answers is confidently wrong on a
fifth of the pool it keeps, and its confident pseudo-labels pile onto a few classes; where FixMatch still wins:
docs/guide/surrogate.md, "The default and why"), three remedies from the field, each a setting:

* ``warmup``: the unlabelled term is off for the first ``warmup`` fraction of the steps (the student learns
  the answers first), then ramps linearly to ``lambda_u`` over as many steps (the ramp-up of Laine & Aila,
  ICLR 2017, Sec. 3.1, used by MixMatch and by Jagielski et al.);
* ``ema``: pseudo-labels come from an exponential moving average of the student's weights (mean teacher,
  Tarvainen & Valpola, NeurIPS 2017, Sec. 2; FixMatch evaluates its EMA model too), steadier than the student;
* ``align``: distribution alignment (ReMixMatch, Berthelot et al., ICLR 2020, Sec. 3.2): the teacher's
  prediction is multiplied by ``p(y) / p~(y)`` and renormalised, ``p(y)`` being the running mean of the
  victim's answers (one-hot labels or probabilities: the only class marginal the attacker knows) and ``p~(y)``
  the running mean of the teacher's predictions on the pool, so pseudo-labels cannot collapse onto a few
  classes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError

SSL = Literal["none", "fixmatch"]


@dataclass(frozen=True)
class FixMatchConfig:
    """FixMatch settings (Sohn et al. 2020, Section 2.2 and Table 9's defaults where they fit small data; the
    remedies' values were chosen on the validation split, docs/guide/surrogate.md; FixMatch as first built:
    ``threshold=0.95, warmup=0, ema=0, align=false``).

    ``mu``: unlabelled images per labelled one in each step (paper 7). ``threshold``: confidence needed to
    keep a pseudo-label (paper 0.95; 0.98 here, fewer confidently wrong pseudo-labels from a weak start).
    ``lambda_u``: weight of the unlabelled term (paper 1). ``shift``: the weak view's largest translation in
    pixels (0: automatic, 1/8 of the image side, at least 1). ``flip``: horizontal flips in both views (only
    for flip-invariant data). ``noise``: standard deviation of the strong
    view's Gaussian noise. ``cutout``: side of the strong view's cut-out square as a fraction of the image.
    ``epoch``: ``pool`` -- an epoch ends when ``mu`` times the labelled images drawn cover the pool once (the
    labelled images are cycled; FixMatch measures training by unlabelled data); ``labelled`` -- one pass over
    the queried images, the plain attack's epoch (few steps at small budgets). ``warmup``: fraction of the
    steps before the unlabelled term starts (then ramped in over as many). ``ema``: decay of the mean-teacher
    weights that make the pseudo-labels (0: the student itself, as in FixMatch). ``align``: distribution
    alignment of the pseudo-labels with the answers' class marginal.
    """

    mu: int = 3
    threshold: float = 0.98
    lambda_u: float = 1.0
    shift: int = 0
    flip: bool = False
    noise: float = 0.1
    cutout: float = 0.4
    epoch: Literal["pool", "labelled"] = "pool"
    warmup: float = 0.1
    ema: float = 0.99
    align: bool = True

    def __post_init__(self) -> None:
        if self.mu < 1 or not 0.0 <= self.threshold <= 1.0 or self.lambda_u < 0 or self.shift < 0:
            raise InputError("fixmatch: mu must be >= 1, threshold in [0, 1], lambda_u >= 0, shift >= 0")
        if self.epoch not in ("pool", "labelled"):
            raise InputError(f"fixmatch epoch must be pool or labelled, got {self.epoch!r}")
        if self.noise < 0 or not 0.0 <= self.cutout < 1.0:
            raise InputError("fixmatch: noise must be >= 0 and cutout in [0, 1)")
        if not 0.0 <= self.warmup < 0.5 or not 0.0 <= self.ema < 1.0:
            raise InputError("fixmatch: warmup must be in [0, 0.5) and ema in [0, 1)")

    def ramp(self, step: int, total: int) -> float:
        """The unlabelled term's weight at ``step`` of ``total``: 0 during the warm-up, then a linear ramp."""
        if self.warmup <= 0:
            return self.lambda_u
        start = self.warmup * total
        return self.lambda_u * min(1.0, max(0.0, (step - start) / max(start, 1.0)))

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
                             device: str | torch.device = "cpu", *, teacher: nn.Module | None = None,
                             align: Callable[[torch.Tensor], torch.Tensor] | None = None
                             ) -> tuple[torch.Tensor, float]:
    """FixMatch's ``l_u`` (eq. 4) on the unlabelled batch ``u`` (views are drawn on the CPU with ``gen``, then
    moved to ``device``); pseudo-labels come from ``teacher`` (default: ``model``) on the weak view, adjusted
    by ``align`` if given. Returns the loss and the fraction of pseudo-labels kept."""
    weak = weak_view(u, config, gen).to(device)
    strong = strong_view(u, config, gen).to(device)
    with torch.no_grad():
        q = torch.softmax((teacher if teacher is not None else model)(weak), dim=1)
        if align is not None:
            q = align(q)
    conf, pseudo = q.max(dim=1)
    mask = (conf >= config.threshold).float()
    per = F.cross_entropy(model(strong), pseudo, reduction="none")
    return (per * mask).mean(), float(mask.mean())


class DistributionAlignment:
    """ReMixMatch's distribution alignment: ``q * p(y) / p~(y)``, renormalised, with running means (momentum
    ``m``) of the answers' class marginal ``p(y)`` and of the teacher's predictions ``p~(y)``."""

    def __init__(self, num_classes: int, momentum: float = 0.99) -> None:
        self.m = momentum
        self.answers = torch.full((num_classes,), 1.0 / num_classes)
        self.predicted = torch.full((num_classes,), 1.0 / num_classes)

    def observe_answers(self, target: torch.Tensor, num_classes: int) -> None:
        if target.dim() == 1:  # labels
            p = F.one_hot(target.long(), num_classes).float()
        elif (target < 0).any():  # logits
            p = torch.softmax(target.float(), dim=1)
        else:  # probabilities (top-k answers: the rest of the mass is unknown, renormalised)
            p = target.float() / target.float().sum(dim=1, keepdim=True).clamp_min(1e-12)
        self.answers = self.m * self.answers + (1 - self.m) * p.mean(0).cpu()

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        self.predicted = self.m * self.predicted + (1 - self.m) * q.mean(0).cpu()
        out = q * (self.answers / self.predicted.clamp_min(1e-6)).to(q.device)
        return out / out.sum(dim=1, keepdim=True)


class MeanTeacher:
    """An exponential moving average of a model's weights (Tarvainen & Valpola 2017), updated per step.

    The decay at update ``t`` is ``min(decay, (1 + t) / (10 + t))`` (TensorFlow's ``ExponentialMovingAverage``
    with ``num_updates``): short runs -- a few hundred steps on a small pool -- would otherwise average in
    the random initial weights.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay, self.updates = decay, 0
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for t, s in zip(self.model.parameters(), model.parameters(), strict=True):
            t.mul_(decay).add_(s.detach(), alpha=1 - decay)


LabelledLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


class FixMatchLoss:
    """A ``batch_loss`` for :func:`stealkit.train.fit`: ``labelled_loss`` plus ``ramp * l_u`` on ``mu`` times
    as many images drawn (with the loop's generator) from the unlabelled ``pool``. ``total_steps`` sizes the
    warm-up; ``answers(idx)`` returns the cached victim answers of a labelled batch (for ``align``).
    :meth:`finish` makes the mean teacher the result."""

    def __init__(self, labelled_loss: LabelledLoss, pool: torch.Tensor, config: FixMatchConfig,
                 device: str | torch.device = "cpu", *, total_steps: int = 0,
                 answers: Callable[[torch.Tensor], torch.Tensor] | None = None, num_classes: int = 0) -> None:
        if pool.shape[0] == 0:
            raise InputError("fixmatch needs an unlabelled pool; it is empty")
        if config.align and (answers is None or num_classes < 2):
            raise InputError("fixmatch align needs the victim's answers and the number of classes")
        self.labelled_loss, self.pool, self.config, self.device = labelled_loss, pool, config, device
        self.total_steps, self.answers, self.num_classes = total_steps, answers, num_classes
        self.step = 0
        self.teacher: MeanTeacher | None = None
        self.align = DistributionAlignment(num_classes) if config.align else None

    def __call__(self, model: nn.Module, idx: torch.Tensor, target: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:
        loss = self.labelled_loss(model, idx, target, gen)
        step, self.step = self.step, self.step + 1
        if self.config.ema > 0:
            if self.teacher is None:
                self.teacher = MeanTeacher(model, self.config.ema)
            else:
                self.teacher.update(model)  # the weights after the previous step
        if self.align is not None and self.answers is not None:
            self.align.observe_answers(self.answers(idx), self.num_classes)
        weight = self.config.ramp(step, self.total_steps)
        if weight == 0:
            return loss
        pick = torch.randint(0, self.pool.shape[0], (self.config.mu * idx.shape[0],), generator=gen)
        return loss + weight * self.unlabelled(model, self.pool[pick], gen)

    def unlabelled(self, model: nn.Module, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The unlabelled term on the pool images ``u``: FixMatch's ``l_u``."""
        lu, _ = fixmatch_unlabelled_loss(model, u, self.config, gen, self.device,
                                         teacher=self.teacher.model if self.teacher is not None else None,
                                         align=self.align)
        return lu

    def finish(self, model: nn.Module) -> None:
        """With ``ema``, the mean teacher is the result (FixMatch reports its EMA model): copy it in."""
        if self.teacher is not None:
            self.teacher.update(model)
            model.load_state_dict(self.teacher.model.state_dict())


def with_fixmatch(labelled_loss: LabelledLoss, pool: torch.Tensor, config: FixMatchConfig,
                  device: str | torch.device = "cpu", **kwargs: Any) -> FixMatchLoss:
    """:class:`FixMatchLoss` (the name the callers have used since FixMatch was first built)."""
    return FixMatchLoss(labelled_loss, pool, config, device, **kwargs)
