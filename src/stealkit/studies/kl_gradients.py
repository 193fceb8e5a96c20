"""Input-gradient norms of the KL and l1 losses: Hypothesis 1 (Truong et al., DFME, CVPR 2021, appendix D).

Hypothesis 1 says that as the student ``S`` converges to the victim ``V``, the gradient of the KL loss with
respect to the *input* vanishes against that of the l1 loss on logits::

    ||grad_x L_KL(x)||  <<  ||grad_x L_l1(x)||      as S -> V

(D.2: the KL gradient is ``dV/dv * sum_i delta_i (dv_i/dx - ds_i/dx)`` with ``delta_i -> 0``, bounded by Lemma 2,
where the l1 gradient keeps unit weights ``sign(v_i - s_i)``). This is why DFME trains its generator on l1.

Both losses follow D.2 per image, summed over classes: ``L_KL = sum_i V_i log(V_i / S_i)`` and
``L_l1 = sum_i |v_i - s_i|`` (the reference code's ``F.l1_loss`` averages over classes instead, which divides
the l1 norm, and multiplies the ratio, by K). The gradient flows through both networks, as in the paper's
derivation, so measuring it needs the victim's weights: this is an experimenter's instrument (the study and
the report), never part of an attack, and it spends no query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def kl_per_sample(victim_logits: torch.Tensor, student_logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``KL(V_tau || S_tau)`` per row (D.2 with temperature ``tau``; A.1 multiplies it by ``tau**2``)."""
    log_v = F.log_softmax(victim_logits / tau, dim=1)
    log_s = F.log_softmax(student_logits / tau, dim=1)
    return (log_v.exp() * (log_v - log_s)).sum(dim=1)


def l1_per_sample(victim_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """``sum_i |v_i - s_i|`` per row (D.2)."""
    return (victim_logits - student_logits).abs().sum(dim=1)


def input_gradient_norms(
    victim: nn.Module, student: nn.Module, x: torch.Tensor, *, tau: float = 1.0, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image L2 norms ``(||grad_x L_KL||, ||grad_x L_l1||)``, each ``[N]``, through both networks.

    Both models are put in eval mode for the measurement and restored afterwards. Rows are independent,
    so the gradient of the batch sum gives every image's own gradient.
    """
    modes = (victim.training, student.training)
    victim.eval()
    student.eval()
    device = next(student.parameters()).device
    kl_norms, l1_norms = [], []
    try:
        for i in range(0, x.shape[0], batch_size):
            xb = x[i : i + batch_size].to(device).detach().requires_grad_(True)
            v, s = victim(xb), student(xb)
            (g_kl,) = torch.autograd.grad(kl_per_sample(v, s, tau).sum(), xb, retain_graph=True)
            (g_l1,) = torch.autograd.grad(l1_per_sample(v, s).sum(), xb)
            kl_norms.append(g_kl.flatten(1).norm(dim=1).cpu())
            l1_norms.append(g_l1.flatten(1).norm(dim=1).cpu())
    finally:
        victim.train(modes[0])
        student.train(modes[1])
    return torch.cat(kl_norms), torch.cat(l1_norms)


@dataclass(frozen=True)
class GradientPoint:
    """One measurement of Hypothesis 1 at a point of training (medians over the measured images)."""

    epoch: int
    kl_norm: float
    l1_norm: float
    ratio: float  # median over images of ||grad KL|| / ||grad l1||
    ratio_q90: float  # 90th percentile of the per-image ratio
    kl_loss: float
    l1_loss: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def measure(victim: nn.Module, student: nn.Module, x: torch.Tensor, *, epoch: int, tau: float = 1.0) -> GradientPoint:
    """Hypothesis-1 statistics of ``student`` against ``victim`` on the images ``x``."""
    kl_n, l1_n = input_gradient_norms(victim, student, x, tau=tau)
    ratio = kl_n / l1_n.clamp_min(1e-30)
    with torch.no_grad():
        device = next(student.parameters()).device
        v, s = victim.eval()(x.to(device)), student.eval()(x.to(device))
        kl_loss, l1_loss = float(kl_per_sample(v, s, tau).mean()), float(l1_per_sample(v, s).mean())
    return GradientPoint(
        epoch=epoch,
        kl_norm=float(kl_n.median()),
        l1_norm=float(l1_n.median()),
        ratio=float(ratio.median()),
        ratio_q90=float(ratio.quantile(0.9)),
        kl_loss=kl_loss,
        l1_loss=l1_loss,
    )
