"""HiFi-GAN's generator, written from jik876/hifi-gan ``models.py`` (``Generator``,
``ResBlock1``, ``init_weights``, ``get_padding``; config v1's shape, channels reduced).

Its convolutions are ``weight_norm(Conv1d(...))``, as published, in both kits: in the factory
form (the only one this model runs in: torch's ``weight_norm`` refuses an unbuilt weight, in
the instance form as it refuses torch's own lazy layers') the factory's first run lays each
such layer out as its eager class and learns its sizes, and the real run constructs it with
them, so ``weight_norm`` runs at the eager program's point. ``init_weights`` then writes
``m.weight.data.normal_(0, 0.01)`` into the weight ``weight_norm`` computed, as published (the
forward recomputes it from ``weight_g`` and ``weight_v``; the draws still move the stream).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import weight_norm

from .kit import Kit

LRELU_SLOPE = 0.1


def init_weights(m: nn.Module, mean: float = 0.0, std: float = 0.01) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(mean, std)


def get_padding(kernel_size: int, dilation: int = 1) -> int:
    return int((kernel_size * dilation - dilation) / 2)


class ResBlock1(nn.Module):
    def __init__(
        self, kit: Kit, channels: int, kernel_size: int = 3, dilation: tuple[int, ...] = (1, 3, 5)
    ) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            [
                weight_norm(
                    kit.Conv1d(
                        channels,
                        channels,
                        kernel_size,
                        stride=1,
                        dilation=d,
                        padding=get_padding(kernel_size, d),
                    ),
                )
                for d in dilation
            ]
        )
        self.convs1.apply(init_weights)
        self.convs2 = nn.ModuleList(
            [
                weight_norm(
                    kit.Conv1d(
                        channels,
                        channels,
                        kernel_size,
                        stride=1,
                        dilation=1,
                        padding=get_padding(kernel_size, 1),
                    ),
                )
                for _ in dilation
            ]
        )
        self.convs2.apply(init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            xt = F.leaky_relu(x, LRELU_SLOPE)
            xt = c1(xt)
            xt = F.leaky_relu(xt, LRELU_SLOPE)
            xt = c2(xt)
            x = xt + x
        return x


class Generator(nn.Module):
    def __init__(
        self,
        kit: Kit,
        mels: int = 8,
        upsample_rates: tuple[int, ...] = (4, 2),
        upsample_kernel_sizes: tuple[int, ...] = (8, 4),
        upsample_initial_channel: int = 16,
        resblock_kernel_sizes: tuple[int, ...] = (3, 7),
        resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5)),
    ) -> None:
        super().__init__()
        self.num_kernels = len(resblock_kernel_sizes)
        self.num_upsamples = len(upsample_rates)
        self.conv_pre = weight_norm(
            kit.Conv1d(mels, upsample_initial_channel, 7, stride=1, padding=3)
        )
        self.ups = nn.ModuleList()
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes, strict=True)):
            self.ups.append(
                weight_norm(
                    kit.ConvTranspose1d(
                        upsample_initial_channel // (2**i),
                        upsample_initial_channel // (2 ** (i + 1)),
                        k,
                        stride=u,
                        padding=(k - u) // 2,
                    ),
                )
            )
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = upsample_initial_channel // (2 ** (i + 1))
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes, strict=True):
                self.resblocks.append(ResBlock1(kit, ch, k, d))
        self.conv_post = weight_norm(kit.Conv1d(ch, 1, 7, stride=1, padding=3))
        self.ups.apply(init_weights)
        self.conv_post.apply(init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x)
        for i in range(self.num_upsamples):
            x = F.leaky_relu(x, LRELU_SLOPE)
            x = self.ups[i](x)
            xs = None
            for j in range(self.num_kernels):
                if xs is None:
                    xs = self.resblocks[i * self.num_kernels + j](x)
                else:
                    xs += self.resblocks[i * self.num_kernels + j](x)
            assert xs is not None
            x = xs / self.num_kernels
        x = F.leaky_relu(x)
        x = self.conv_post(x)
        return torch.tanh(x)


def make(kit: Kit) -> nn.Module:
    return Generator(kit)


def inputs() -> tuple[Any, ...]:
    return (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)),)
