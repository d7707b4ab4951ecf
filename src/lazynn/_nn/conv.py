"""Lazy convolutions: ``in_channels`` read from the input's channel dimension.

A batched input ``(N, C, *spatial)`` gives ``C`` at dimension 1; an unbatched one
``(C, *spatial)`` (as torch's convolutions accept) gives it at dimension 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from .._layer.base import LazyLayer
from .._layer.infer import Infer

__all__ = [
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
]

_Size = int | tuple[int, ...]
_SPATIAL = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _channels(rank: int) -> Infer:
    spatial = ", ".join(_SPATIAL[rank])
    return Infer(layouts=(f"(C, {spatial})", f"(N, C, {spatial})"), probe="groups")


class _LazyConvNd(LazyLayer):
    def __init__(
        self,
        out_channels: int,
        kernel_size: _Size,
        stride: _Size = 1,
        padding: str | _Size = 0,
        dilation: _Size = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(
            out_channels=out_channels,
            kernel_size=kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
            padding_mode=padding_mode,
            device=device,
            dtype=dtype,
        )


class _LazyConvTransposeNd(LazyLayer):
    def __init__(
        self,
        out_channels: int,
        kernel_size: _Size,
        stride: _Size = 1,
        padding: _Size = 0,
        output_padding: _Size = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: _Size = 1,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(
            out_channels=out_channels,
            kernel_size=kernel_size,
            stride=stride,
            padding=padding,
            output_padding=output_padding,
            groups=groups,
            bias=bias,
            dilation=dilation,
            padding_mode=padding_mode,
            device=device,
            dtype=dtype,
        )


_DOC = """``nn.{eager}`` with ``in_channels`` inferred from the input's channel dimension.

    Input: ``(N, C, {spatial})`` or unbatched ``(C, {spatial})``; ``in_channels = C``.
    Arguments are ``nn.{eager}``'s without ``in_channels``; after the first call the module
    is exactly an ``nn.{eager}``, with the weights ``nn.{eager}(C, ...)`` gets under the
    same seed.

    >>> import torch, lazynn
    >>> layer = lazynn.Lazy{eager}(8, 3)
    >>> out = layer(torch.ones({example}))
    >>> type(layer).__name__, layer.in_channels
    ('{eager}', 2)
    """


def _doc(eager: type[Any], rank: int) -> str:
    example = ", ".join(["1", "2"] + ["5"] * rank)
    return _DOC.format(eager=eager.__name__, spatial=", ".join(_SPATIAL[rank]), example=example)


class LazyConv1d(_LazyConvNd, nn.Conv1d):
    __doc__ = _doc(nn.Conv1d, 1)
    cls_to_become = nn.Conv1d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(1)}


class LazyConv2d(_LazyConvNd, nn.Conv2d):
    __doc__ = _doc(nn.Conv2d, 2)
    cls_to_become = nn.Conv2d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(2)}


class LazyConv3d(_LazyConvNd, nn.Conv3d):
    __doc__ = _doc(nn.Conv3d, 3)
    cls_to_become = nn.Conv3d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(3)}


class LazyConvTranspose1d(_LazyConvTransposeNd, nn.ConvTranspose1d):
    __doc__ = _doc(nn.ConvTranspose1d, 1)
    cls_to_become = nn.ConvTranspose1d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(1)}


class LazyConvTranspose2d(_LazyConvTransposeNd, nn.ConvTranspose2d):
    __doc__ = _doc(nn.ConvTranspose2d, 2)
    cls_to_become = nn.ConvTranspose2d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(2)}


class LazyConvTranspose3d(_LazyConvTransposeNd, nn.ConvTranspose3d):
    __doc__ = _doc(nn.ConvTranspose3d, 3)
    cls_to_become = nn.ConvTranspose3d
    inferred: ClassVar[Mapping[str, Infer]] = {"in_channels": _channels(3)}
