"""Lazy normalization layers.

    LazyBatchNorm1d/2d/3d, LazyInstanceNorm1d/2d/3d(...)   num_features = C of (N, C, *)
    LazySyncBatchNorm(...)                                 num_features = C of (N, C, *)
    LazyGroupNorm(num_groups, ...)                         num_channels = C of (N, C, *)
    LazyLayerNorm(..., dims=1) / LazyRMSNorm(..., dims=1)  normalized_shape = last `dims` dims

>>> import torch, lazynn
>>> norm = lazynn.LazyGroupNorm(2)
>>> norm(torch.randn(4, 6, 5)).shape, type(norm).__name__, norm.num_channels
(torch.Size([4, 6, 5]), 'GroupNorm', 6)

``LazyInstanceNorm*`` defaults are those of ``nn.InstanceNorm*`` (``affine=False,
track_running_stats=False``), unlike torch's own ``nn.LazyInstanceNorm*`` (which default both
to True, contrary to their docs): a lazy layer must compute what its eager class computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from .._errors import UnbuiltError, message, module_path
from .._layer.base import LazyLayer
from .._layer.infer import UNKNOWN, Infer
from .._layer.lazy import lazy
from .._module.callers import find_tool
from .._module.state import lazy_state

__all__ = [
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyGroupNorm",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLayerNorm",
    "LazyRMSNorm",
    "LazySyncBatchNorm",
]


class _LazyNorm(LazyLayer):
    mixed_precision_input = True  # torch's norms accept float16/bfloat16 input with fp32 stats
    known_buffers = frozenset({"num_batches_tracked"})  # tensor(0), as torch's lazy norms

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
        self._lazynn_setup(
            eps=eps,
            momentum=momentum,
            affine=affine,
            track_running_stats=track_running_stats,
            device=device,
            dtype=dtype,
            bias=bias,
        )

    @property
    def num_features(self) -> Any:
        """The channels: ``?`` before the build. (A property only while unbuilt, so that
        ``SyncBatchNorm.convert_sync_batchnorm``, which reads it to construct its layer, gets
        lazynn's refusal with the fix rather than a TypeError from ``torch.empty``.)"""
        value = self.__dict__["num_features"]
        tool = find_tool() if value is UNKNOWN else None
        if tool is not None:
            raise UnbuiltError(
                message(
                    module_path(self),
                    f"a built layer for {tool.name}",
                    "an unbuilt layer, whose num_features the first input decides",
                    tool.fix,
                )
            )
        return value

    @num_features.setter
    def num_features(self, value: Any) -> None:
        self.__dict__["num_features"] = value


class _LazyInstanceNorm(_LazyNorm):
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
        super().__init__(eps, momentum, affine, track_running_stats, device, dtype, bias=bias)


_DOC = """``nn.{eager}`` with ``num_features`` inferred from the input's channel dimension.

    Input: {layouts}; ``num_features = C``. Arguments are ``nn.{eager}``'s without
    ``num_features``, with its defaults (affine={affine}, track_running_stats={affine}).
    After the first call the module is exactly an ``nn.{eager}``.

    >>> import torch, lazynn
    >>> norm = lazynn.Lazy{eager}()
    >>> out = norm(torch.randn({example}))
    >>> type(norm).__name__, norm.num_features
    ('{eager}', 3)
    """


def _spec(*layouts: str) -> Infer:
    return Infer(layouts=layouts)


def _doc(eager: type[nn.Module], layouts: tuple[str, ...], affine: bool, example: str) -> str:
    return _DOC.format(
        eager=eager.__name__,
        layouts=" or ".join(f"``{lay}``" for lay in layouts),
        affine=affine,
        example=example,
    )


_BN1 = ("(N, C)", "(N, C, L)")
_BN2 = ("(N, C, H, W)",)
_BN3 = ("(N, C, D, H, W)",)
_IN1 = ("(C, L)", "(N, C, L)")
_IN2 = ("(C, H, W)", "(N, C, H, W)")
_IN3 = ("(C, D, H, W)", "(N, C, D, H, W)")


class LazyBatchNorm1d(_LazyNorm, nn.BatchNorm1d):
    __doc__ = _doc(nn.BatchNorm1d, _BN1, True, "4, 3")
    cls_to_become = nn.BatchNorm1d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_BN1)}


class LazyBatchNorm2d(_LazyNorm, nn.BatchNorm2d):
    __doc__ = _doc(nn.BatchNorm2d, _BN2, True, "4, 3, 2, 2")
    cls_to_become = nn.BatchNorm2d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_BN2)}


class LazyBatchNorm3d(_LazyNorm, nn.BatchNorm3d):
    __doc__ = _doc(nn.BatchNorm3d, _BN3, True, "4, 3, 2, 2, 2")
    cls_to_become = nn.BatchNorm3d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_BN3)}


class LazyInstanceNorm1d(_LazyInstanceNorm, nn.InstanceNorm1d):
    __doc__ = _doc(nn.InstanceNorm1d, _IN1, False, "2, 3, 5")
    cls_to_become = nn.InstanceNorm1d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_IN1)}


class LazyInstanceNorm2d(_LazyInstanceNorm, nn.InstanceNorm2d):
    __doc__ = _doc(nn.InstanceNorm2d, _IN2, False, "2, 3, 4, 4")
    cls_to_become = nn.InstanceNorm2d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_IN2)}


class LazyInstanceNorm3d(_LazyInstanceNorm, nn.InstanceNorm3d):
    __doc__ = _doc(nn.InstanceNorm3d, _IN3, False, "2, 3, 2, 2, 2")
    cls_to_become = nn.InstanceNorm3d
    inferred: ClassVar[Mapping[str, Infer]] = {"num_features": _spec(*_IN3)}


LazyGroupNorm = lazy(nn.GroupNorm, num_channels=Infer(dim=1, probe="num_groups"))
LazyGroupNorm.mixed_precision_input = True  # float16/bfloat16 input, float32 weights: as eager
LazyGroupNorm.__doc__ = """``nn.GroupNorm(num_groups, num_channels, ...)`` with ``num_channels = C``
of ``(N, C, *)`` (dimension 1). Other arguments as ``nn.GroupNorm``'s.

>>> import torch, lazynn
>>> norm = lazynn.LazyGroupNorm(2)
>>> norm(torch.randn(3, 6, 4)).shape, norm.num_channels
(torch.Size([3, 6, 4]), 6)
"""
LazySyncBatchNorm = lazy(nn.SyncBatchNorm, num_features=Infer(dim=1))
LazySyncBatchNorm.known_buffers = frozenset({"num_batches_tracked"})
LazySyncBatchNorm.__doc__ = """``nn.SyncBatchNorm(num_features, ...)`` with ``num_features = C`` of
``(N, C, *)`` (dimension 1). Other arguments as ``nn.SyncBatchNorm``'s.

>>> import lazynn
>>> norm = lazynn.build(lazynn.LazySyncBatchNorm(), (4, 6, 5), device="meta")
>>> type(norm).__name__, norm.num_features
('SyncBatchNorm', 6)
"""


def _trailing(dims: int) -> Mapping[str, Infer]:
    if not isinstance(dims, int) or dims < 1:
        raise ValueError(
            f"dims: expected a positive number of trailing dimensions, received {dims!r}"
        )
    return {"normalized_shape": Infer(trailing=dims)}


class LazyLayerNorm(LazyLayer, nn.LayerNorm):
    """``nn.LayerNorm`` with ``normalized_shape`` read from the input's trailing dimensions.

    Input ``(*, D_1, ..., D_k)``; ``normalized_shape = (D_1, ..., D_k)`` with ``k = dims``
    (default 1: the last dimension). Other arguments as ``nn.LayerNorm``.

    >>> import torch, lazynn
    >>> norm = lazynn.LazyLayerNorm(dims=2)
    >>> norm(torch.randn(4, 3, 5)).shape, norm.normalized_shape
    (torch.Size([4, 3, 5]), (3, 5))
    """

    cls_to_become = nn.LayerNorm
    inferred: ClassVar[Mapping[str, Infer]] = _trailing(1)
    mixed_precision_input = True  # float16/bfloat16 input with float32 parameters, as eager

    def __init__(
        self,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dims: int = 1,
    ) -> None:
        lazy_state(self).specs = _trailing(dims)
        self._lazynn_setup(
            eps=eps, elementwise_affine=elementwise_affine, bias=bias, device=device, dtype=dtype
        )


class LazyRMSNorm(LazyLayer, nn.RMSNorm):
    """``nn.RMSNorm`` with ``normalized_shape`` read from the input's trailing dimensions.

    Input ``(*, D_1, ..., D_k)``; ``normalized_shape = (D_1, ..., D_k)`` with ``k = dims``
    (default 1). Other arguments as ``nn.RMSNorm``.

    >>> import torch, lazynn
    >>> norm = lazynn.LazyRMSNorm()
    >>> norm(torch.randn(4, 6)).shape, norm.normalized_shape
    (torch.Size([4, 6]), (6,))
    """

    cls_to_become = nn.RMSNorm
    inferred: ClassVar[Mapping[str, Infer]] = _trailing(1)
    any_float_input = True  # nn.RMSNorm computes a float64 input with float32 weights

    def __init__(
        self,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dims: int = 1,
    ) -> None:
        lazy_state(self).specs = _trailing(dims)
        self._lazynn_setup(
            eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype
        )
