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
LazyLinearCrossEntropyLoss = lazy(nn.LinearCrossEntropyLoss, in_features=_LAST)
