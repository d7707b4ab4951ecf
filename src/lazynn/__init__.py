"""lazynn: shape-inferring ("lazy") layers for PyTorch that become plain torch.nn.

>>> import torch, lazynn
>>> model = torch.nn.Sequential(lazynn.LazyConv2d(8, 3), torch.nn.Flatten(), lazynn.LazyLinear(10))
>>> model(torch.randn(2, 3, 16, 16)).shape
torch.Size([2, 10])
>>> type(model[2]).__name__, model[2].in_features
('Linear', 1568)
"""

from ._agnostic import AdaptiveAvgPool as AdaptiveAvgPool
from ._agnostic import AdaptiveMaxPool as AdaptiveMaxPool
from ._agnostic import AvgPool as AvgPool
from ._agnostic import BatchNorm as BatchNorm
from ._agnostic import ChannelDropout as ChannelDropout
from ._agnostic import Conv as Conv
from ._agnostic import ConvTranspose as ConvTranspose
from ._agnostic import InstanceNorm as InstanceNorm
from ._agnostic import MaxPool as MaxPool
from ._build import build as build
from ._build import materialize as materialize
from ._conv import LazyConv1d as LazyConv1d
from ._conv import LazyConv2d as LazyConv2d
from ._conv import LazyConv3d as LazyConv3d
from ._conv import LazyConvTranspose1d as LazyConvTranspose1d
from ._conv import LazyConvTranspose2d as LazyConvTranspose2d
from ._conv import LazyConvTranspose3d as LazyConvTranspose3d
from ._declare import UNKNOWN as UNKNOWN
from ._declare import Infer as Infer
from ._declare import LazyLayer as LazyLayer
from ._errors import CheckpointError as CheckpointError
from ._errors import InferenceError as InferenceError
from ._errors import LazynnError as LazynnError
from ._errors import UnbuiltError as UnbuiltError
from ._factory import lazy as lazy
from ._linear import LazyLinear as LazyLinear
from ._mixin import LazyModuleMixin as LazyModuleMixin
from ._more import LazyAdaptiveLogSoftmaxWithLoss as LazyAdaptiveLogSoftmaxWithLoss
from ._more import LazyBilinear as LazyBilinear
from ._more import LazyGroupNorm as LazyGroupNorm
from ._more import LazyGRU as LazyGRU
from ._more import LazyGRUCell as LazyGRUCell
from ._more import LazyLayerNorm as LazyLayerNorm
from ._more import LazyLinearCrossEntropyLoss as LazyLinearCrossEntropyLoss
from ._more import LazyLSTM as LazyLSTM
from ._more import LazyLSTMCell as LazyLSTMCell
from ._more import LazyMultiheadAttention as LazyMultiheadAttention
from ._more import LazyPReLU as LazyPReLU
from ._more import LazyRMSNorm as LazyRMSNorm
from ._more import LazyRNN as LazyRNN
from ._more import LazyRNNCell as LazyRNNCell
from ._more import LazySyncBatchNorm as LazySyncBatchNorm
from ._more import LazyTransformer as LazyTransformer
from ._more import LazyTransformerDecoderLayer as LazyTransformerDecoderLayer
from ._more import LazyTransformerEncoderLayer as LazyTransformerEncoderLayer
from ._norm import LazyBatchNorm1d as LazyBatchNorm1d
from ._norm import LazyBatchNorm2d as LazyBatchNorm2d
from ._norm import LazyBatchNorm3d as LazyBatchNorm3d
from ._norm import LazyInstanceNorm1d as LazyInstanceNorm1d
from ._norm import LazyInstanceNorm2d as LazyInstanceNorm2d
from ._norm import LazyInstanceNorm3d as LazyInstanceNorm3d
from ._on_build import OnBuildHandle as OnBuildHandle
from ._on_build import on_build as on_build
from ._placeholder import UninitializedBuffer as UninitializedBuffer
from ._placeholder import UninitializedParameter as UninitializedParameter
from ._placeholder import is_lazy as is_lazy
from ._rehearse import Spec as Spec
from ._summary import Summary as Summary
from ._summary import SummaryRow as SummaryRow
from ._summary import summary as summary

__version__ = "0.1.0"

__all__ = [
    "UNKNOWN",
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
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
    "LazyLayer",
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
