"""What a replay is asked for by ranks: a :class:`Block` of a tensor (a rank's shard), the
:class:`Ranks` that replay a tape together, and which steps act on a block as on the whole
tensor (:data:`ELEMENTWISE` steps, :data:`FILLED` makers).

>>> Block(View(0, (4, 2), (2, 1), 0, torch.float32), (2, 0), torch.empty(2, 2)).offset
(2, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .tape import View

__all__ = ["ELEMENTWISE", "FILLED", "OVERWRITES", "TRUNC_NORMAL", "Block", "Ranks"]

#: the step of ``nn.init.trunc_normal_`` (``functions.py``), whose rounds depend on values
TRUNC_NORMAL = "torch.nn.init.trunc_normal_"

#: steps that write every element of their first argument without reading it (when that is
#: its whole storage: a replay need not run what wrote the storage before)
OVERWRITES = frozenset(
    {
        "aten::uniform_.default",
        "aten::normal_.default",
        "aten::fill_.Scalar",
        "aten::zero_.default",
        "aten::copy_.default",
        TRUNC_NORMAL,
    }
)

#: in-place steps that act on each element alone, with scalar arguments: a block of a tensor
#: takes them as the whole tensor would
ELEMENTWISE = frozenset(
    f"aten::{name}"
    for name in (
        "fill_.Scalar",
        "zero_.default",
        "mul_.Scalar",
        "mul_.Tensor",
        "div_.Scalar",
        "div_.Tensor",
        "add_.Scalar",
        "add_.Tensor",
        "sub_.Scalar",
        "sub_.Tensor",
        "clamp_.default",
        "clamp_min_.default",
        "clamp_max_.default",
        "erfinv_.default",
        "exp_.default",
        "log_.default",
        "neg_.default",
        "abs_.default",
        "sqrt_.default",
        "pow_.Scalar",
        "sign_.default",
    )
)
#: steps that make a tensor whose every element one value fills (or none: ``empty``)
FILLED = {
    "aten::empty.memory_format": None,
    "aten::empty_strided.default": None,
    "aten::zeros.default": 0.0,
    "aten::ones.default": 1.0,
}


@dataclass(frozen=True)
class Block:
    """A tensor asked for as one block of it: ``local`` (this rank's memory) takes the
    elements at ``offset`` (one start per dimension) of the tensor ``view`` names."""

    view: View
    offset: tuple[int, ...]
    local: torch.Tensor


@dataclass(frozen=True)
class Ranks:
    """The processes replaying one tape together, each for its blocks: this one's ``rank``
    of ``size``, and ``agree(n)``, the largest ``n`` any of them passes (an
    ``all_reduce(MAX)``), which each calls once per value-dependent step, in tape order."""

    rank: int
    size: int
    agree: Callable[[int], int]
