"""CIFAR-style ResNets (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

This is the family used as target and student in data-free model extraction: DFME (Truong et al.,
"Data-Free Model Extraction", CVPR 2021) steals a ResNet-34-8x with a ResNet-18-8x, following DFAD
(Fang et al., 2019). Compared with the ImageNet ResNet, the stem is a single 3x3 convolution with stride 1
and there is no max-pool, so a 32x32 input reaches the last stage at 4x4 (an 8x reduction, hence "-8x").

Adaptations: the head is an adaptive average pool to 1x1, so the same network runs on 8x8 and 28x28
inputs (an 8x8 input reaches the last stage at 1x1). ``depth=8`` ([1, 1, 1, 1] BasicBlocks) and
fractional ``width`` (channels ``round(64 * width)``, ``(64, 128, 256, 512)`` at width 1) are CPU-sized
variants of the same design.
"""

from __future__ import annotations

from torch import Tensor, nn

from stealkit.errors import InputError
from stealkit.models._checks import positive_float

__all__ = ["RESNET_LAYERS", "BasicBlock", "ResNet", "resnet"]

RESNET_LAYERS: dict[int, tuple[int, int, int, int]] = {8: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut (He et al. 2016)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet body: 3x3 stem, four stages of BasicBlocks (strides 1, 2, 2, 2), global pool, linear."""

    def __init__(self, in_channels: int, num_classes: int, layers: tuple[int, ...], base_width: int = 64):
        super().__init__()
        widths = [base_width, 2 * base_width, 4 * base_width, 8 * base_width]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        in_planes = widths[0]
        stages = []
        for i, (planes, blocks) in enumerate(zip(widths, layers, strict=True)):
            stride = 1 if i == 0 else 2
            stage = []
            for b in range(blocks):
                stage.append(BasicBlock(in_planes, planes, stride if b == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(in_planes, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``[B, 8 * base_width]`` (after the global average pool)."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.pool(out).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.features(x))


def resnet(
    input_shape: tuple[int, int, int], num_classes: int, *, depth: int = 18, width: float = 1.0
) -> nn.Module:
    """CIFAR-style ResNet-``depth`` (8, 18 or 34) with ``round(64 * width)`` stem channels."""
    if isinstance(depth, bool) or depth not in RESNET_LAYERS:
        raise InputError(f"resnet: depth must be one of {sorted(RESNET_LAYERS)}, got {depth!r}")
    width = positive_float("resnet", "width", width)
    base = max(1, round(64 * width))
    return ResNet(input_shape[0], num_classes, RESNET_LAYERS[depth], base_width=base)
