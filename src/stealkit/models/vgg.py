"""A narrow VGG-11 (Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
Recognition", ICLR 2015, configuration "A"), in its CIFAR form: 3x3 convolutions with batch norm, five
2x2 max-pools and a single linear classifier on the pooled features.

Adaptations: channels are ``round(c * width)`` for the paper's ``c`` in (64, 128, 256, 512), with
``width=0.25`` by default so it trains on a CPU; a max-pool that would shrink the map below 1x1 is
skipped (an 8x8 input uses three of the five pools, 28x28 uses four); an adaptive average pool to 1x1
before the classifier makes any remaining map size work.
"""

from __future__ import annotations

from torch import Tensor, nn

from stealkit.models._checks import boolean, positive_float
from stealkit.models.layers import pool_out

__all__ = ["VGG11_CONFIG", "VGG", "vgg11"]

VGG11_CONFIG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """VGG body built from a configuration of channel counts and ``"M"`` (max-pool) entries."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        config: tuple[int | str, ...] = VGG11_CONFIG,
        width: float = 0.25,
        bn: bool = True,
    ):
        super().__init__()
        c, h, w = input_shape
        layers: list[nn.Module] = []
        for entry in config:
            if entry == "M":
                fits, h, w = pool_out(h, w)
                if fits:
                    layers.append(nn.MaxPool2d(2))
                continue
            out = max(1, round(int(entry) * width))
            layers.append(nn.Conv2d(c, out, 3, padding=1, bias=not bn))
            if bn:
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU(inplace=True))
            c = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


def vgg11(
    input_shape: tuple[int, int, int], num_classes: int, *, width: float = 0.25, bn: bool = True
) -> nn.Module:
    """VGG-11 with channels scaled by ``width`` (default 0.25: 16 to 128 channels) and optional batch norm."""
    width = positive_float("vgg11", "width", width)
    bn = boolean("vgg11", "bn", bn)
    return VGG(input_shape, num_classes, VGG11_CONFIG, width=width, bn=bn)
