"""U-Net, written from milesial's ``unet_parts.py`` with the paper's init: ``normal_(0,
sqrt(2 / (k * k * in_channels)))`` reads an inferred size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .kit import Kit


class DoubleConv(nn.Sequential):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__(
            kit.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            kit.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            kit.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            kit.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__(nn.MaxPool2d(2), DoubleConv(kit, in_channels, out_channels))


class Up(nn.Module):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = kit.ConvTranspose2d(in_channels, in_channels // 2, 2, stride=2)
        self.conv = DoubleConv(kit, in_channels, out_channels)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        x1 = self.up(x1)
        dy, dx = x2.size(2) - x1.size(2), x2.size(3) - x1.size(3)
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, kit: Kit, n_channels: int = 1, n_classes: int = 2, base: int = 8) -> None:
        super().__init__()
        self.inc = DoubleConv(kit, n_channels, base)
        self.down1 = Down(kit, base, base * 2)
        self.down2 = Down(kit, base * 2, base * 4)
        self.up1 = Up(kit, base * 4, base * 2)
        self.up2 = Up(kit, base * 2, base)
        self.outc = kit.Conv2d(base, n_classes, 1)
        # the paper: "a Gaussian distribution with a standard deviation of sqrt(2/N), where N
        # denotes the number of incoming nodes of one neuron"
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.in_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))
