"""Scoring a smoothed classifier: certified accuracy against radius, empirical robust accuracy under
attacks that average over the noise (EOT), and the soundness check of the certificates.

Li et al. (NeurIPS 2019): Sec. 6.1 (certified accuracy lower bounds, Figure 1, Table 1), Sec. 6.2 (white-box
EOT attacks: PGD Linf, C&W L2 with gradients averaged over noise draws, Figures 2-3) and Appendix D.2 (the
Boundary attack as a gradient-free sanity check). The attacks come from :mod:`stealkit.evade`.

The soundness check attacks each certified test point *inside* its certified radius with EOT-PGD L2 and
re-estimates the smoothed prediction with fresh noise; a certificate is violated when that prediction is a
different class (Cohen's PREDICT at level ``alpha`` returns a class other than the certified one).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from stealkit.certify.smoothing import ABSTAIN, Certificate, noisy_counts, predict
from stealkit.device import module_device
from stealkit.errors import InputError

log = logging.getLogger(__name__)

Attack = Literal["pgd-linf", "pgd-l2", "cw-l2", "boundary"]
ATTACKS: tuple[str, ...] = ("pgd-linf", "pgd-l2", "cw-l2", "boundary")


def certified_accuracy(certs: Sequence[Certificate], y: Sequence[int] | torch.Tensor, bound: str,
                       radii: Sequence[float]) -> list[float]:
    """Fraction of inputs certified correct at each radius: not abstaining, label = y, radius >= r."""
    ys = [int(v) for v in y]
    if len(ys) != len(certs):
        raise InputError(f"{len(certs)} certificates but {len(ys)} labels")
    if not certs:
        return [0.0 for _ in radii]
    return [sum(c.certified(bound, t, r) for c, t in zip(certs, ys, strict=True)) / len(certs) for r in radii]


def summarize(certs: Sequence[Certificate], y: Sequence[int] | torch.Tensor, radii: Sequence[float],
              bounds: Sequence[str]) -> dict[str, Any]:
    """Certified accuracy per bound and radius, abstention rates, accuracy of the selected labels, and the
    median radius of correctly certified points."""
    ys = [int(v) for v in y]
    out: dict[str, Any] = {"num_images": len(certs), "radii": list(radii), "certified_accuracy": {},
                           "abstain_rate": {}, "median_radius": {}}
    for b in bounds:
        out["certified_accuracy"][b] = dict(zip([f"{r:g}" for r in radii], certified_accuracy(certs, ys, b, radii),
                                                strict=True))
        out["abstain_rate"][b] = float(np.mean([c.radius.get(b) is None for c in certs])) if certs else 0.0
        good = [c.radius[b] for c, t in zip(certs, ys, strict=True) if c.certified(b, t, 0.0)]
        out["median_radius"][b] = float(np.median(good)) if good else None
    out["selection_accuracy"] = float(np.mean([c.label == t for c, t in zip(certs, ys, strict=True)])) if certs else 0.0
    return out


def certified_curve(certs: Sequence[Certificate], y: Sequence[int] | torch.Tensor, bound: str, *,
                    max_radius: float | None = None, points: int = 41) -> tuple[list[float], list[float]]:
    """(radii, certified accuracy) on a regular grid from 0 to ``max_radius`` (default: the largest radius)."""
    rs = [c.radius.get(bound) or 0.0 for c in certs]
    top = max_radius if max_radius is not None else max([*rs, 1e-3])
    grid = [float(v) for v in np.linspace(0.0, top, points)]
    return grid, certified_accuracy(certs, y, bound, grid)


class SmoothedLabels(nn.Module):
    """The smoothed classifier as a module for a label-only oracle: ``forward(x)`` returns the class counts of
    ``n`` noisy copies (as floats), so the arg-max is Algorithm 1's prediction. Fresh noise every call."""

    def __init__(self, model: nn.Module, sigma: float, n: int, *, num_classes: int, seed: int = 0,
                 batch_size: int = 1000) -> None:
        super().__init__()
        self.model, self.sigma, self.n, self.num_classes = model, float(sigma), int(n), int(num_classes)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            c = noisy_counts(self.model, x, self.sigma, (self.n,), num_classes=self.num_classes,
                             batch_size=self.batch_size, generator=self.generator, device=x.device)[0]
        return c.float().to(x.device)


def _smoothed_labels(model: nn.Module, x: torch.Tensor, sigma: float, n: int, seed: int) -> torch.Tensor:
    """The (smoothed) labels of ``x``, computed on the model's device, returned on the CPU."""
    if sigma <= 0:
        with torch.no_grad():
            return model(x.to(module_device(model))).argmax(1).cpu()
    return predict(model, x, sigma, n, seed=seed)[0].cpu()


def empirical_robust_accuracy(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    sigma: float,
    attack: Attack,
    eps: Sequence[float],
    eot_samples: int = 10,
    n_predict: int = 100,
    steps: int = 20,
    seed: int = 0,
    boundary_steps: int = 200,
    boundary_n: int = 20,
    cw_steps: int = 100,
    cw_kappa: float = 2.0,
    cw_lr: float = 0.05,
) -> list[dict[str, Any]]:
    """Accuracy of the smoothed classifier (Algorithm 1, arg-max of ``n_predict`` noisy copies) under
    ``attack`` at each size in ``eps``; ``sigma = 0`` evaluates the base model without noise.

    ``pgd-linf``/``pgd-l2``: PGD with ``steps`` steps and loss gradients averaged over ``eot_samples`` noise
    draws per step (Li et al. Sec. 6.2). ``cw-l2``: C&W L2 on the EOT-smoothed soft classifier
    (:class:`~stealkit.evade.EOTModel`); minimum-norm, so one run scores every eps (an example counts as
    broken at eps if its adversarial example has norm <= eps and fools the smoothed classifier). A
    minimum-norm example sits on the boundary of the Monte-Carlo estimate, where fresh noise flips it back,
    so C&W runs with a margin ``cw_kappa`` on the log-probabilities (2.0: the wrong class ``e^2`` times as
    likely as the true one) and Adam step ``cw_lr``; with the reference's ``kappa = 0, lr = 0.01`` and 30
    steps it fooled 2% of a digits STN model's points against 96% with these settings (50 points, sigma 0.5).
    ``boundary``: the Boundary attack against the smoothed classifier as a label-only oracle answering the
    arg-max of ``boundary_n`` noisy copies (App. D.2); its final examples are scored with ``n_predict``.
    """
    from stealkit.evade import EOTModel, pgd

    if attack not in ATTACKS:
        raise InputError(f"unknown attack {attack!r}; expected one of {', '.join(ATTACKS)}")
    model.eval()
    dev = module_device(model)
    y_cpu, x, y = y.cpu(), x.to(dev), y.to(dev)  # attacks run where the model is; labels are compared on the CPU
    clean = _smoothed_labels(model, x, sigma, n_predict, seed + 1)
    rows: list[dict[str, Any]] = []
    if attack.startswith("pgd"):
        norm = "linf" if attack == "pgd-linf" else "l2"
        for e in eps:
            if e <= 0:
                rows.append({"eps": e, "accuracy": float((clean == y_cpu).float().mean())})
                continue
            res = pgd(model, x, y, eps=float(e), steps=steps, norm=norm, eot_samples=eot_samples if sigma > 0 else 1,
                      eot_sigma=sigma, seed=seed)
            labels = _smoothed_labels(model, res.x_adv, sigma, n_predict, seed + 2)
            rows.append({"eps": e, "accuracy": float((labels == y_cpu).float().mean())})
        return rows
    if attack == "cw-l2":
        from stealkit.evade.gradient_based.cw import carlini_wagner_l2

        target = EOTModel(model, sigma, eot_samples, seed=seed) if sigma > 0 else model
        res = carlini_wagner_l2(target, x, y, steps=cw_steps, binary_search_steps=5, initial_const=1.0,
                                kappa=cw_kappa if sigma > 0 else 0.0, lr=cw_lr)
        adv_labels = _smoothed_labels(model, res.x_adv, sigma, n_predict, seed + 2)
        norms = res.norms.cpu()
    else:
        from stealkit.evade.decision_based.boundary import BoundaryConfig, boundary_attack
        from stealkit.oracle import LocalOracle

        k = int(getattr(model, "num_classes", 0) or model(x[:1]).shape[1])
        wrapped = SmoothedLabels(model, sigma, boundary_n, num_classes=k, seed=seed) if sigma > 0 else model
        # the oracle keeps the model on its device (LocalOracle moves its model to ``device``); the label-only
        # attack works on host tensors and the oracle sends each query to the model
        oracle = LocalOracle(wrapped, tuple(x.shape[1:]), num_classes=k, mode="label", device=dev)
        res = boundary_attack(oracle, x.cpu(), y_cpu, config=BoundaryConfig(steps=boundary_steps, seed=seed))
        adv_labels = _smoothed_labels(model, res.x_adv, sigma, n_predict, seed + 2)
        success, dist = res.success.cpu(), res.norms.cpu()
        norms = torch.where(success, dist, torch.full_like(dist, math.inf))
    fooled = adv_labels != y_cpu
    for e in eps:
        broken = (clean != y_cpu) | (fooled & (norms <= e + 1e-6))
        rows.append({"eps": e, "accuracy": float((~broken).float().mean())})
    return rows


def soundness_check(
    model: nn.Module,
    x: torch.Tensor,
    certs: Sequence[Certificate],
    *,
    bounds: Sequence[str] = ("cohen", "renyi"),
    eot_samples: int = 16,
    steps: int = 40,
    n_predict: int = 1000,
    alpha: float = 0.001,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Attack every certified point inside its certified radius (EOT-PGD L2 at eps = radius, aimed at moving
    the smoothed prediction off the certified label) and re-estimate the prediction with fresh noise.

    One row per (point, bound): ``violation`` is True when Cohen's PREDICT (``n_predict`` samples, level
    ``alpha``) returns a class other than the certified one; ``argmax_changed`` when the plain arg-max does.
    """
    from stealkit.evade import pgd

    rows: list[dict[str, Any]] = []
    sigma = certs[0].sigma if certs else 1.0
    dev = module_device(model)
    for i, cert in enumerate(certs):
        for b in bounds:
            r = cert.radius.get(b)
            if r is None or r <= 0 or not math.isfinite(r):
                continue
            xi = x[i : i + 1].to(dev)
            label = torch.tensor([cert.label], device=dev)
            res = pgd(model, xi, label, eps=float(r), steps=steps, norm="l2", eot_samples=eot_samples,
                      eot_sigma=sigma, seed=seed + i)
            lab, counts = predict(model, res.x_adv, sigma, n_predict, alpha=alpha, seed=seed + 10_000 + i)
            arg = int(counts[0].argmax())
            pred = int(lab[0])
            rows.append({"index": i, "bound": b, "radius": float(r), "label": cert.label,
                         "attack_norm": float(res.norms[0]), "prediction": pred,
                         "abstain": pred == ABSTAIN, "argmax_changed": arg != cert.label,
                         "violation": pred not in (ABSTAIN, cert.label),
                         "top_fraction": float(counts[0, cert.label]) / n_predict})
    return rows
