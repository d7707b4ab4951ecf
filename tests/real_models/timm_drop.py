"""timm's stochastic depth (``timm/layers/drop.py``), as the timm-derived real models use it.

``DropPath`` draws one Bernoulli keep-mask per sample in training (``x.new_empty(...)
.bernoulli_``): the draw a first call in training mode makes, so it is part of the stream the
real-model tests compare with eager.
"""

from __future__ import annotations

import torch
from torch import nn


def drop_path(
    x: torch.Tensor, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True
) -> torch.Tensor:
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    """Drop paths (Stochastic Depth) per sample (timm/layers/drop.py)."""

    def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True) -> None:
        super().__init__()
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)
