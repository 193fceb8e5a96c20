"""What every evasion attack shares: norms, the one clip/project function, target choice and results.

Conventions (``docs/architecture.md``): images are float32 NCHW pixels in [0, 1]; a perturbation is kept
inside the epsilon ball around the clean image *and* inside [0, 1] by :func:`project`, the only place in
:mod:`stealkit.evade` where either clipping happens. Projecting onto the ball first and clipping to the box
second is exact for both norms here: clipping moves every coordinate towards the clean pixel (itself in the
box), so it can only shrink the perturbation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError

#: perturbation norms below this count as zero (division guard)
TINY = 1e-12


class Norm(StrEnum):
    """The threat model's norm."""

    LINF = "linf"
    L2 = "l2"

    @classmethod
    def parse(cls, value: str | Norm) -> Norm:
        if isinstance(value, Norm):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise InputError(f"unknown norm {value!r}; expected one of {[n.value for n in cls]}") from None


class TargetPolicy(StrEnum):
    """How a targeted attack picks each example's target class.

    ``second``: class index 1, the same for every example (CoDFe Sec. 4.1: "we use the second class as
    target for all three datasets"); examples whose label already is 1 are not attempted.
    ``random``: a uniformly random class other than the label (DaST's evaluation script).
    ``least-likely``: the class the *substitute* finds least likely (Kurakin et al. 2017); costs no queries.
    """

    SECOND = "second"
    RANDOM = "random"
    LEAST_LIKELY = "least-likely"

    @classmethod
    def parse(cls, value: str | TargetPolicy) -> TargetPolicy:
        if isinstance(value, TargetPolicy):
            return value
        try:
            return cls(str(value).lower().replace("_", "-"))
        except ValueError:
            raise InputError(
                f"unknown target policy {value!r}; expected one of {[p.value for p in cls]}"
            ) from None


@dataclass
class AttackResult:
    """An adversarial batch and how it fared.

    ``success`` [B] bool: the attacked model (substitute, or the oracle for decision-based attacks) gives
    the wrong label (untargeted) or the target (targeted) on ``x_adv``. ``norms`` [B]: ``||x_adv - x||``
    in ``norm``. ``labels`` [B]: the model's labels on ``x_adv`` (-1 where a decision-based untargeted
    attack knows only "not y"). ``queries``: the oracle ledger's counts
    spent by the attack (decision-based attacks only; ``None`` for white-box attacks).
    """

    x_adv: torch.Tensor
    success: torch.Tensor
    norms: torch.Tensor
    norm: Norm
    labels: torch.Tensor
    target: torch.Tensor | None = None
    queries: dict[str, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return float(self.success.float().mean()) if self.success.numel() else 0.0

    def summary(self) -> dict[str, Any]:
        ok = self.success
        return {
            "n": int(ok.numel()),
            "success_rate": self.success_rate,
            "norm": self.norm.value,
            "mean_norm": float(self.norms.mean()) if ok.numel() else None,
            "median_norm_successful": float(self.norms[ok].median()) if bool(ok.any()) else None,
            "queries": self.queries,
        }


def flat_norms(delta: torch.Tensor, norm: Norm | str) -> torch.Tensor:
    """Per-example norms ``[B]`` of a batch of perturbations."""
    flat = delta.detach().flatten(1).float()
    return flat.abs().amax(1) if Norm.parse(norm) is Norm.LINF else flat.norm(dim=1)


def _per_example(v: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """A scalar or ``[B]`` vector broadcastable against ``[B, C, H, W]``."""
    v = torch.as_tensor(v, dtype=like.dtype, device=like.device)
    return v.reshape(-1, *([1] * (like.dim() - 1))) if v.dim() == 1 else v


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor | float, norm: Norm | str) -> torch.Tensor:
    """Project ``x_adv`` onto the ``eps``-ball around ``x`` in ``norm``, then clip to [0, 1].

    The single place where evasion attacks clip. ``eps`` is a scalar or one radius per example.
    """
    delta = x_adv - x
    if Norm.parse(norm) is Norm.LINF:
        if isinstance(eps, float | int):  # the common case: one radius, a single fused clamp
            delta = delta.clamp_(-float(eps), float(eps))
        else:
            e = _per_example(eps, x)
            delta = torch.maximum(torch.minimum(delta, e), -e)
    else:
        n = delta.flatten(1).norm(dim=1).clamp_min(TINY)
        radius = torch.as_tensor(eps, dtype=n.dtype, device=n.device).expand_as(n)
        delta = delta * _per_example((radius / n).clamp(max=1.0), x)
    return (x + delta).clamp_(0.0, 1.0)


def clip_box(x: torch.Tensor) -> torch.Tensor:
    """Clip to the valid pixel range [0, 1] (no ball: for minimum-norm and decision-based attacks)."""
    return x.clamp(0.0, 1.0)


def is_success(labels: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Untargeted: label differs from ``y``; targeted: label equals ``target``."""
    return labels == target if target is not None else labels != y


def check_batch(x: torch.Tensor, y: torch.Tensor, *, what: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """Validate an attack's inputs: float NCHW in [0, 1] and one int label per image."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 2:
        raise InputError(f"{what} must be a float tensor [B, C, H, W] of pixels in [0, 1]")
    if x.numel() and (float(x.min()) < -1e-6 or float(x.max()) > 1 + 1e-6):
        raise InputError(f"{what} must hold pixels in [0, 1]; scale your images (normalisation is in the model)")
    y = torch.as_tensor(y).long().reshape(-1)
    if y.numel() != x.shape[0]:
        raise InputError(f"need one label per image: {x.shape[0]} images, {y.numel()} labels")
    return x.detach().float().clamp(0, 1), y.to(x.device)


def check_target(target: torch.Tensor | int | None, y: torch.Tensor, targeted: bool, num_classes: int | None = None
                 ) -> torch.Tensor | None:
    """The per-example target classes of a targeted attack (``None`` when untargeted)."""
    if not targeted:
        if target is not None:
            raise InputError("a target was given but targeted=False; pass targeted=True or drop the target")
        return None
    if target is None:
        raise InputError("a targeted attack needs target classes: pass target= (one class or one per image)")
    t = torch.as_tensor(target).long().reshape(-1).to(y.device)
    if t.numel() == 1:
        t = t.expand(y.numel()).clone()
    if t.numel() != y.numel():
        raise InputError(f"target must be one class or one per image ({y.numel()}), got {t.numel()}")
    if int(t.min()) < 0 or (num_classes is not None and int(t.max()) >= num_classes):
        raise InputError(f"target classes must lie in [0, {num_classes - 1 if num_classes else 'K-1'}]")
    return t


def choose_targets(policy: TargetPolicy | str, y: torch.Tensor, num_classes: int, *,
                   substitute_logits: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """Per-example target classes under ``policy`` (see :class:`TargetPolicy`).

    For ``second`` the target equals the label where the label is 1: callers skip those examples.
    ``least-likely`` needs the substitute's logits on the clean images.
    """
    policy = TargetPolicy.parse(policy)
    if num_classes < 2:
        raise InputError("a targeted attack needs at least two classes")
    if policy is TargetPolicy.SECOND:
        return torch.ones_like(y)
    if policy is TargetPolicy.RANDOM:
        gen = torch.Generator().manual_seed(seed)
        shift = torch.randint(1, num_classes, (y.numel(),), generator=gen).to(y.device)
        return (y + shift) % num_classes
    if substitute_logits is None:
        raise InputError("least-likely targets need the substitute's logits on the clean images")
    return substitute_logits.argmin(dim=1).to(y.device)


def model_labels(model: nn.Module, x: torch.Tensor, *, batch_size: int = 1024) -> torch.Tensor:
    """The model's labels on ``x`` (no gradients, in chunks)."""
    with torch.no_grad():
        return torch.cat([model(x[i : i + batch_size]).argmax(1) for i in range(0, x.shape[0], batch_size)])


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and no parameter gradients for the duration; the model's state is restored after."""
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, f in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(f)
        model.train(was_training)
