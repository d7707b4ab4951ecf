"""Loss layers that hold a projection: ``in_features`` read from the input's last dimension.

    LazyAdaptiveLogSoftmaxWithLoss(n_classes, cutoffs, ...)   in_features = last dim
    LazyLinearCrossEntropyLoss(num_classes, ...)               in_features = last dim

``AdaptiveLogSoftmaxWithLoss`` selects rows by value (``torch.nonzero``): ``lazynn.build`` and
``lazynn.summary``, which run on meta tensors, refuse it with the fix (build it by a call).
"""

from __future__ import annotations

from torch import nn

from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyAdaptiveLogSoftmaxWithLoss", "LazyLinearCrossEntropyLoss"]

_LAST = Infer(dim=-1)

LazyAdaptiveLogSoftmaxWithLoss = lazy(nn.AdaptiveLogSoftmaxWithLoss, in_features=_LAST)
LazyAdaptiveLogSoftmaxWithLoss.__doc__ = """
``nn.AdaptiveLogSoftmaxWithLoss(in_features, n_classes, cutoffs, ...)`` with ``in_features``
read from the input's last dimension, ``(N, in_features)`` or ``(in_features,)``. Other
arguments as ``nn.AdaptiveLogSoftmaxWithLoss``'s. Built by a call only (its forward selects
rows by value).

>>> import torch, lazynn
>>> asm = lazynn.LazyAdaptiveLogSoftmaxWithLoss(10, cutoffs=[4])
>>> out = asm(torch.randn(6, 8), torch.randint(0, 10, (6,)))
>>> out.output.shape, asm.in_features, type(asm).__name__
(torch.Size([6]), 8, 'AdaptiveLogSoftmaxWithLoss')
"""
LazyLinearCrossEntropyLoss = lazy(nn.LinearCrossEntropyLoss, in_features=_LAST)
LazyLinearCrossEntropyLoss.__doc__ = """``nn.LinearCrossEntropyLoss(in_features, num_classes, ...)``
with ``in_features`` read from the input's last dimension, ``(*, in_features)``. Other arguments as
``nn.LinearCrossEntropyLoss``'s.

>>> import torch, lazynn
>>> loss = lazynn.LazyLinearCrossEntropyLoss(10)
>>> loss(torch.randn(6, 8), torch.randint(0, 10, (6,))).shape, loss.linear.in_features
(torch.Size([]), 8)
"""
