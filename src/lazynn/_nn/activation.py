"""Activations with trainable per-channel parameters.

LazyPReLU(init=0.25, ...)   num_parameters = C of (N, C, *): one slope per channel
"""

from __future__ import annotations

from torch import nn

from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyPReLU"]

LazyPReLU = lazy(nn.PReLU, num_parameters=Infer(dim=1))
LazyPReLU.__doc__ = """``nn.PReLU`` with ``num_parameters`` read from the first input: one slope per
channel, ``C`` of ``(N, C, *)`` (dimension 1). Other arguments as ``nn.PReLU``'s.

>>> import torch, lazynn
>>> act = lazynn.LazyPReLU()
>>> act(torch.randn(2, 5, 3)).shape, act.num_parameters
(torch.Size([2, 5, 3]), 5)
"""
