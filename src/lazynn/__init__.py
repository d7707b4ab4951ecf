"""lazynn: shape-inferring ("lazy") layers for PyTorch that become plain torch.nn.

A lazy layer is constructed without the sizes its input decides (``LazyLinear(10)`` has no
``in_features``); its first call, a loaded checkpoint or ``lazynn.build`` makes it exactly
the torch.nn layer it stands for, with the numbers that layer draws under the same seed.

>>> import torch, lazynn
>>> model = torch.nn.Sequential(lazynn.LazyConv2d(8, 3), torch.nn.Flatten(), lazynn.LazyLinear(10))
>>> model(torch.randn(2, 3, 16, 16)).shape
torch.Size([2, 10])
>>> type(model[2]).__name__, model[2].in_features
('Linear', 1568)

What is here, by what it is for:

- **Building**: ``lazynn.build`` (a model, or its factory, built for example inputs, on any
  device, meta included), ``lazynn.materialize`` (a model built on meta, allocated),
  ``lazynn.Spec`` (an example input by shape and dtype), ``lazynn.on_build`` (work that waits
  for the build; ``lazynn.OnBuildHandle``), ``lazynn.is_lazy``.
- **The summary**: ``lazynn.summary`` (layers, shapes, parameters, FLOPs and a training
  step's memory, computed on meta), ``lazynn.Summary`` and ``lazynn.SummaryRow`` (its data).
- **Layers**: the lazy layers of torch.nn (``lazynn.LazyLinear``, ``lazynn.LazyConv2d``...)
  and of the layers torch has no lazy version of (``lazynn.LazyLayerNorm``,
  ``lazynn.LazyMultiheadAttention``, ``lazynn.LazyGRU``...); rank-agnostic ones, whose 1d, 2d
  or 3d class the first input's rank chooses (``lazynn.Conv``, ``lazynn.BatchNorm``,
  ``lazynn.MaxPool``...).
- **Your own layers**: ``lazynn.lazy`` (any module class made lazy in one line, each size
  read where a ``lazynn.Infer`` says), ``lazynn.LazyModuleMixin`` (a lazy layer written by
  hand, with ``lazynn.UninitializedParameter`` and ``lazynn.UninitializedBuffer``),
  ``lazynn.UNKNOWN`` (a size before the build).
- **Errors**: ``lazynn.LazynnError`` and its family (``lazynn.InferenceError``,
  ``lazynn.UnbuiltError``, ``lazynn.CheckpointError``, ``lazynn.NeedsValuesError``), and
  ``lazynn.AmbiguousInputWarning``.

The guides are the README and docs/ of the repository: porting a model, when to build,
custom layers, the summary and the design.
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

from ._build.build import build as build
from ._build.materialize import materialize as materialize
from ._build.on_build import OnBuildHandle as OnBuildHandle
from ._build.on_build import on_build as on_build
from ._errors import AmbiguousInputWarning as AmbiguousInputWarning
from ._errors import ArgumentError as ArgumentError
from ._errors import CheckpointError as CheckpointError
from ._errors import InferenceError as InferenceError
from ._errors import LazynnError as LazynnError
from ._errors import NeedsValuesError as NeedsValuesError
from ._errors import UnbuiltError as UnbuiltError
from ._layer.infer import UNKNOWN as UNKNOWN
from ._layer.infer import Infer as Infer
from ._layer.lazy import lazy as lazy
from ._module.mixin import LazyModuleMixin as LazyModuleMixin
from ._module.placeholder import UninitializedBuffer as UninitializedBuffer
from ._module.placeholder import UninitializedParameter as UninitializedParameter
from ._module.placeholder import is_lazy as is_lazy
from ._nn.activation import LazyPReLU as LazyPReLU
from ._nn.agnostic import AdaptiveAvgPool as AdaptiveAvgPool
from ._nn.agnostic import AdaptiveMaxPool as AdaptiveMaxPool
from ._nn.agnostic import AvgPool as AvgPool
from ._nn.agnostic import BatchNorm as BatchNorm
from ._nn.agnostic import ChannelDropout as ChannelDropout
from ._nn.agnostic import Conv as Conv
from ._nn.agnostic import ConvTranspose as ConvTranspose
from ._nn.agnostic import InstanceNorm as InstanceNorm
from ._nn.agnostic import MaxPool as MaxPool
from ._nn.attention import LazyMultiheadAttention as LazyMultiheadAttention
from ._nn.conv import LazyConv1d as LazyConv1d
from ._nn.conv import LazyConv2d as LazyConv2d
from ._nn.conv import LazyConv3d as LazyConv3d
from ._nn.conv import LazyConvTranspose1d as LazyConvTranspose1d
from ._nn.conv import LazyConvTranspose2d as LazyConvTranspose2d
from ._nn.conv import LazyConvTranspose3d as LazyConvTranspose3d
from ._nn.linear import LazyBilinear as LazyBilinear
from ._nn.linear import LazyLinear as LazyLinear
from ._nn.loss import LazyAdaptiveLogSoftmaxWithLoss as LazyAdaptiveLogSoftmaxWithLoss
from ._nn.loss import LazyLinearCrossEntropyLoss as LazyLinearCrossEntropyLoss
from ._nn.norm import LazyBatchNorm1d as LazyBatchNorm1d
from ._nn.norm import LazyBatchNorm2d as LazyBatchNorm2d
from ._nn.norm import LazyBatchNorm3d as LazyBatchNorm3d
from ._nn.norm import LazyGroupNorm as LazyGroupNorm
from ._nn.norm import LazyInstanceNorm1d as LazyInstanceNorm1d
from ._nn.norm import LazyInstanceNorm2d as LazyInstanceNorm2d
from ._nn.norm import LazyInstanceNorm3d as LazyInstanceNorm3d
from ._nn.norm import LazyLayerNorm as LazyLayerNorm
from ._nn.norm import LazyRMSNorm as LazyRMSNorm
from ._nn.norm import LazySyncBatchNorm as LazySyncBatchNorm
from ._nn.recurrent import LazyGRU as LazyGRU
from ._nn.recurrent import LazyGRUCell as LazyGRUCell
from ._nn.recurrent import LazyLSTM as LazyLSTM
from ._nn.recurrent import LazyLSTMCell as LazyLSTMCell
from ._nn.recurrent import LazyRNN as LazyRNN
from ._nn.recurrent import LazyRNNCell as LazyRNNCell
from ._nn.transformer import LazyTransformer as LazyTransformer
from ._nn.transformer import LazyTransformerDecoderLayer as LazyTransformerDecoderLayer
from ._nn.transformer import LazyTransformerEncoderLayer as LazyTransformerEncoderLayer
from ._rehearsal.spec import Spec as Spec
from ._summary.report import SummaryRow as SummaryRow
from ._summary.summary import Summary as Summary
from ._summary.summary import summary as summary

try:
    __version__ = _version("lazynn")
except _NotInstalled:  # a source tree on sys.path, not installed: no metadata to read
    __version__ = "0+unknown"
"""The installed distribution's version (``"0+unknown"`` for a source tree that is not
installed).

>>> import importlib.metadata, lazynn
>>> lazynn.__version__ == importlib.metadata.version("lazynn")
True
"""

__all__ = [
    "UNKNOWN",
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "AmbiguousInputWarning",
    "ArgumentError",
    "AvgPool",
    "BatchNorm",
    "ChannelDropout",
    "CheckpointError",
    "Conv",
    "ConvTranspose",
    "Infer",
    "InferenceError",
    "InstanceNorm",
    "LazyAdaptiveLogSoftmaxWithLoss",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyBilinear",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
    "LazyGRU",
    "LazyGRUCell",
    "LazyGroupNorm",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLSTM",
    "LazyLSTMCell",
    "LazyLayerNorm",
    "LazyLinear",
    "LazyLinearCrossEntropyLoss",
    "LazyModuleMixin",
    "LazyMultiheadAttention",
    "LazyPReLU",
    "LazyRMSNorm",
    "LazyRNN",
    "LazyRNNCell",
    "LazySyncBatchNorm",
    "LazyTransformer",
    "LazyTransformerDecoderLayer",
    "LazyTransformerEncoderLayer",
    "LazynnError",
    "MaxPool",
    "NeedsValuesError",
    "OnBuildHandle",
    "Spec",
    "Summary",
    "SummaryRow",
    "UnbuiltError",
    "UninitializedBuffer",
    "UninitializedParameter",
    "__version__",
    "build",
    "is_lazy",
    "lazy",
    "materialize",
    "on_build",
    "summary",
]
