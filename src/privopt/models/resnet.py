"""ResNet20 for 32x32 (or 28x28) images with GroupNorm instead of BatchNorm (docs/models.md, `resnet20`).

Layout of He et al. (2016) for CIFAR: a 3x3 stem with 16 channels, three stages of three basic
blocks (16, 32, 64 channels; the 2nd and 3rd start with stride 2), global average pooling and a
linear classifier. Shortcuts that change shape are parameter-free (stride-2 subsampling plus zero
channel padding, "option A"), which keeps the model at ~0.27M parameters. BatchNorm would mix
samples and break per-sample clipping, so every normalisation is GroupNorm (default 16 groups,
capped by the channel count). The stem takes ``input_shape[0]`` channels, so 1-channel 28x28
MNIST works unchanged (feature maps 28 -> 14 -> 7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privopt.models.registry import _check_groups, _require_image, register_model


def _gn(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(_check_groups(channels, groups, f"a {channels}-channel layer"), channels)


class BasicBlock(nn.Module):
    """conv3x3 -> GN -> ReLU -> conv3x3 -> GN, plus (padded) identity shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _gn(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.gn2 = _gn(cout, groups)
        self.stride, self.pad = stride, cout - cin

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet with ``6n + 2`` layers (n = blocks per stage)."""

    def __init__(
        self, *, in_channels: int, num_classes: int, blocks_per_stage: int = 3, width: int = 16, groups: int = 16
    ):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.gn = _gn(width, groups)
        stages, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            blocks = [
                BasicBlock(cin if j == 0 else cout, cout, 2 if (i > 0 and j == 0) else 1, groups)
                for j in range(blocks_per_stage)
            ]
            stages.append(nn.Sequential(*blocks))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn(self.conv(x)))
        out = self.stages(out)
        return self.fc(out.mean(dim=(2, 3)))


@register_model("resnet20")
def resnet20(*, input_shape: tuple[int, ...], num_classes: int, groups: int = 16, width: int = 16) -> nn.Module:
    """ResNet20-GN (~0.27M parameters for 10 classes); works on any HxW >= 8."""
    c, _, _ = _require_image("resnet20", input_shape)
    return ResNet(in_channels=c, num_classes=num_classes, blocks_per_stage=3, width=width, groups=groups)
