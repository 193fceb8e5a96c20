"""The zeroth-order gradient estimator shared by DFME and MAZE (the one implementation in stealkit).

DFME (Truong et al., "Data-Free Model Extraction", CVPR 2021, Sec. 3.3, Eq. 5-6; reference code
``estimate_gradient_objective``) and MAZE (Kariyappa et al., CVPR 2021, Sec. 3.2, Eq. 6) both train the
generator through a black-box victim by estimating the gradient of the student-victim disagreement ``L`` with
respect to the generator's output with forward differences along ``m`` random unit directions:

    grad_x L(x) ~= d / m * sum_j (L(x + eps u_j) - L(x)) / eps * u_j,      u_j ~ Uniform(unit sphere in R^d)

``d = C*H*W``. The differences are taken in the generator's **pre-tanh** output space (the reference code does
so: ``x_pre + eps u`` is squashed to pixels before the victim sees it), so every perturbed point is a valid
image. Each sample costs ``m + 1`` victim queries (the base point and ``m`` directions), sent as one batch and
charged to the oracle's ledger by the oracle itself. The objective is the batch mean of the per-sample loss,
so the returned gradient carries a ``1 / B`` factor; the caller back-propagates it into the generator with
``x_pre.backward(grad)`` (the attacks pass ``-L`` to *maximise* disagreement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stealkit.errors import InputError
from stealkit.models.generators import to_pixels

#: ``query(pixels [N, C, H, W]) -> answers [N, ...]``: the (metered) victim
QueryFn = Callable[[torch.Tensor], torch.Tensor]
#: ``loss(pixels [N, C, H, W], answers [N, ...]) -> per-sample loss [N]`` (the student is inside)
PointLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ZOEstimate:
    """What one estimate produced: the gradient w.r.t. ``x_pre``, and the base points and their answers.

    ``base_pixels``/``base_answers`` are the unperturbed images and the victim's answers for them, already
    paid for: MAZE reuses them for its first clone step instead of querying again.
    """

    grad: torch.Tensor
    loss: float
    base_pixels: torch.Tensor
    base_answers: torch.Tensor


def queries_per_sample(directions: int) -> int:
    """Victim queries one sample costs: the base point plus one per direction."""
    return directions + 1


def random_unit_directions(
    batch: int, directions: int, dim: int, *, generator: torch.Generator | None = None, device: str = "cpu"
) -> torch.Tensor:
    """``[batch, directions, dim]`` Gaussian vectors normalised to unit length (uniform on the sphere)."""
    u = torch.randn(batch, directions, dim, generator=generator).to(device)
    return u / u.norm(dim=2, keepdim=True).clamp_min(1e-12)


def estimate_gradient(
    x_pre: torch.Tensor,
    loss_fn: PointLoss,
    query: QueryFn,
    *,
    directions: int = 1,
    epsilon: float = 1e-3,
    generator: torch.Generator | None = None,
) -> ZOEstimate:
    """Forward-difference estimate of ``grad_{x_pre} mean_i loss(to_pixels(x_pre_i), victim(...))``.

    Args:
        x_pre: generator output before tanh, ``[B, C, H, W]`` (detached here).
        loss_fn: per-sample loss of the student against the victim's answers; evaluated without gradients.
        query: the metered victim; called once with ``B * (directions + 1)`` images.
        directions: ``m``, random unit directions per sample (DFME uses 1, MAZE 10).
        epsilon: the finite-difference step in pre-tanh space (1e-3 in both reference codes).
        generator: source of the random directions (checkpointed by the caller for exact resumes).
    """
    if directions < 1:
        raise InputError(f"the gradient estimator needs at least one direction, got {directions}")
    if not epsilon > 0:
        raise InputError(f"the finite-difference step epsilon must be positive, got {epsilon}")
    x_pre = x_pre.detach()
    b, shape = x_pre.shape[0], tuple(x_pre.shape[1:])
    dim = x_pre[0].numel()
    u = random_unit_directions(b, directions, dim, generator=generator, device=str(x_pre.device))
    base = x_pre.reshape(b, 1, dim)
    points = torch.cat([base, base + epsilon * u], dim=1)  # [B, m + 1, d]; index 0 is the base point
    pixels = to_pixels(points.reshape(b * (directions + 1), *shape))
    answers = query(pixels)
    with torch.no_grad():
        losses = loss_fn(pixels, answers.to(pixels.device)).reshape(b, directions + 1).float()
    diffs = (losses[:, 1:] - losses[:, :1]) / epsilon  # [B, m]
    grad = dim * (diffs.unsqueeze(2) * u).mean(dim=1) / b  # d * mean over directions, / B for the batch mean
    idx = torch.arange(b, device=pixels.device) * (directions + 1)
    return ZOEstimate(
        grad=grad.reshape(b, *shape),
        loss=float(losses[:, 0].mean()),
        base_pixels=pixels[idx],
        base_answers=answers[idx.to(answers.device)],
    )
