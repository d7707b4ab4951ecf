"""lazynn: shape-inferring ("lazy") layers for PyTorch that become plain torch.nn.

>>> import torch, lazynn
>>> model = torch.nn.Sequential(lazynn.LazyConv2d(8, 3), torch.nn.Flatten(), lazynn.LazyLinear(10))
>>> model(torch.randn(2, 3, 16, 16)).shape
torch.Size([2, 10])
>>> type(model[2]).__name__, model[2].in_features
('Linear', 1568)
"""

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
from ._norm import LazyBatchNorm1d as LazyBatchNorm1d
from ._norm import LazyBatchNorm2d as LazyBatchNorm2d
from ._norm import LazyBatchNorm3d as LazyBatchNorm3d
from ._norm import LazyInstanceNorm1d as LazyInstanceNorm1d
from ._norm import LazyInstanceNorm2d as LazyInstanceNorm2d
from ._norm import LazyInstanceNorm3d as LazyInstanceNorm3d
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
    "CheckpointError",
    "Infer",
    "InferenceError",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLayer",
    "LazyLinear",
    "LazyModuleMixin",
    "LazynnError",
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
    "summary",
]
