"""A diffusion U-Net, written from openai/improved-diffusion ``improved_diffusion/unet.py`` and
``nn.py``: ``UNetModel`` with ``TimestepEmbedSequential``, ``ResBlock``, ``AttentionBlock``,
``Downsample``, ``Upsample``, ``GroupNorm32`` (a ``GroupNorm`` subclass, made lazy with
``lazynn.lazy``) and ``zero_module`` (``p.detach().zero_()`` on each parameter). The output
blocks take ``th.cat([h, hs.pop()], dim=1)``: their input channels are what a lazy layer
infers. Dropped: ``use_checkpoint``, fp16 conversion, the 3-D case.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import torch
import torch as th
from torch import nn

from .kit import Kit


# --- improved-diffusion ``nn.py`` -----------------------------------------------------------------
class SiLU(nn.Module):
    """``nn.py``'s own SiLU (written for PyTorch 1.5)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * th.sigmoid(x)


class GroupNorm32(nn.GroupNorm):
    """``nn.py``: a GroupNorm computed in float32 and cast back to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).type(x.dtype)


def conv_nd(kit: Kit, dims: int, *args: Any, **kwargs: Any) -> nn.Module:
    """Create a 1D or 2D convolution module (the kit's)."""
    if dims == 1:
        return kit.Conv1d(*args, **kwargs)
    elif dims == 2:
        return kit.Conv2d(*args, **kwargs)
    raise ValueError(f"unsupported dimensions: {dims}")


def linear(kit: Kit, *args: Any, **kwargs: Any) -> nn.Module:
    """Create a linear module (the kit's)."""
    return kit.Linear(*args, **kwargs)


def avg_pool_nd(dims: int, *args: Any, **kwargs: Any) -> nn.Module:
    """Create a 1D or 2D average pooling module."""
    if dims == 1:
        return nn.AvgPool1d(*args, **kwargs)
    elif dims == 2:
        return nn.AvgPool2d(*args, **kwargs)
    raise ValueError(f"unsupported dimensions: {dims}")


def zero_module(module: nn.Module) -> nn.Module:
    """Zero out the parameters of a module and return it."""
    for p in module.parameters():
        p.detach().zero_()
    return module


def normalization(kit: Kit, channels: int) -> nn.Module:
    """Make a standard normalization layer."""
    return kit.GroupNorm(32, channels, cls=GroupNorm32)


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
    """Create sinusoidal timestep embeddings: [N] (maybe fractional) -> [N x dim]."""
    half = dim // 2
    freqs = th.exp(
        -math.log(max_period) * th.arange(start=0, end=half, dtype=th.float32) / half
    ).to(device=timesteps.device)
    args = timesteps[:, None].float() * freqs[None]
    embedding = th.cat([th.cos(args), th.sin(args)], dim=-1)
    if dim % 2:
        embedding = th.cat([embedding, th.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


# --- improved-diffusion ``unet.py`` ---------------------------------------------------------------
class TimestepBlock(nn.Module):
    """Any module where forward() takes timestep embeddings as a second argument."""

    @abstractmethod
    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Apply the module to `x` given `emb` timestep embeddings."""


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    """A sequential module that passes timestep embeddings to the children that support it."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for layer in self:
            if isinstance(layer, TimestepBlock):
                x = layer(x, emb)
            else:
                x = layer(x)
        return x


class Upsample(nn.Module):
    """An upsampling layer with an optional convolution."""

    def __init__(self, kit: Kit, channels: int, use_conv: bool, dims: int = 2) -> None:
        super().__init__()
        self.channels = channels
        self.use_conv = use_conv
        self.dims = dims
        if use_conv:
            self.conv = conv_nd(kit, dims, channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == self.channels
        x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        if self.use_conv:
            x = self.conv(x)
        return x


class Downsample(nn.Module):
    """A downsampling layer with an optional convolution."""

    def __init__(self, kit: Kit, channels: int, use_conv: bool, dims: int = 2) -> None:
        super().__init__()
        self.channels = channels
        self.use_conv = use_conv
        self.dims = dims
        stride = 2
        if use_conv:
            self.op = conv_nd(kit, dims, channels, channels, 3, stride=stride, padding=1)
        else:
            self.op = avg_pool_nd(stride)  # (as published; unused: conv_resample=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == self.channels
        return self.op(x)


class ResBlock(TimestepBlock):
    """A residual block, conditioned on the timestep embedding, that can change channels."""

    def __init__(
        self,
        kit: Kit,
        channels: int,
        emb_channels: int,
        dropout: float,
        out_channels: int | None = None,
        use_conv: bool = False,
        use_scale_shift_norm: bool = False,
        dims: int = 2,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.emb_channels = emb_channels
        self.dropout = dropout
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.use_scale_shift_norm = use_scale_shift_norm

        self.in_layers = nn.Sequential(
            normalization(kit, channels),
            SiLU(),
            conv_nd(kit, dims, channels, self.out_channels, 3, padding=1),
        )
        self.emb_layers = nn.Sequential(
            SiLU(),
            linear(
                kit,
                emb_channels,
                2 * self.out_channels if use_scale_shift_norm else self.out_channels,
            ),
        )
        self.out_layers = nn.Sequential(
            normalization(kit, self.out_channels),
            SiLU(),
            nn.Dropout(p=dropout),
            zero_module(conv_nd(kit, dims, self.out_channels, self.out_channels, 3, padding=1)),
        )

        if self.out_channels == channels:
            self.skip_connection: nn.Module = nn.Identity()
        elif use_conv:
            self.skip_connection = conv_nd(kit, dims, channels, self.out_channels, 3, padding=1)
        else:
            self.skip_connection = conv_nd(kit, dims, channels, self.out_channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        emb_out = self.emb_layers(emb).type(h.dtype)
        while len(emb_out.shape) < len(h.shape):
            emb_out = emb_out[..., None]
        if self.use_scale_shift_norm:
            out_norm, out_rest = self.out_layers[0], self.out_layers[1:]
            scale, shift = th.chunk(emb_out, 2, dim=1)
            h = out_norm(h) * (1 + scale) + shift
            h = out_rest(h)
        else:
            h = h + emb_out
            h = self.out_layers(h)
        return self.skip_connection(x) + h


class QKVAttention(nn.Module):
    """A module which performs QKV attention: [N x (C * 3) x T] -> [N x C x T]."""

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        ch = qkv.shape[1] // 3
        q, k, v = th.split(qkv, ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = th.einsum("bct,bcs->bts", q * scale, k * scale)
        weight = th.softmax(weight.float(), dim=-1).type(weight.dtype)
        return th.einsum("bts,bcs->bct", weight, v)


class AttentionBlock(nn.Module):
    """An attention block that allows spatial positions to attend to each other."""

    def __init__(self, kit: Kit, channels: int, num_heads: int = 1) -> None:
        super().__init__()
        self.channels = channels
        self.num_heads = num_heads

        self.norm = normalization(kit, channels)
        self.qkv = conv_nd(kit, 1, channels, channels * 3, 1)
        self.attention = QKVAttention()
        self.proj_out = zero_module(conv_nd(kit, 1, channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        qkv = qkv.reshape(b * self.num_heads, -1, qkv.shape[2])
        h = self.attention(qkv)
        h = h.reshape(b, -1, h.shape[-1])
        h = self.proj_out(h)
        return (x + h).reshape(b, c, *spatial)


class UNetModel(nn.Module):
    """The full UNet with attention and timestep embedding, from openai/improved-diffusion
    ``improved_diffusion/unet.py`` (its helpers from ``improved_diffusion/nn.py``), without the
    gradient-checkpoint and fp16 machinery.

    Init code as published: every layer keeps torch's default initialization, except the
    last convolution of each ResBlock, each AttentionBlock's ``proj_out`` and the output
    convolution, whose parameters ``zero_module`` zeroes in ``__init__``
    (``p.detach().zero_()``, on a layer whose input size the input tells). ``GroupNorm32``
    (a GroupNorm subclass) is made lazy through ``kit.GroupNorm(..., cls=GroupNorm32)``; the
    output blocks' input channels (``th.cat([h, hs.pop()], dim=1)``) are inferred.
    """

    def __init__(
        self,
        kit: Kit,
        in_channels: int = 3,
        model_channels: int = 32,
        out_channels: int = 3,
        num_res_blocks: int = 1,
        attention_resolutions: tuple[int, ...] = (2,),
        dropout: float = 0,
        channel_mult: tuple[int, ...] = (1, 2),
        conv_resample: bool = True,
        dims: int = 2,
        num_classes: int | None = None,
        num_heads: int = 2,
        num_heads_upsample: int = -1,
        use_scale_shift_norm: bool = False,
    ) -> None:
        super().__init__()

        if num_heads_upsample == -1:
            num_heads_upsample = num_heads

        self.in_channels = in_channels
        self.model_channels = model_channels
        self.out_channels = out_channels
        self.num_res_blocks = num_res_blocks
        self.attention_resolutions = attention_resolutions
        self.dropout = dropout
        self.channel_mult = channel_mult
        self.conv_resample = conv_resample
        self.num_classes = num_classes
        self.num_heads = num_heads
        self.num_heads_upsample = num_heads_upsample

        time_embed_dim = model_channels * 4
        self.time_embed = nn.Sequential(
            linear(kit, model_channels, time_embed_dim),
            SiLU(),
            linear(kit, time_embed_dim, time_embed_dim),
        )

        if self.num_classes is not None:
            self.label_emb = nn.Embedding(num_classes, time_embed_dim)

        self.input_blocks = nn.ModuleList(
            [TimestepEmbedSequential(conv_nd(kit, dims, in_channels, model_channels, 3, padding=1))]
        )
        input_block_chans = [model_channels]
        ch = model_channels
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: list[nn.Module] = [
                    ResBlock(
                        kit,
                        ch,
                        time_embed_dim,
                        dropout,
                        out_channels=mult * model_channels,
                        dims=dims,
                        use_scale_shift_norm=use_scale_shift_norm,
                    )
                ]
                ch = mult * model_channels
                if ds in attention_resolutions:
                    layers.append(AttentionBlock(kit, ch, num_heads=num_heads))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                input_block_chans.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(
                    TimestepEmbedSequential(Downsample(kit, ch, conv_resample, dims=dims))
                )
                input_block_chans.append(ch)
                ds *= 2

        self.middle_block = TimestepEmbedSequential(
            ResBlock(
                kit,
                ch,
                time_embed_dim,
                dropout,
                dims=dims,
                use_scale_shift_norm=use_scale_shift_norm,
            ),
            AttentionBlock(kit, ch, num_heads=num_heads),
            ResBlock(
                kit,
                ch,
                time_embed_dim,
                dropout,
                dims=dims,
                use_scale_shift_norm=use_scale_shift_norm,
            ),
        )

        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                layers = [
                    ResBlock(
                        kit,
                        ch + input_block_chans.pop(),
                        time_embed_dim,
                        dropout,
                        out_channels=model_channels * mult,
                        dims=dims,
                        use_scale_shift_norm=use_scale_shift_norm,
                    )
                ]
                ch = model_channels * mult
                if ds in attention_resolutions:
                    layers.append(AttentionBlock(kit, ch, num_heads=num_heads_upsample))
                if level and i == num_res_blocks:
                    layers.append(Upsample(kit, ch, conv_resample, dims=dims))
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))

        self.out = nn.Sequential(
            normalization(kit, ch),
            SiLU(),
            zero_module(conv_nd(kit, dims, model_channels, out_channels, 3, padding=1)),
        )

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, y: torch.Tensor | None = None
    ) -> torch.Tensor:
        assert (y is not None) == (self.num_classes is not None), (
            "must specify y if and only if the model is class-conditional"
        )

        hs = []
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels))

        if self.num_classes is not None:
            assert y is not None and y.shape == (x.shape[0],)
            emb = emb + self.label_emb(y)

        h = x  # (published: x.type(self.inner_dtype), the fp16 machinery)
        for module in self.input_blocks:
            h = module(h, emb)
            hs.append(h)
        h = self.middle_block(h, emb)
        for module in self.output_blocks:
            cat_in = th.cat([h, hs.pop()], dim=1)
            h = module(cat_in, emb)
        h = h.type(x.dtype)
        return self.out(h)


# --- the model's entry for tests/real_models/table.py ---------------------------------------------
def make(kit: Kit) -> nn.Module:
    return UNetModel(
        kit,
        in_channels=3,
        model_channels=32,
        out_channels=3,
        num_res_blocks=1,
        attention_resolutions=(2,),
        dropout=0,
        channel_mult=(1, 2),
        num_heads=2,
    )


def inputs() -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, 8, generator=g)
    timesteps = torch.randint(0, 1000, (2,), generator=g)  # int64
    return (x, timesteps)
