"""Transformer layers: ``d_model`` read from the (source's) last dimension.

    LazyTransformerEncoderLayer / LazyTransformerDecoderLayer(nhead, ...)  d_model = last dim
    LazyTransformer(nhead=8, ...)                                 d_model = the source's last dim

>>> import torch, lazynn
>>> layer = lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16, batch_first=True)
>>> layer(torch.randn(3, 5, 8)).shape, layer.linear1.in_features
(torch.Size([3, 5, 8]), 8)
"""

from __future__ import annotations

from torch import nn

from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyTransformer", "LazyTransformerDecoderLayer", "LazyTransformerEncoderLayer"]

LazyTransformerEncoderLayer = lazy(nn.TransformerEncoderLayer, d_model=Infer(probe="nhead"))
LazyTransformerDecoderLayer = lazy(nn.TransformerDecoderLayer, d_model=Infer(probe="nhead"))
LazyTransformer = lazy(nn.Transformer, d_model=Infer(probe="nhead"))
