"""Rank-agnostic layers: the first input's rank picks the 1d, 2d or 3d torch.nn class.

``lazynn.Conv(16, 3)`` on ``(N, C, H, W)`` becomes exactly ``nn.Conv2d(C, 16, 3)``. Inputs are
read as *batched*: rank 3 is 1d ``(N, C, L)``, rank 4 is 2d ``(N, C, H, W)``, rank 5 is 3d
``(N, C, D, H, W)`` (``BatchNorm`` also takes ``(N, C)`` as 1d). An unbatched ``(C, H, W)``
would be read as a batched 1d input, so these layers do not take unbatched inputs: use the
ranked lazy classes (``LazyConv2d``) for those. A rank they cannot place is an
:class:`~lazynn.InferenceError` naming the ranks they accept.

>>> import torch, lazynn
>>> conv = lazynn.Conv(16, 3)
>>> conv
Conv(16, 3, rank=?)
>>> conv(torch.randn(2, 3, 8, 8)).shape, type(conv).__name__
(torch.Size([2, 16, 6, 6]), 'Conv2d')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from .._errors import (
    BUILD,
    CheckpointError,
    InferenceError,
    LazynnError,
    UnbuiltError,
    message,
    module_path,
    shape_str,
)
from .._layer.base import LazyLayer
from .._layer.infer import Infer
from .._module.callers import under_dynamo
from .._module.lifecycle import in_build
from .._module.refusals import compile_refusal
from .._module.state import find_state, lazy_state
from .._module.tensors import is_placeholder

__all__ = [
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "AvgPool",
    "BatchNorm",
    "ChannelDropout",
    "Conv",
    "ConvTranspose",
    "InstanceNorm",
    "MaxPool",
]

_CHANNELS = {"in_channels": Infer(dim=1, probe="groups")}
_FEATURES = {"num_features": Infer(dim=1)}


class _RankAgnostic(LazyLayer, nn.Module):
    """A lazy layer whose class (``by_rank[input rank]``) is chosen at the build."""

    by_rank: ClassVar[Mapping[int, type[nn.Module]]]
    _user_args: tuple[Any, ...]
    # (torch.compile fixes the class it traces before a build: its first call runs uncompiled)
    _lazynn_compiles_unbuilt: ClassVar[bool] = False

    def _agnostic_setup(
        self, args: tuple[Any, ...], only: tuple[int, ...] = (), **kwargs: Any
    ) -> None:
        """Lay out with the lowest rank's class (``only``: among these ranks)."""
        ranks = sorted(r for r in self.by_rank if not only or r in only)
        kernel = kwargs.get("kernel_size")
        if isinstance(kernel, tuple):  # a tuple kernel fixes the rank: lay out with that class
            ranks = [r for r in ranks if self.by_rank[r] is self._class_for_spatial(len(kernel))]
            if not ranks:
                offered = sorted(r - 2 for r in self.by_rank if not only or r in only)
                raise ValueError(
                    f"{type(self).__name__}: a kernel_size of {len(kernel)} dimensions has no "
                    f"class with these arguments; expected "
                    + " or ".join(str(n) for n in offered)
                    + " dimensions"
                )
        self.__dict__["cls_to_become"] = self.by_rank[ranks[0]]  # lays out the placeholders
        state = lazy_state(self)
        state.ranks = tuple(ranks)
        state.shown = args
        try:
            self._lazynn_setup(**kwargs)
        except LazynnError:
            raise  # (lazynn's own refusal names this class already)
        except ValueError as error:  # the eager class's own check: name the class constructed
            layout = self.by_rank[ranks[0]].__name__
            raise ValueError(str(error).replace(layout, type(self).__name__)) from None

    def _class_for_spatial(self, spatial: int) -> type[nn.Module] | None:
        return self.by_rank.get(spatial + 2)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The chosen class's forward, once built (the first call builds, then gets here)."""
        if isinstance(self, _RankAgnostic):
            raise UnbuiltError(
                message(
                    module_path(self),
                    "a call of the module, which builds it (model(x))",
                    "a direct .forward() call, which skips the build",
                    f"call the module itself, or {BUILD} first",
                )
            )
        return type(self).forward(self, *args, **kwargs)

    def extra_repr(self) -> str:
        state = find_state(self)
        if state is None or state.shown is None:
            return super().extra_repr()
        shown = ", ".join(repr(a) for a in state.shown)
        return f"{shown}, rank=?" if shown else "rank=?"

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        if under_dynamo():
            # dynamo fixes the class it traces (cls_to_become) before it builds a lazy module;
            # this one's class is decided by the input it has not seen yet: a graph break
            # (the call runs uncompiled, and builds), or with fullgraph=True, the error
            compile_refusal(
                f"an unbuilt lazynn.{type(self).__name__}",
                "this layer's class is chosen by its first input's rank, after torch.compile "
                "has fixed the class it traces",
                [
                    f"build first: {BUILD}, then compile",
                    "or use the ranked lazy class (lazynn.LazyConv2d...), which compiles unbuilt",
                ],
            )
        if in_build():
            value = args[0] if args else next(iter(kwargs.values()), None)
            rank = value.dim() if isinstance(value, torch.Tensor) else -1
            accepted = self._lazynn.ranks
            if rank not in accepted:
                raise InferenceError(
                    message(
                        module_path(self),
                        "a batched input of rank "
                        + " or ".join(f"{r} ({self.by_rank[r].__name__})" for r in accepted),
                        f"shape {shape_str(value.shape)}"
                        if isinstance(value, torch.Tensor)
                        else repr(value),
                        "reshape the input, or use a ranked class (lazynn.LazyConv2d...) for "
                        "unbatched inputs",
                    )
                )
            self.__dict__["cls_to_become"] = self.by_rank[rank]
        # (not super(): a bound method kept from before the build may be called on the built,
        # class-swapped module, which then refuses as every built layer does)
        LazyLayer.initialize_parameters(self, *args, **kwargs)

    def _lazynn_build_from_state(
        self, state_dict: dict[str, Any], prefix: str, assign: bool = False
    ) -> None:
        entries = [
            state_dict.get(prefix + (f"{path}.{name}" if path else name))
            for (path, name), _ in self._lazynn_slots()
        ]
        if not any(isinstance(e, torch.Tensor) and not is_placeholder(e) for e in entries):
            return  # nothing built in the checkpoint: stay unbuilt
        weight = state_dict.get(prefix + "weight")
        target = None
        if self._spatial_weight and isinstance(weight, torch.Tensor):
            target = self._class_for_spatial(weight.dim() - 2)
        if target is None:
            raise CheckpointError(
                message(
                    module_path(self, prefix[:-1]),
                    "a checkpoint that tells this layer's rank (1d, 2d or 3d)",
                    "one that does not (a norm's tensors look the same in every rank)",
                    f"build the model first ({BUILD} or one call), then load the checkpoint",
                )
            )
        layout = self.__dict__["cls_to_become"]
        self.__dict__["cls_to_become"] = target
        try:
            super()._lazynn_build_from_state(state_dict, prefix, assign)
        except BaseException:
            self.__dict__["cls_to_become"] = layout  # still unbuilt, its rank unknown
            raise

    _spatial_weight: ClassVar[bool] = False


class Conv(_RankAgnostic):
    """``nn.Conv1d/2d/3d`` chosen by the input's rank; ``in_channels`` from dimension 1.

    Args: those of ``nn.Conv2d`` without ``in_channels``. Input ``(N, C, *spatial)`` with 1 to
    3 spatial dimensions.

    >>> import torch, lazynn
    >>> conv = lazynn.Conv(16, 3)
    >>> conv(torch.randn(2, 3, 8, 8)).shape, type(conv).__name__, conv.in_channels
    (torch.Size([2, 16, 6, 6]), 'Conv2d', 3)
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}
    inferred: ClassVar[Mapping[str, Infer]] = _CHANNELS
    _spatial_weight = True

    def __init__(
        self,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: str | int | tuple[int, ...] = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._agnostic_setup(
            (out_channels, kernel_size),
            out_channels=out_channels, kernel_size=kernel_size, stride=stride, padding=padding,
            dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode,
            device=device, dtype=dtype,
        )  # fmt: skip


class ConvTranspose(_RankAgnostic):
    """``nn.ConvTranspose1d/2d/3d`` chosen by the input's rank; ``in_channels`` from dim 1.

    Args: those of ``nn.ConvTranspose2d`` without ``in_channels``. Input
    ``(N, C, *spatial)`` with 1 to 3 spatial dimensions.

    >>> import torch, lazynn
    >>> up = lazynn.ConvTranspose(4, 2, stride=2)
    >>> up(torch.randn(2, 3, 5)).shape, type(up).__name__, up.in_channels
    (torch.Size([2, 4, 10]), 'ConvTranspose1d', 3)
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.ConvTranspose1d,
        4: nn.ConvTranspose2d,
        5: nn.ConvTranspose3d,
    }
    inferred: ClassVar[Mapping[str, Infer]] = _CHANNELS
    _spatial_weight = True

    def __init__(
        self,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] = 0,
        output_padding: int | tuple[int, ...] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | tuple[int, ...] = 1,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._agnostic_setup(
            (out_channels, kernel_size),
            out_channels=out_channels, kernel_size=kernel_size, stride=stride, padding=padding,
            output_padding=output_padding, groups=groups, bias=bias, dilation=dilation,
            padding_mode=padding_mode, device=device, dtype=dtype,
        )  # fmt: skip


class BatchNorm(_RankAgnostic):
    """``nn.BatchNorm1d`` (``(N, C)`` or ``(N, C, L)``), ``2d`` or ``3d`` by the input's rank;
    ``num_features = C``, dimension 1.

    >>> import torch, lazynn
    >>> bn = lazynn.BatchNorm()
    >>> bn(torch.randn(4, 6)).shape, type(bn).__name__, bn.num_features
    (torch.Size([4, 6]), 'BatchNorm1d', 6)
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        2: nn.BatchNorm1d,
        3: nn.BatchNorm1d,
        4: nn.BatchNorm2d,
        5: nn.BatchNorm3d,
    }
    inferred: ClassVar[Mapping[str, Infer]] = _FEATURES
    mixed_precision_input = True
    known_buffers = frozenset({"num_batches_tracked"})  # tensor(0), as the lazy norms'

    def __init__(
        self,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        self._agnostic_setup(
            (),
            eps=eps, momentum=momentum, affine=affine, track_running_stats=track_running_stats,
            device=device, dtype=dtype, bias=bias,
        )  # fmt: skip


class InstanceNorm(_RankAgnostic):
    """``nn.InstanceNorm1d/2d/3d`` by the input's rank (batched); eager defaults;
    ``num_features = C``, dimension 1.

    >>> import torch, lazynn
    >>> norm = lazynn.InstanceNorm(affine=True)
    >>> norm(torch.randn(2, 3, 4, 4, 4)).shape, type(norm).__name__, norm.num_features
    (torch.Size([2, 3, 4, 4, 4]), 'InstanceNorm3d', 3)
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.InstanceNorm1d,
        4: nn.InstanceNorm2d,
        5: nn.InstanceNorm3d,
    }
    inferred: ClassVar[Mapping[str, Infer]] = _FEATURES
    mixed_precision_input = True
    known_buffers = frozenset({"num_batches_tracked"})  # tensor(0), as the lazy norms'

    def __init__(
        self,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        self._agnostic_setup(
            (),
            eps=eps, momentum=momentum, affine=affine, track_running_stats=track_running_stats,
            device=device, dtype=dtype, bias=bias,
        )  # fmt: skip


class _ShapeOnly(_RankAgnostic):
    """Rank-agnostic layers with no parameters: only the class is decided at the build."""

    # These classes take no device/dtype: lazynn constructs them under torch.device.
    inferred: ClassVar[Mapping[str, Infer]] = {}


class MaxPool(_ShapeOnly):
    """``nn.MaxPool1d/2d/3d`` by the input's rank (3, 4 or 5).

    >>> import torch, lazynn
    >>> pool = lazynn.MaxPool(2)
    >>> pool(torch.randn(1, 3, 8)).shape, type(pool).__name__
    (torch.Size([1, 3, 4]), 'MaxPool1d')
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.MaxPool1d,
        4: nn.MaxPool2d,
        5: nn.MaxPool3d,
    }

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] | None = None,
        padding: int | tuple[int, ...] = 0,
        dilation: int | tuple[int, ...] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        self._agnostic_setup(
            (kernel_size,),
            kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
            return_indices=return_indices, ceil_mode=ceil_mode,
        )  # fmt: skip


class AvgPool(_ShapeOnly):
    """``nn.AvgPool1d/2d/3d`` by the input's rank (3, 4 or 5; 4 or 5 with a
    ``divisor_override``, which ``nn.AvgPool1d`` does not take).

    >>> import torch, lazynn
    >>> pool = lazynn.AvgPool(2)
    >>> pool(torch.randn(1, 3, 8, 8)).shape, type(pool).__name__
    (torch.Size([1, 3, 4, 4]), 'AvgPool2d')
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.AvgPool1d,
        4: nn.AvgPool2d,
        5: nn.AvgPool3d,
    }

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] | None = None,
        padding: int | tuple[int, ...] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        # nn.AvgPool1d takes no divisor_override: given one, only 2d and 3d inputs are accepted
        extra = {} if divisor_override is None else {"divisor_override": divisor_override}
        self._agnostic_setup(
            (kernel_size,), only=(4, 5) if extra else (),
            kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
            count_include_pad=count_include_pad, **extra,
        )  # fmt: skip


class AdaptiveAvgPool(_ShapeOnly):
    """``nn.AdaptiveAvgPool1d/2d/3d`` by the input's rank (3, 4 or 5).

    >>> import torch, lazynn
    >>> pool = lazynn.AdaptiveAvgPool(1)
    >>> pool(torch.randn(2, 5, 7, 7)).shape, type(pool).__name__
    (torch.Size([2, 5, 1, 1]), 'AdaptiveAvgPool2d')
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.AdaptiveAvgPool1d,
        4: nn.AdaptiveAvgPool2d,
        5: nn.AdaptiveAvgPool3d,
    }

    def __init__(self, output_size: int | tuple[int | None, ...]) -> None:
        self._agnostic_setup((output_size,), output_size=output_size)


class AdaptiveMaxPool(_ShapeOnly):
    """``nn.AdaptiveMaxPool1d/2d/3d`` by the input's rank (3, 4 or 5).

    >>> import torch, lazynn
    >>> pool = lazynn.AdaptiveMaxPool(2)
    >>> pool(torch.randn(2, 5, 8, 8, 8)).shape, type(pool).__name__
    (torch.Size([2, 5, 2, 2, 2]), 'AdaptiveMaxPool3d')
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.AdaptiveMaxPool1d,
        4: nn.AdaptiveMaxPool2d,
        5: nn.AdaptiveMaxPool3d,
    }

    def __init__(
        self, output_size: int | tuple[int | None, ...], return_indices: bool = False
    ) -> None:
        self._agnostic_setup((output_size,), output_size=output_size, return_indices=return_indices)


class ChannelDropout(_ShapeOnly):
    """``nn.Dropout1d/2d/3d`` (channel dropout: whole channels zeroed) by the input's rank
    (3, 4 or 5). Not element dropout: that is ``nn.Dropout``, which needs no size.

    >>> import torch, lazynn
    >>> drop = lazynn.ChannelDropout(0.5)
    >>> drop(torch.ones(2, 3, 4)).shape, type(drop).__name__
    (torch.Size([2, 3, 4]), 'Dropout1d')
    """

    by_rank: ClassVar[Mapping[int, type[nn.Module]]] = {
        3: nn.Dropout1d,
        4: nn.Dropout2d,
        5: nn.Dropout3d,
    }

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        self._agnostic_setup((p,), p=p, inplace=inplace)
