"""Transformer layers: ``d_model`` read from the (source's) last dimension.

LazyTransformerEncoderLayer / LazyTransformerDecoderLayer(nhead, ...)  d_model = last dim
LazyTransformer(nhead=8, ...)                                 d_model = the source's last dim
"""

from __future__ import annotations

from torch import nn

from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyTransformer", "LazyTransformerDecoderLayer", "LazyTransformerEncoderLayer"]

LazyTransformerEncoderLayer = lazy(nn.TransformerEncoderLayer, d_model=Infer(probe="nhead"))
LazyTransformerEncoderLayer.__doc__ = """``nn.TransformerEncoderLayer(d_model, nhead, ...)`` with
``d_model`` read from the input's last dimension, ``(S, N, E)`` (``(N, S, E)`` with ``batch_first``)
or ``(S, E)``. Other arguments as ``nn.TransformerEncoderLayer``'s.

>>> import torch, lazynn
>>> layer = lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16, batch_first=True)
>>> layer(torch.randn(3, 5, 8)).shape, layer.linear1.in_features
(torch.Size([3, 5, 8]), 8)
"""
LazyTransformerDecoderLayer = lazy(nn.TransformerDecoderLayer, d_model=Infer(probe="nhead"))
LazyTransformerDecoderLayer.__doc__ = """``nn.TransformerDecoderLayer(d_model, nhead, ...)`` with
``d_model`` read from the target's last dimension (the first input). Other arguments as
``nn.TransformerDecoderLayer``'s.

>>> import torch, lazynn
>>> layer = lazynn.LazyTransformerDecoderLayer(2, dim_feedforward=16, batch_first=True)
>>> layer(torch.randn(3, 5, 8), torch.randn(3, 4, 8)).shape, layer.linear1.in_features
(torch.Size([3, 5, 8]), 8)
"""
LazyTransformer = lazy(nn.Transformer, d_model=Infer(probe="nhead"))
LazyTransformer.__doc__ = """``nn.Transformer(d_model, nhead=8, ...)`` with ``d_model`` read from
the source's last dimension (the first input). Other arguments as ``nn.Transformer``'s.

>>> import torch, lazynn
>>> model = lazynn.LazyTransformer(
...     nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16, batch_first=True
... )
>>> model(torch.randn(3, 6, 8), torch.randn(3, 5, 8)).shape, model.d_model
(torch.Size([3, 5, 8]), 8)
"""
