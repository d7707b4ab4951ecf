"""Activations with learned per-channel parameters.

    LazyPReLU(init=0.25, ...)   num_parameters = C of (N, C, *): one slope per channel

>>> import torch, lazynn
>>> act = lazynn.LazyPReLU()
>>> act(torch.randn(2, 5, 3)).shape, act.num_parameters
(torch.Size([2, 5, 3]), 5)
"""

from __future__ import annotations

from torch import nn

from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyPReLU"]

LazyPReLU = lazy(nn.PReLU, num_parameters=Infer(dim=1))
