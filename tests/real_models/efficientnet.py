"""EfficientNet (timm), small: for lazynn's real-model tests.

Written from timm's ``timm/models/efficientnet.py`` (``EfficientNet``: stem, builder-made
stages, head, ``efficientnet_init_weights(self)``), ``timm/models/_efficientnet_blocks.py``
(``SqueezeExcite``, ``DepthwiseSeparableConv``, ``InvertedResidual``; ``DropPath`` from
``timm/layers/drop.py``) and ``timm/models/_efficientnet_builder.py`` (``EfficientNetBuilder``:
per-block stochastic depth ``drop_path_rate * block_idx / block_count``, SE ratio divided by
the expansion ratio, ``make_divisible``; ``_init_weight_goog``).

What its init code does (``_init_weight_goog`` over ``named_modules()``): every ``nn.Conv2d``
``normal_(0, sqrt(2 / fan_out))`` with ``fan_out = kh * kw * out_channels // groups`` and a
zero bias; every ``nn.BatchNorm2d`` ones / zeros; every ``nn.Linear``
``uniform_(-1/sqrt(fan_out), 1/sqrt(fan_out))`` with ``fan_out = weight.size(0)`` and a zero
bias. It reads only sizes the config tells (kernel, out channels, groups, out features).

Timm's ``BatchNormAct2d`` (a subclass of ``nn.BatchNorm2d`` with its activation inside) is
written as timm wrote it before ``norm_act_layer``: a ``BatchNorm2d`` then the activation as
its own module (``bn1``, ``act1``). Sizes only are reduced: stem 16, three one-block stages
(DS 16, IR 24 stride 2, IR 24 k5 with a residual and a live ``DropPath``), head 64.

The stochastic-depth line of other timm models (ViT, ConvNeXt, Swin) reads values of a tensor
made in ``__init__``: ``dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]``.
It is here too: its last value (``drop_path_rate``, through float32) is the rate the builder
spreads over the blocks, so a wrong ``.item()`` changes which blocks get a ``DropPath``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kit import Kit
from .timm_drop import DropPath


# --- timm/layers helpers ------------------------------------------------------------------------
def make_divisible(
    v: float, divisor: int = 8, min_value: int | None = None, round_limit: float = 0.9
) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def round_channels(
    channels: int, multiplier: float = 1.0, divisor: int = 8, channel_min: int | None = None
) -> int:
    if not multiplier:
        return channels
    return make_divisible(channels * multiplier, divisor, channel_min)


def get_padding(kernel_size: int, stride: int = 1, dilation: int = 1) -> int:
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


def create_conv2d(
    kit: Kit,
    in_chs: int,
    out_chs: int,
    kernel_size: int,
    stride: int = 1,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = False,
) -> nn.Module:
    """timm's ``create_conv2d`` / ``create_conv2d_pad`` with pad_type '': symmetric padding,
    no bias by default."""
    padding = get_padding(kernel_size, stride, dilation)
    return kit.Conv2d(
        in_chs,
        out_chs,
        kernel_size,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=bias,
    )


# --- timm/models/_efficientnet_blocks.py --------------------------------------------------------
class SqueezeExcite(nn.Module):
    def __init__(
        self,
        kit: Kit,
        in_chs: int,
        rd_ratio: float = 0.25,
        rd_channels: int | None = None,
        act_layer: Callable[..., nn.Module] = nn.ReLU,
        gate_layer: Callable[..., nn.Module] = nn.Sigmoid,
        rd_round_fn: Callable[[float], int] | None = None,
    ) -> None:
        super().__init__()
        if rd_channels is None:
            rd_round_fn = rd_round_fn or round
            rd_channels = rd_round_fn(in_chs * rd_ratio)
        self.conv_reduce = kit.Conv2d(in_chs, rd_channels, 1, bias=True)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = kit.Conv2d(rd_channels, in_chs, 1, bias=True)
        self.gate = gate_layer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        return x * self.gate(x_se)


class DepthwiseSeparableConv(nn.Module):
    """DS block: dw conv, BN, act, SE, pw conv, BN (no act), residual with DropPath."""

    def __init__(
        self,
        kit: Kit,
        in_chs: int,
        out_chs: int,
        dw_kernel_size: int = 3,
        stride: int = 1,
        dilation: int = 1,
        noskip: bool = False,
        pw_kernel_size: int = 1,
        act_layer: Callable[..., nn.Module] = nn.ReLU,
        se_layer: Callable[..., nn.Module] | None = None,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self.has_skip = (stride == 1 and in_chs == out_chs) and not noskip
        self.conv_dw = create_conv2d(
            kit, in_chs, in_chs, dw_kernel_size, stride=stride, dilation=dilation, groups=in_chs
        )
        self.bn1 = kit.BatchNorm2d(in_chs)
        self.act1 = act_layer(inplace=True)
        self.se = se_layer(kit, in_chs, act_layer=act_layer) if se_layer else nn.Identity()
        self.conv_pw = create_conv2d(kit, in_chs, out_chs, pw_kernel_size)
        self.bn2 = kit.BatchNorm2d(out_chs)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv_dw(x)))
        x = self.se(x)
        x = self.bn2(self.conv_pw(x))
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


class InvertedResidual(nn.Module):
    """MBConv: pw expansion, dw conv, SE, pw linear projection, residual with DropPath."""

    def __init__(
        self,
        kit: Kit,
        in_chs: int,
        out_chs: int,
        dw_kernel_size: int = 3,
        stride: int = 1,
        dilation: int = 1,
        noskip: bool = False,
        exp_ratio: float = 1.0,
        exp_kernel_size: int = 1,
        pw_kernel_size: int = 1,
        act_layer: Callable[..., nn.Module] = nn.ReLU,
        se_layer: Callable[..., nn.Module] | None = None,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self.has_skip = (in_chs == out_chs and stride == 1) and not noskip
        mid_chs = make_divisible(in_chs * exp_ratio)
        # Point-wise expansion
        self.conv_pw = create_conv2d(kit, in_chs, mid_chs, exp_kernel_size)
        self.bn1 = kit.BatchNorm2d(mid_chs)
        self.act1 = act_layer(inplace=True)
        # Depth-wise convolution
        self.conv_dw = create_conv2d(
            kit, mid_chs, mid_chs, dw_kernel_size, stride=stride, dilation=dilation, groups=mid_chs
        )
        self.bn2 = kit.BatchNorm2d(mid_chs)
        self.act2 = act_layer(inplace=True)
        # Squeeze-and-excitation
        self.se = se_layer(kit, mid_chs, act_layer=act_layer) if se_layer else nn.Identity()
        # Point-wise linear projection
        self.conv_pwl = create_conv2d(kit, mid_chs, out_chs, pw_kernel_size)
        self.bn3 = kit.BatchNorm2d(out_chs)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv_pw(x)))
        x = self.act2(self.bn2(self.conv_dw(x)))
        x = self.se(x)
        x = self.bn3(self.conv_pwl(x))
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


# --- timm/models/_efficientnet_builder.py -------------------------------------------------------
class EfficientNetBuilder:
    """Builds the stages from decoded block args (dicts with 'block_type', 'out_chs',
    'stride', 'se_ratio', kernel and expansion)."""

    def __init__(
        self,
        kit: Kit,
        round_chs_fn: Callable[[int], int] = round_channels,
        se_from_exp: bool = False,
        act_layer: Callable[..., nn.Module] | None = None,
        se_layer: Callable[..., nn.Module] | None = None,
        drop_path_rate: float = 0.0,
    ) -> None:
        self.kit = kit
        self.round_chs_fn = round_chs_fn
        self.se_from_exp = se_from_exp  # calculate se channel reduction from expanded (mid) chs
        self.act_layer = act_layer
        self.se_layer = se_layer
        self.drop_path_rate = drop_path_rate
        self.in_chs = 0

    def _make_block(self, ba: dict[str, Any], block_idx: int, block_count: int) -> nn.Module:
        drop_path_rate = self.drop_path_rate * block_idx / block_count
        bt = ba.pop("block_type")
        ba["in_chs"] = self.in_chs
        ba["out_chs"] = self.round_chs_fn(ba["out_chs"])
        ba["act_layer"] = self.act_layer
        ba["drop_path_rate"] = drop_path_rate
        se_ratio = ba.pop("se_ratio")
        if se_ratio and self.se_layer is not None:
            if not self.se_from_exp:
                # adjust se_ratio by expansion ratio if calculating se channels from block input
                se_ratio /= ba.get("exp_ratio", 1.0)
            ba["se_layer"] = partial(self.se_layer, rd_ratio=se_ratio)
        if bt == "ir":
            block: nn.Module = InvertedResidual(self.kit, **ba)
        elif bt == "ds":
            block = DepthwiseSeparableConv(self.kit, **ba)
        else:
            raise AssertionError(f"Unknown block type ({bt}) while building model.")
        self.in_chs = ba["out_chs"]  # update in_chs for arg of next block
        return block

    def __call__(
        self, in_chs: int, model_block_args: list[list[dict[str, Any]]]
    ) -> list[nn.Module]:
        self.in_chs = in_chs
        total_block_count = sum([len(x) for x in model_block_args])
        total_block_idx = 0
        stages = []
        for stack_args in model_block_args:
            blocks = []
            for block_idx, block_args in enumerate(stack_args):
                if block_idx >= 1:  # only the first block in any stack can have a stride > 1
                    block_args["stride"] = 1
                blocks.append(self._make_block(block_args, total_block_idx, total_block_count))
                total_block_idx += 1  # incr global block idx (across all stacks)
            stages.append(nn.Sequential(*blocks))
        return stages


def _init_weight_goog(m: nn.Module, n: str = "", fix_group_fanout: bool = True) -> None:
    """Weight initialization as per Tensorflow official implementations."""
    if isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
        if fix_group_fanout:
            fan_out //= m.groups
        nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Linear):
        fan_out = m.weight.size(0)  # fan-out
        fan_in = 0
        if "routing_fn" in n:
            fan_in = m.weight.size(1)
        init_range = 1.0 / math.sqrt(fan_in + fan_out)
        nn.init.uniform_(m.weight, -init_range, init_range)
        nn.init.zeros_(m.bias)


def efficientnet_init_weights(
    model: nn.Module, init_fn: Callable[[nn.Module, str], None] | None = None
) -> None:
    init_fn = init_fn or _init_weight_goog
    for n, m in model.named_modules():
        init_fn(m, n)


# --- timm/models/efficientnet.py ----------------------------------------------------------------
def _arch(
    block_type: str, k: int, s: int, e: float, c: int, se: float, r: int = 1
) -> list[dict[str, Any]]:
    """What ``decode_arch_def`` makes of one string, e.g. 'ir_r1_k3_s2_e6_c24_se0.25'."""
    if block_type == "ds":
        ba = dict(dw_kernel_size=k, stride=s, out_chs=c, se_ratio=se, pw_kernel_size=1)
    else:
        ba = dict(
            dw_kernel_size=k,
            exp_kernel_size=1,
            pw_kernel_size=1,
            out_chs=c,
            exp_ratio=e,
            se_ratio=se,
            stride=s,
        )
    return [dict(block_type=block_type, **ba) for _ in range(r)]


class EfficientNet(nn.Module):
    """EfficientNet: conv_stem/bn1/act1, builder-made blocks, conv_head/bn2/act2, pooled
    classifier; ``efficientnet_init_weights(self)`` at the end of ``__init__``."""

    def __init__(
        self,
        kit: Kit,
        block_args: list[list[dict[str, Any]]],
        num_classes: int = 10,
        num_features: int = 64,
        in_chans: int = 3,
        stem_size: int = 16,
        fix_stem: bool = False,
        act_layer: Callable[..., nn.Module] | None = None,
        se_layer: Callable[..., nn.Module] | None = None,
        round_chs_fn: Callable[[int], int] = round_channels,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        act_layer = act_layer or nn.ReLU
        se_layer = se_layer or SqueezeExcite
        self.num_classes = num_classes
        self.drop_rate = drop_rate

        # Stem
        if not fix_stem:
            stem_size = round_chs_fn(stem_size)
        self.conv_stem = create_conv2d(kit, in_chans, stem_size, 3, stride=2)
        self.bn1 = kit.BatchNorm2d(stem_size)
        self.act1 = act_layer(inplace=True)

        # stochastic depth decay rule, as ViT / ConvNeXt / Swin write it
        depth = sum(len(stack) for stack in block_args)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]

        # Middle stages (IR/DS Blocks)
        builder = EfficientNetBuilder(
            kit,
            round_chs_fn=round_chs_fn,
            act_layer=act_layer,
            se_layer=se_layer,
            drop_path_rate=dpr[-1],
        )
        self.blocks = nn.Sequential(*builder(stem_size, block_args))
        head_chs = builder.in_chs

        # Head + Pooling
        self.num_features = num_features
        self.conv_head = create_conv2d(kit, head_chs, self.num_features, 1)
        self.bn2 = kit.BatchNorm2d(self.num_features)
        self.act2 = act_layer(inplace=True)
        self.global_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self.classifier = kit.Linear(self.num_features, self.num_classes)

        efficientnet_init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.conv_stem(x)))
        x = self.blocks(x)
        return self.act2(self.bn2(self.conv_head(x)))

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.global_pool(x)
        if self.drop_rate > 0.0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return self.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _gen_efficientnet(kit: Kit, drop_path_rate: float = 0.2) -> EfficientNet:
    """efficientnet_b0's recipe (swish, SE 0.25 of the block input, ds then ir stages),
    three one-block stages."""
    arch_def = [
        _arch("ds", k=3, s=1, e=1, c=16, se=0.25),  # 'ds_r1_k3_s1_e1_c16_se0.25'
        _arch("ir", k=3, s=2, e=6, c=24, se=0.25),  # 'ir_r1_k3_s2_e6_c24_se0.25'
        _arch("ir", k=5, s=1, e=6, c=24, se=0.25),  # 'ir_r1_k5_s1_e6_c24_se0.25'
    ]
    return EfficientNet(
        kit,
        arch_def,
        num_classes=10,
        num_features=round_channels(64),
        stem_size=16,
        act_layer=nn.SiLU,
        drop_rate=0.2,
        drop_path_rate=drop_path_rate,
    )


def make(kit: Kit) -> nn.Module:
    return _gen_efficientnet(kit)


def inputs() -> tuple[Any, ...]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
