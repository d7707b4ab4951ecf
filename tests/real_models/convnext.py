"""ConvNeXt, written from facebookresearch's ``convnext.py``: layer scale ``gamma``, a
channels-first LayerNorm, ``trunc_normal_``, the head's ``.data.mul_``.
"""

from __future__ import annotations

import torch
from torch import nn

from .kit import Kit


class ChannelsFirstLayerNorm(nn.Module):
    """ConvNeXt's LayerNorm for (N, C, H, W): its own class, sized by the config."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, kit: Kit, dim: int, layer_scale_init_value: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = kit.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = kit.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = kit.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = kit.Linear(4 * dim, dim)
        self.gamma = (
            nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True)
            if layer_scale_init_value > 0
            else None
        )
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x
        x = self.dwconv(x).permute(0, 2, 3, 1)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        return inp + self.drop_path(x.permute(0, 3, 1, 2))


class ConvNeXt(nn.Module):
    def __init__(
        self,
        kit: Kit,
        in_chans: int = 3,
        num_classes: int = 10,
        depths: tuple[int, ...] = (1, 1),
        dims: tuple[int, ...] = (16, 32),
        head_init_scale: float = 0.5,
    ) -> None:
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        stem = nn.Sequential(
            kit.Conv2d(in_chans, dims[0], 4, stride=4), ChannelsFirstLayerNorm(dims[0])
        )
        self.downsample_layers.append(stem)
        for i in range(len(dims) - 1):
            self.downsample_layers.append(
                nn.Sequential(
                    ChannelsFirstLayerNorm(dims[i]), kit.Conv2d(dims[i], dims[i + 1], 2, stride=2)
                )
            )
        self.stages = nn.ModuleList(
            nn.Sequential(*[ConvNeXtBlock(kit, dims[i]) for _ in range(depths[i])])
            for i in range(len(dims))
        )
        self.norm = kit.LayerNorm(dims[-1], eps=1e-6)
        self.head = kit.Linear(dims[-1], num_classes)
        self.apply(self._init_weights)
        self.head.weight.data.mul_(head_init_scale)
        self.head.bias.data.mul_(head_init_scale)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for down, stage in zip(self.downsample_layers, self.stages, strict=True):
            x = stage(down(x))
        return self.head(self.norm(x.mean([-2, -1])))
