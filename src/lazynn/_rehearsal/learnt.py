"""What a rehearsal learns about a model: each module's calls (shapes, count, FLOPs), each
tensor as the build will make it, each lazy layer's sizes (``Rehearsal``); ``rehearse.py``
fills them in.

>>> import torch
>>> TensorInfo("weight", (4, 3), torch.float32, True, True, True, 0).nbytes
48
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["Call", "Rehearsal", "TensorInfo"]


@dataclass
class Call:
    """A module's calls in the rehearsal: the first call's shapes, how many, and their FLOPs."""

    path: str
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    outputs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    #: how many times the forward called it
    count: int = 1
    #: the FLOPs of all its calls, its submodules' included (when counted)
    flops: int = 0


@dataclass(frozen=True)
class TensorInfo:
    """A parameter or buffer as the build will make it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    is_parameter: bool
    requires_grad: bool
    persistent: bool
    ident: int  # id() of the real tensor (or placeholder) in the model: counts shared once

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class Rehearsal:
    """What the meta rehearsal learnt about a model."""

    #: module path -> its first call (input and output shapes)
    calls: dict[str, Call]
    #: module path -> class name after the build
    types: dict[str, str]
    #: module path -> own tensors after the build
    tensors: dict[str, list[TensorInfo]]
    #: LazyLayer -> inferred sizes
    sizes: dict[nn.Module, dict[str, int]]
    #: other lazy modules (torch's, custom LazyModuleMixin) -> the meta inputs of their first call
    inputs: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]]
    #: lazy modules the forward never called
    unreached: list[str]
    #: the model's meta output
    output: Any
    #: path -> why a size a lazy layer read may not be the one meant (``_layer.infer.ambiguity``)
    notes: dict[str, str] = field(default_factory=dict)
