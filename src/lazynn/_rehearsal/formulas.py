"""Output shapes by formula: the rehearsal's answers to torch's common functions on meta.

On meta, many of torch's kernels are Python reference implementations (``torch._refs``,
``torch._decomp``): a ``relu`` costs about 0.25 ms, a ``layer_norm`` 0.6 ms, an attention
1.5 ms, and the first ``linear`` or ``layer_norm`` of a process imports ``torch._dynamo``
and sympy (1-2 s). A rehearsal only needs the outputs' shapes, dtypes and strides, which for
these functions follow from the inputs' by a formula. :func:`answer` gives, for a call the
rehearsal's device mode sees, an empty meta tensor of exactly the output torch's kernel would
make, or ``None``: torch's kernel runs, as for every function not in the table.

A formula answers only what it is sure of: plain meta tensors (no subclass, no functorch
transform, no autograd), floating dtypes where torch's kernel may refuse others, inputs with
row-major (contiguous) strides, so that the output is row-major too. Everything else, and
every input the formula finds invalid, is left to torch's kernel, which raises its own error
(tests/rehearsal/test_formulas.py compares both over generated inputs). Views (``view``,
``transpose``, ``reshape``...) are not answered: torch's are C++ and cheap, and keep their
aliasing and strides.

The FLOPs of an answered call (a linear, an attention) are counted by formula, as
``FlopCounterMode`` counts the kernels the call would have run (:data:`FLOPS`).

>>> import torch
>>> x = torch.empty(2, 3, device="meta")
>>> answer(torch.relu, (x,), {}).shape
torch.Size([2, 3])
>>> answer(torch.relu, (torch.empty(2, 3),), {}) is None  # a CPU tensor: torch's kernel
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .layer_shapes import (
    FLOATS,
    FLOPS,
    LAYERS,
    NUMBER,
    Unsure,
    check,
    dim_index,
    empty,
    floating,
    like,
    row_major,
)

__all__ = ["FLOPS", "answer", "flops"]


# --- element-wise --------------------------------------------------------------------------
def _unary(t: Any) -> Tensor:
    return like(floating(t))


def _relu(t: Any, inplace: Any = False) -> Tensor:
    check(not inplace)
    return like(floating(t))


def _elu(t: Any, alpha: Any = 1.0, inplace: Any = False) -> Tensor:
    check(isinstance(alpha, NUMBER) and not inplace)
    return like(floating(t))


def _leaky_relu(t: Any, negative_slope: Any = 0.01, inplace: Any = False) -> Tensor:
    return _elu(t, negative_slope, inplace)


def _gelu(t: Any, approximate: str = "none") -> Tensor:
    check(approximate in ("none", "tanh"))
    return like(floating(t))


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        check(x == y or x == 1 or y == 1)
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def _binary(divide: bool = False, subtract: bool = False) -> Callable[..., Tensor]:
    def formula(a: Any, b: Any, *, alpha: Any = 1) -> Tensor:
        check(isinstance(alpha, NUMBER) and alpha == 1)
        shapes = []
        for x in (a, b):
            if isinstance(x, Tensor):
                shapes.append(row_major(x).shape)
                check(not x.dtype.is_complex)
                check(not (subtract and x.dtype is torch.bool))  # (torch refuses it)
            else:
                check(type(x) in NUMBER)
                check(not (subtract and type(x) is bool))
        check(bool(shapes))
        dtype = torch.result_type(a, b)
        if divide and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        shape = _broadcast(shapes[0], shapes[-1]) if len(shapes) == 2 else shapes[0]
        return empty(shape, dtype)

    return formula


def _swapped(formula: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return lambda a, b: formula(b, a)


def _negative(t: Any) -> Tensor:
    t = row_major(t)
    check(t.dtype is not torch.bool and not t.dtype.is_complex)  # (torch refuses bools)
    return like(t)


def _power(a: Any, b: Any) -> Tensor:
    """``a ** b`` of floating tensors and numbers (integer powers have value rules)."""
    shapes = []
    for x in (a, b):
        if isinstance(x, Tensor):
            shapes.append(floating(x).shape)
        else:
            check(type(x) in (int, float))
    check(bool(shapes))
    shape = _broadcast(shapes[0], shapes[-1]) if len(shapes) == 2 else shapes[0]
    return empty(shape, torch.result_type(a, b))


def _divide(a: Any, b: Any, *, rounding_mode: Any = None) -> Tensor:
    check(rounding_mode is None)
    return _div(a, b)


def _outer(a: Any, b: Any) -> Tensor:
    a, b = row_major(a), row_major(b)
    check(a.dim() == 1 and b.dim() == 1 and a.dtype == b.dtype and not a.dtype.is_complex)
    check(a.dtype is not torch.bool)
    return empty((a.shape[0], b.shape[0]), a.dtype)


def _to(t: Any, *args: Any, **kwargs: Any) -> Tensor:
    """``t.to(dtype)``: ``t`` itself where the dtype is its own, as torch returns it."""
    t = row_major(t)
    check(not kwargs.keys() - {"dtype"} and len(args) + len(kwargs) == 1)
    dtype = args[0] if args else kwargs["dtype"]
    check(isinstance(dtype, torch.dtype) and not dtype.is_complex and not t.dtype.is_complex)
    return t if dtype == t.dtype else empty(t.shape, dtype)


def _repeat_interleave(t: Any, repeats: Any, dim: Any = None, *, output_size: Any = None) -> Tensor:
    t = row_major(t)
    check(type(repeats) is int and repeats >= 0 and output_size is None and t.dim() > 0)
    if dim is None:
        return empty((t.numel() * repeats,), t.dtype)
    d = dim_index(dim, t.dim())
    return empty((*t.shape[:d], t.shape[d] * repeats, *t.shape[d + 1 :]), t.dtype)


# --- normalizations, softmax, dropout -------------------------------------------------------
def _softmax(t: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    t = floating(t)
    check(dtype is None)
    dim_index(dim, t.dim())
    return like(t)


def _method_softmax(t: Any, dim: Any, dtype: Any = None) -> Tensor:
    return _softmax(t, dim, 3, dtype)


def _dropout(t: Any, p: Any = 0.5, training: Any = True, inplace: Any = False) -> Tensor:
    tensor = floating(t)
    check(isinstance(p, NUMBER) and 0.0 <= p <= 1.0 and not inplace)
    if p == 0 or not training or tensor.numel() == 0:
        return tensor  # (torch's dropout returns its input itself)
    return like(tensor)


def _affine(t: Tensor, shape: tuple[int, ...], *tensors: Any) -> None:
    """Check a normalization's weight and bias: absent, or of ``shape`` and ``t``'s dtype."""
    for w in tensors:
        check(w is None or (row_major(w).shape == shape and w.dtype == t.dtype))


def _sizes(shape: Any) -> tuple[int, ...]:
    if type(shape) is int:
        return (shape,)
    check(isinstance(shape, (tuple, list, torch.Size)) and all(type(s) is int for s in shape))
    return tuple(shape)


def _layer_norm(
    t: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5
) -> Tensor:
    t, shape = floating(t), _sizes(normalized_shape)
    check(0 < len(shape) <= t.dim() and tuple(t.shape[t.dim() - len(shape) :]) == shape)
    check(isinstance(eps, NUMBER))
    _affine(t, shape, weight, bias)
    return like(t)


def _rms_norm(t: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Tensor:
    t, shape = floating(t), _sizes(normalized_shape)
    check(0 < len(shape) <= t.dim() and tuple(t.shape[t.dim() - len(shape) :]) == shape)
    check(eps is None or isinstance(eps, NUMBER))
    _affine(t, shape, weight)
    return like(t)


def _group_norm(
    t: Any, num_groups: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5
) -> Tensor:
    t = floating(t)
    check(t.dim() >= 2 and type(num_groups) is int and num_groups > 0)
    n, c = t.shape[0], t.shape[1]
    check(c % num_groups == 0 and n > 0 and isinstance(eps, NUMBER))
    # (F.group_norm's _verify_batch_size: more than one value per group, or it raises)
    check(n * c // num_groups * math.prod(t.shape[2:]) != 1)
    _affine(t, (c,), weight, bias)
    return like(t)


def _cat(tensors: Any, dim: Any = 0) -> Tensor:
    check(isinstance(tensors, (list, tuple)) and len(tensors) > 0)
    first = row_major(tensors[0])
    check(first.dim() > 0)
    d = dim_index(dim, first.dim())
    total = 0
    for t in tensors:
        t = row_major(t)
        check(t.dim() == first.dim() and t.dtype == first.dtype and t.numel() > 0)
        check(
            all(a == b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != d)
        )
        total += t.shape[d]
    return empty((*first.shape[:d], total, *first.shape[d + 1 :]), first.dtype)


def _reduction(mean: bool) -> Callable[..., Tensor]:
    def formula(t: Any, dim: Any = None, keepdim: Any = None, *, dtype: Any = None) -> Tensor:
        t = floating(t) if mean else row_major(t)
        check(t.numel() > 0)  # (an empty one's strides: torch's TensorIterator's own)
        check(dtype is None and (keepdim is None or (type(keepdim) is bool and dim is not None)))
        rank = t.dim()
        if dim is None:
            dims = set(range(rank))
        else:
            listed = (dim,) if type(dim) is int else tuple(dim)
            dims = {dim_index(d, rank) for d in listed}
            check(len(listed) > 0 and len(dims) == len(listed))
        shape = [1 if i in dims else n for i, n in enumerate(t.shape) if keepdim or i not in dims]
        out = t.dtype if mean or t.dtype.is_floating_point else torch.int64
        check(not t.dtype.is_complex)
        return empty(shape, out)

    return formula


def _arange(*args: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``torch.arange`` of integers on meta (the device mode fills in ``device``)."""
    check(0 < len(args) <= 3 and all(type(a) is int for a in args))
    check(device is not None and torch.device(device).type == "meta")
    check(dtype is None or (isinstance(dtype, torch.dtype) and dtype in _ARANGED))
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args[:2], 1)[:3]
    if len(args) == 3:
        step = args[2]
    check(step != 0 and (end - start) * step >= 0)
    return empty((-(-(end - start) // step),), dtype or torch.int64)


_ARANGED = FLOATS | {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
#: unary functions of floating tensors whose output is the input's shape and dtype
_FLOAT_UNARY = ("cos", "sin", "exp", "rsqrt", "sqrt", "log")
_add, _sub, _mul, _div = _binary(), _binary(subtract=True), _binary(), _binary(divide=True)

#: torch's function (as a function mode sees it) -> its formula
_FORMULAS: dict[Any, Callable[..., Tensor | tuple[Tensor, ...]]] = {
    F.relu: _relu,
    F.silu: _relu,
    F.hardswish: _relu,
    F.mish: _relu,
    F.relu6: _relu,
    F.elu: _elu,
    F.leaky_relu: _leaky_relu,
    torch.relu: _unary,
    Tensor.relu: _unary,
    torch.sigmoid: _unary,
    Tensor.sigmoid: _unary,
    torch.tanh: _unary,
    Tensor.tanh: _unary,
    **{f: _unary for name in _FLOAT_UNARY for f in (getattr(torch, name), getattr(Tensor, name))},
    torch.neg: _negative,
    Tensor.neg: _negative,
    Tensor.__neg__: _negative,
    torch.pow: _power,
    Tensor.pow: _power,
    Tensor.__pow__: _power,
    Tensor.__rpow__: _swapped(_power),
    torch.div: _divide,
    Tensor.div: _divide,
    torch.outer: _outer,
    Tensor.to: _to,
    Tensor.repeat_interleave: _repeat_interleave,
    torch.repeat_interleave: _repeat_interleave,
    F.gelu: _gelu,
    torch.add: _add,
    Tensor.add: _add,
    Tensor.__add__: _add,
    Tensor.__radd__: _swapped(_add),
    torch.sub: _sub,
    Tensor.sub: _sub,
    Tensor.__sub__: _sub,
    Tensor.__rsub__: _swapped(_sub),
    torch.mul: _mul,
    Tensor.mul: _mul,
    Tensor.__mul__: _mul,
    Tensor.__rmul__: _swapped(_mul),
    Tensor.__truediv__: _div,
    F.softmax: _softmax,
    Tensor.softmax: _method_softmax,
    F.dropout: _dropout,
    F.layer_norm: _layer_norm,
    F.group_norm: _group_norm,
    torch.cat: _cat,
    **LAYERS,
    torch.arange: _arange,
    torch.mean: _reduction(mean=True),
    Tensor.mean: _reduction(mean=True),
    torch.sum: _reduction(mean=False),
    Tensor.sum: _reduction(mean=False),
}
if hasattr(F, "rms_norm"):
    _FORMULAS[F.rms_norm] = _rms_norm


def answer(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Tensor | tuple[Tensor, ...] | None:
    """The output of ``func(*args, **kwargs)`` by formula (an empty meta tensor of torch's
    shape, dtype and strides, or the input itself where torch returns it), or ``None``: not
    sure, torch's kernel must run (see the module doc). Call it with autograd off."""
    formula = _FORMULAS.get(func)
    if formula is None or torch._C._functorch.maybe_current_level() is not None:
        return None  # (inside vmap or grad, a tensor's shape is not its per-example shape)
    try:
        return formula(*args, **kwargs)
    except (Unsure, TypeError, ValueError, IndexError):
        return None


def flops(func: Any, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``(aten op, FLOPs)`` for an answered call of ``func`` (None: it has none).

    >>> import torch
    >>> x, w = torch.empty(4, 3, device="meta"), torch.empty(5, 3, device="meta")
    >>> linear = torch.nn.functional.linear
    >>> flops(linear, answer(linear, (x, w), {}), (x, w), {})
    (<OpOverloadPacket(op='aten.mm')>, 120)
    """
    formula = FLOPS.get(func)
    return None if formula is None else formula(out, *args, **kwargs)
