"""ResNet, written from torchvision's ``resnet.py`` (Bottleneck): a ``kaiming_normal_(fan_out)``
loop over the modules, zero-initialized residual BatchNorms.
"""

from __future__ import annotations

import torch
from torch import nn

from .kit import Kit


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self,
        kit: Kit,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        width = planes
        self.conv1 = kit.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = kit.BatchNorm2d(width)
        self.conv2 = kit.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = kit.BatchNorm2d(width)
        self.conv3 = kit.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = kit.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(
        self,
        kit: Kit,
        layers: tuple[int, ...] = (1, 1, 1, 1),
        width: int = 8,
        num_classes: int = 10,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        self.kit = kit
        self.inplanes = width
        self.conv1 = kit.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = kit.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = kit.Linear(width * 8 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck) and m.bn3.weight is not None:
                    nn.init.constant_(m.bn3.weight, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        kit, downsample = self.kit, None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                kit.Conv2d(
                    self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False
                ),
                kit.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(kit, self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(kit, self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
