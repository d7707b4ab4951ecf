"""Linear layers: ``in_features`` (and Bilinear's ``in2_features``) read from the inputs'
last dimensions.

    LazyLinear(out_features, ...)     in_features = H_in of (*, H_in)
    LazyBilinear(out_features, ...)   in1_features, in2_features = last dims of the two inputs
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn

from .._layer.base import LazyLayer
from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyBilinear", "LazyLinear"]


class LazyLinear(LazyLayer, nn.Linear):
    """``nn.Linear(in_features, out_features)`` with ``in_features`` inferred.

    Input: ``(*, H_in)``; ``in_features = H_in``, the last dimension. Output: ``(*, out_features)``.
    Arguments are ``nn.Linear``'s without ``in_features``. After the first call the module
    is exactly an ``nn.Linear``, with the weights ``nn.Linear(H_in, out_features)`` gets
    under the same seed.

    >>> import torch, lazynn
    >>> torch.manual_seed(0) and None
    >>> layer = lazynn.LazyLinear(4)
    >>> layer
    LazyLinear(in_features=?, out_features=4, bias=True)
    >>> layer(torch.ones(2, 3)).shape
    torch.Size([2, 4])
    >>> layer
    Linear(in_features=3, out_features=4, bias=True)
    """

    cls_to_become = nn.Linear
    inferred: ClassVar[Mapping[str, Infer]] = {"in_features": Infer(dim=-1)}

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(out_features=out_features, bias=bias, device=device, dtype=dtype)


LazyBilinear = lazy(
    nn.Bilinear, in1_features=Infer(arg=0, dim=-1), in2_features=Infer(arg=1, dim=-1)
)
LazyBilinear.__doc__ = """``nn.Bilinear(in1_features, in2_features, out_features)`` with
``in1_features`` and ``in2_features`` inferred: the last dimensions of the first and second inputs,
``(*, H_in1)`` and ``(*, H_in2)``. Output ``(*, out_features)``. Other arguments as
``nn.Bilinear``'s.

>>> import torch, lazynn
>>> bilinear = lazynn.LazyBilinear(4)
>>> bilinear(torch.randn(2, 3), torch.randn(2, 5)).shape
torch.Size([2, 4])
>>> bilinear.in1_features, bilinear.in2_features
(3, 5)
"""
