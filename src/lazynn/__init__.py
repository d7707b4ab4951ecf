"""lazynn: shape-inferring ("lazy") layers for PyTorch that become plain torch.nn.

>>> import torch, lazynn
>>> model = torch.nn.Sequential(lazynn.LazyConv2d(8, 3), torch.nn.Flatten(), lazynn.LazyLinear(10))
>>> model(torch.randn(2, 3, 16, 16)).shape
torch.Size([2, 10])
>>> type(model[2]).__name__, model[2].in_features
('Linear', 1568)
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

from ._build import build as build
from ._errors import AmbiguousInputWarning as AmbiguousInputWarning
from ._errors import CheckpointError as CheckpointError
from ._errors import InferenceError as InferenceError
from ._errors import LazynnError as LazynnError
from ._errors import NeedsValuesError as NeedsValuesError
from ._errors import UnbuiltError as UnbuiltError
from ._infer import UNKNOWN as UNKNOWN
from ._infer import Infer as Infer
from ._layers.activation import LazyPReLU as LazyPReLU
from ._layers.agnostic import AdaptiveAvgPool as AdaptiveAvgPool
from ._layers.agnostic import AdaptiveMaxPool as AdaptiveMaxPool
from ._layers.agnostic import AvgPool as AvgPool
from ._layers.agnostic import BatchNorm as BatchNorm
from ._layers.agnostic import ChannelDropout as ChannelDropout
from ._layers.agnostic import Conv as Conv
from ._layers.agnostic import ConvTranspose as ConvTranspose
from ._layers.agnostic import InstanceNorm as InstanceNorm
from ._layers.agnostic import MaxPool as MaxPool
from ._layers.attention import LazyMultiheadAttention as LazyMultiheadAttention
from ._layers.conv import LazyConv1d as LazyConv1d
from ._layers.conv import LazyConv2d as LazyConv2d
from ._layers.conv import LazyConv3d as LazyConv3d
from ._layers.conv import LazyConvTranspose1d as LazyConvTranspose1d
from ._layers.conv import LazyConvTranspose2d as LazyConvTranspose2d
from ._layers.conv import LazyConvTranspose3d as LazyConvTranspose3d
from ._layers.linear import LazyBilinear as LazyBilinear
from ._layers.linear import LazyLinear as LazyLinear
from ._layers.loss import LazyAdaptiveLogSoftmaxWithLoss as LazyAdaptiveLogSoftmaxWithLoss
from ._layers.loss import LazyLinearCrossEntropyLoss as LazyLinearCrossEntropyLoss
from ._layers.norm import LazyBatchNorm1d as LazyBatchNorm1d
from ._layers.norm import LazyBatchNorm2d as LazyBatchNorm2d
from ._layers.norm import LazyBatchNorm3d as LazyBatchNorm3d
from ._layers.norm import LazyGroupNorm as LazyGroupNorm
from ._layers.norm import LazyInstanceNorm1d as LazyInstanceNorm1d
from ._layers.norm import LazyInstanceNorm2d as LazyInstanceNorm2d
from ._layers.norm import LazyInstanceNorm3d as LazyInstanceNorm3d
from ._layers.norm import LazyLayerNorm as LazyLayerNorm
from ._layers.norm import LazyRMSNorm as LazyRMSNorm
from ._layers.norm import LazySyncBatchNorm as LazySyncBatchNorm
from ._layers.recurrent import LazyGRU as LazyGRU
from ._layers.recurrent import LazyGRUCell as LazyGRUCell
from ._layers.recurrent import LazyLSTM as LazyLSTM
from ._layers.recurrent import LazyLSTMCell as LazyLSTMCell
from ._layers.recurrent import LazyRNN as LazyRNN
from ._layers.recurrent import LazyRNNCell as LazyRNNCell
from ._layers.transformer import LazyTransformer as LazyTransformer
from ._layers.transformer import LazyTransformerDecoderLayer as LazyTransformerDecoderLayer
from ._layers.transformer import LazyTransformerEncoderLayer as LazyTransformerEncoderLayer
from ._lazy import lazy as lazy
from ._materialize import materialize as materialize
from ._mixin import LazyModuleMixin as LazyModuleMixin
from ._on_build import OnBuildHandle as OnBuildHandle
from ._on_build import on_build as on_build
from ._placeholder import UninitializedBuffer as UninitializedBuffer
from ._placeholder import UninitializedParameter as UninitializedParameter
from ._placeholder import is_lazy as is_lazy
from ._report import Summary as Summary
from ._report import SummaryRow as SummaryRow
from ._spec import Spec as Spec
from ._summary import summary as summary

try:
    __version__ = _version("lazynn")
except _NotInstalled:  # a source tree on sys.path, not installed: no metadata to read
    __version__ = "0+unknown"

__all__ = [
    "UNKNOWN",
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "AmbiguousInputWarning",
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
