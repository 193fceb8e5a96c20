"""Generators for data-free model extraction. Both produce pixels in ``[0, 1]`` (float32, NCHW).

* :class:`UpsampleGenerator`: the generator of DFME (Truong et al., "Data-Free Model Extraction", CVPR 2021)
  and MAZE (Kariyappa et al., "MAZE: Data-Free Model Stealing Attack Using Zeroth-Order Gradient
  Estimation", CVPR 2021), itself DFAD's (Fang et al., 2019): a linear layer to a ``(H/4) x (W/4)`` map, two
  nearest-neighbour x2 upsampling conv blocks, a 3x3 conv to the image channels, a non-affine batch norm and
  tanh. DFME feeds the tanh output (in ``[-1, 1]``) to a target that expects normalised images; stealkit
  models take pixels in ``[0, 1]`` and normalise inside, so the output here is ``(tanh + 1) / 2``.
* :class:`DaSTGenerator`: the label-controllable, multi-branch generator of DaST (Zhou et al., "DaST:
  Data-free Substitute Training for Adversarial Attacks", CVPR 2020): one branch per class turns
  the noise into a feature map, and a shared upsampling trunk turns it into an image, so the label of each
  synthetic sample is chosen by routing it through that label's branch.

Sizes that are not multiples of 4 are handled by starting from ``ceil(H/4) x ceil(W/4)`` and centre-cropping
the ``4 * ceil(H/4)``-sized output to ``H x W`` (8x8 starts at 2x2, 28x28 at 7x7, 32x32 at 8x8: no crop).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from stealkit.errors import InputError
from stealkit.models._checks import positive_int
from stealkit.models.layers import valid_input_shape

__all__ = ["DaSTGenerator", "UpsampleGenerator", "to_pixels"]


def to_pixels(pre: Tensor) -> Tensor:
    """Map a pre-tanh tensor to pixels in ``[0, 1]``: ``(tanh(pre) + 1) / 2``."""
    return (torch.tanh(pre) + 1) / 2


class _UpsampleTrunk(nn.Module):
    """From a ``2*ngf x s_h x s_w`` map: [up x2, conv 2ngf->2ngf, BN, LReLU(0.2)], [up x2, conv 2ngf->ngf, BN,
    LReLU(0.2)], conv ngf->C, BN(affine=False), then a centre crop to ``H x W``. Returns pre-tanh values."""

    def __init__(self, ngf: int, output_shape: tuple[int, int, int]):
        super().__init__()
        c, self.h, self.w = output_shape
        self.block1 = nn.Sequential(
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2, inplace=True),
        )
        self.block2 = nn.Sequential(
            nn.Conv2d(2 * ngf, ngf, 3, padding=1), nn.BatchNorm2d(ngf), nn.LeakyReLU(0.2, inplace=True)
        )
        self.out = nn.Conv2d(ngf, c, 3, padding=1)
        self.out_bn = nn.BatchNorm2d(c, affine=False)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block1(F.interpolate(x, scale_factor=2))
        x = self.block2(F.interpolate(x, scale_factor=2))
        x = self.out_bn(self.out(x))
        top, left = (x.shape[2] - self.h) // 2, (x.shape[3] - self.w) // 2
        return x[:, :, top : top + self.h, left : left + self.w]


def _seed_size(output_shape: tuple[int, int, int]) -> tuple[int, int]:
    return math.ceil(output_shape[1] / 4), math.ceil(output_shape[2] / 4)


def _check_noise(z: Tensor, nz: int, who: str) -> None:
    if not isinstance(z, Tensor) or z.dim() != 2 or z.shape[1] != nz:
        shape = list(z.shape) if isinstance(z, Tensor) else type(z).__name__
        raise InputError(f"{who} expects noise of shape [B, {nz}], got {shape}")


class UpsampleGenerator(nn.Module):
    """DFME/MAZE generator: ``Linear(nz -> 2ngf*s*s)`` (``s = H/4``), BN, two upsampling conv blocks,
    ``Conv3x3 ngf->C``, ``BN(affine=False)``, then ``(tanh + 1) / 2``.

    ``forward(z)`` returns pixels ``[B, C, H, W]`` in ``[0, 1]``; ``forward(z, pre_x=True)`` the pre-tanh
    tensor (DFME uses it for a loss on the unsquashed images); :meth:`to_pixels` maps one to the other.
    """

    def __init__(self, nz: int, output_shape: Sequence[int] = (3, 32, 32), ngf: int = 64):
        super().__init__()
        self.nz = positive_int("UpsampleGenerator", "nz", nz)
        self.ngf = positive_int("UpsampleGenerator", "ngf", ngf)
        self.output_shape = valid_input_shape(output_shape)
        self.seed_size = _seed_size(self.output_shape)
        sh, sw = self.seed_size
        self.linear = nn.Linear(nz, 2 * ngf * sh * sw)
        self.bn0 = nn.BatchNorm2d(2 * ngf)
        self.trunk = _UpsampleTrunk(ngf, self.output_shape)

    def forward(self, z: Tensor, pre_x: bool = False) -> Tensor:
        _check_noise(z, self.nz, "UpsampleGenerator")
        x = self.linear(z).view(z.shape[0], 2 * self.ngf, *self.seed_size)
        pre = self.trunk(self.bn0(x))
        return pre if pre_x else self.to_pixels(pre)

    @staticmethod
    def to_pixels(pre: Tensor) -> Tensor:
        """Pre-tanh values to pixels in ``[0, 1]``."""
        return to_pixels(pre)


class DaSTGenerator(nn.Module):
    """DaST's label-controllable generator: per class ``k`` a branch ``Linear(nz -> 2ngf*s*s)`` + ``BN`` +
    ``ReLU`` (the batch norm is over the ``2ngf`` channels of the reshaped ``s x s`` map), then the shared
    upsampling trunk of :class:`UpsampleGenerator` and ``(tanh + 1) / 2``.

    ``forward(z, labels)`` sends sample ``i`` through branch ``labels[i]``; in training mode each branch's
    batch norm uses the statistics of the samples routed to it. :meth:`sample_labels` splits a batch evenly
    over the classes, as DaST does.
    """

    def __init__(self, nz: int, num_classes: int, output_shape: Sequence[int] = (3, 32, 32), ngf: int = 64):
        super().__init__()
        self.nz = positive_int("DaSTGenerator", "nz", nz)
        self.num_classes = positive_int("DaSTGenerator", "num_classes", num_classes, minimum=2)
        self.ngf = positive_int("DaSTGenerator", "ngf", ngf)
        self.output_shape = valid_input_shape(output_shape)
        self.seed_size = _seed_size(self.output_shape)
        sh, sw = self.seed_size
        self.branches = nn.ModuleList(
            nn.ModuleDict({"linear": nn.Linear(nz, 2 * ngf * sh * sw), "bn": nn.BatchNorm2d(2 * ngf)})
            for _ in range(num_classes)
        )
        self.trunk = _UpsampleTrunk(ngf, self.output_shape)

    def forward(self, z: Tensor, labels: Tensor, pre_x: bool = False) -> Tensor:
        _check_noise(z, self.nz, "DaSTGenerator")
        if (
            not isinstance(labels, Tensor)
            or labels.shape != (z.shape[0],)
            or labels.dtype
            not in (
                torch.int64,
                torch.int32,
            )
        ):
            raise InputError(
                f"DaSTGenerator expects integer labels of shape [{z.shape[0]}] (one per noise row), got "
                f"{labels.dtype if isinstance(labels, Tensor) else type(labels).__name__} "
                f"{list(labels.shape) if isinstance(labels, Tensor) else ''}"
            )
        labels = labels.to(torch.int64)
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise InputError(
                f"DaSTGenerator labels must be in [0, {self.num_classes - 1}], got {labels.unique().tolist()}"
            )
        feats = z.new_empty(z.shape[0], 2 * self.ngf, *self.seed_size)
        for k in labels.unique().tolist():
            idx = (labels == k).nonzero().squeeze(1)
            branch = self.branches[k]
            x = branch["linear"](z[idx]).view(idx.numel(), 2 * self.ngf, *self.seed_size)
            if self.training and idx.numel() * self.seed_size[0] * self.seed_size[1] == 1:
                raise InputError(
                    f"DaSTGenerator in training mode needs at least 2 samples of class {k} for {self.output_shape} "
                    "outputs (batch norm over a single value); use sample_labels with a larger batch"
                )
            feats[idx] = F.relu(branch["bn"](x))
        pre = self.trunk(feats)
        return pre if pre_x else to_pixels(pre)

    @staticmethod
    def to_pixels(pre: Tensor) -> Tensor:
        """Pre-tanh values to pixels in ``[0, 1]``."""
        return to_pixels(pre)

    def sample_labels(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """``batch`` labels split evenly over the classes (counts differ by at most one; which classes get
        the extra ones, and the order, are random), on the generator's device."""
        batch = positive_int("DaSTGenerator.sample_labels", "batch", batch)
        device = next(self.parameters()).device
        gen_device = generator.device if generator is not None else torch.device("cpu")
        classes = torch.randperm(self.num_classes, generator=generator, device=gen_device)
        labels = classes[torch.arange(batch, device=gen_device) % self.num_classes]
        labels = labels[torch.randperm(batch, generator=generator, device=gen_device)]
        return labels.to(device)
