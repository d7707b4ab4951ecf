"""What torch's kernels refuse that its meta kernels accept, checked before a call runs on meta.

A rehearsal runs on meta, where many of torch's kernels check shapes but not what the real
kernels check besides: ``bool_mask - 1`` ("Subtraction ... with a bool tensor is not
supported"), ``F.silu`` of integers, an integer tensor to a negative power, ``F.softmax``
along a dimension the tensor lacks, a convolution's bias of the wrong size, a transposed
convolution's input of the wrong channels, an adaptive pooling of an empty dimension,
``torch.arange`` of bools. A build that passed them would return a model whose first real
forward raises, and a summary would print shapes for it. So the rehearsal's device mode asks
:func:`refused` first, for the functions the formulas answer (``formulas.py``): where a rule
says the real kernel refuses the call, the call is made on the CPU, on zero-strided stand-ins
of the arguments (no memory; where the kernel takes another path for them, on zeros of the
arguments' shapes, up to 4M elements), and torch's own error is raised, in torch's words.

Only checks that hold on every device are rules here (a dtype a kernel has no
implementation for, an operator refused for bools, shapes); what one device's kernels accept
and another's refuse (``layer_norm`` with weights of another dtype than its input: the CPU's
refuses, CUDA's accepts) is left to the meta kernel, as the model may be bound elsewhere.
``tests/rehearsal/test_formulas.py`` draws every formula's inputs and checks both ways against
the CPU kernel: each call it refuses, the rehearsal refuses with its error; no call it
accepts is refused.

>>> import torch
>>> mask = torch.empty(2, 3, dtype=torch.bool, device="meta")
>>> print(refused(torch.Tensor.__sub__, (mask, 1), {}))  # doctest: +ELLIPSIS
Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to...
>>> refused(torch.Tensor.__sub__, (mask.float(), 1), {}) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._module.tensors import map_tensors

__all__ = ["refused"]

_INTEGERS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def _dtype(value: Any) -> torch.dtype | None:
    return value.dtype if isinstance(value, Tensor) else None


def _integer_input(input: Any, *_: Any, **__: Any) -> bool:
    """A floating-point kernel (silu, gelu, softmax...) given integers or bools."""
    return _dtype(input) in _INTEGERS


def _bool_input(input: Any, *_: Any, **__: Any) -> bool:
    """relu given bools."""
    return _dtype(input) is torch.bool


def _subtracts_bool(input: Any, other: Any, *_: Any, **__: Any) -> bool:
    """A subtraction with a bool tensor or a Python bool on either side."""
    return any(_dtype(x) is torch.bool or isinstance(x, bool) for x in (input, other))


def _power(input: Any, exponent: Any, *_: Any, **__: Any) -> bool:
    """A power of bools, or an integer tensor to a negative integer's power (a number: its
    value is known)."""
    if _dtype(input) in _INTEGERS and type(exponent) is int and exponent < 0:
        return True
    return torch.result_type(input, exponent) is torch.bool


def _reverse_power(input: Any, other: Any, *_: Any, **__: Any) -> bool:
    return _power(other, input)


def _rounded_bools(input: Any, other: Any, *, rounding_mode: Any = None) -> bool:
    """A division of bools with a rounding mode (there is no rounding kernel for them)."""
    return rounding_mode is not None and torch.result_type(input, other) is torch.bool


def _softmax(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> bool:
    if _integer_input(input) and dtype is None:
        return True
    if not isinstance(input, Tensor) or type(dim) is not int:
        return False
    rank = max(input.dim(), 1)
    return not -rank <= dim < rank


def _method_softmax(input: Any, dim: Any, dtype: Any = None) -> bool:
    return _softmax(input, dim, 3, dtype)


def _mixed(*tensors: Any) -> bool:
    dtypes = {t.dtype for t in tensors if isinstance(t, Tensor)}
    return len(dtypes) > 1


def _linear(input: Any, weight: Any, bias: Any = None) -> bool:
    if _mixed(input, weight, bias):
        return True
    if not isinstance(bias, Tensor) or not isinstance(weight, Tensor) or weight.dim() != 2:
        return False
    out = weight.shape[0]
    # (the output's last dimension is the weight's first: a bias broadcasts to it, or not)
    return bias.dim() > 1 or (bias.dim() == 1 and bias.shape[0] not in (1, out))


#: a convolution's arguments after the bias, in order, and their defaults
_CONV = (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
_CONV_TRANSPOSE = (
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("dilation", 1),
)


def _conv(transposed: bool) -> Callable[..., bool]:
    names = _CONV_TRANSPOSE if transposed else _CONV

    def rule(input: Any, weight: Any, bias: Any = None, *args: Any, **kwargs: Any) -> bool:
        t = input
        if _mixed(t, weight, bias):
            return True
        if not isinstance(t, Tensor) or not isinstance(weight, Tensor) or weight.dim() < 3:
            return False
        given = {
            name: args[i] if i < len(args) else kwargs.get(name, default)
            for i, (name, default) in enumerate(names)
        }
        out = weight.shape[1] * given["groups"] if transposed else weight.shape[0]
        if isinstance(bias, Tensor) and (bias.dim() != 1 or bias.shape[0] != out):
            return True
        if not transposed or t.dim() not in (weight.dim(), weight.dim() - 1):
            return False
        if t.shape[t.dim() - weight.dim() + 1] != weight.shape[0]:  # (its channels)
            return True
        rank = weight.dim() - 2
        each = [_per_dim(given[k], rank) for k in ("stride", "padding", "dilation")]
        extra = _per_dim(given["output_padding"], rank)
        sizes = zip(t.shape[-rank:], weight.shape[2:], *each, extra, strict=True)
        for size, kernel, stride, padding, dilation, more in sizes:
            if more >= stride and more >= dilation:  # (output padding too large)
                return True
            if (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + more + 1 <= 0:
                return True  # (an output of no size)
        return False

    return rule


def _per_dim(value: Any, rank: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank


def _adaptive_pool(t: Any, *_: Any, **__: Any) -> bool:
    """An adaptive pooling of an input with an empty dimension besides the batch."""
    if not isinstance(t, Tensor) or t.dim() < 2:
        return False
    return any(size == 0 for size in t.shape[1:])


def _arange(*args: Any, dtype: Any = None, **_: Any) -> bool:
    return dtype is torch.bool


#: function -> a rule: whether its real kernels refuse the call (on every device)
_RULES: dict[Any, Callable[..., bool]] = {
    F.relu: _bool_input,
    torch.relu: _bool_input,
    Tensor.relu: _bool_input,
    torch.relu_: _bool_input,
    Tensor.relu_: _bool_input,
    F.silu: _integer_input,
    F.hardswish: _integer_input,
    F.mish: _integer_input,
    F.leaky_relu: _integer_input,
    F.gelu: _integer_input,
    torch.sub: _subtracts_bool,
    torch.rsub: lambda input, other, *_, **__: _subtracts_bool(other, input),
    Tensor.sub: _subtracts_bool,
    Tensor.__sub__: _subtracts_bool,
    Tensor.__rsub__: _subtracts_bool,
    torch.pow: _power,
    Tensor.pow: _power,
    Tensor.__pow__: _power,
    Tensor.__rpow__: _reverse_power,
    torch.neg: _bool_input,
    Tensor.neg: _bool_input,
    Tensor.__neg__: _bool_input,
    torch.div: _rounded_bools,
    Tensor.div: _rounded_bools,
    F.softmax: _softmax,
    Tensor.softmax: _method_softmax,
    F.log_softmax: _softmax,
    Tensor.log_softmax: _method_softmax,
    F.linear: _linear,
    F.conv1d: _conv(transposed=False),
    F.conv2d: _conv(transposed=False),
    F.conv3d: _conv(transposed=False),
    F.conv_transpose1d: _conv(transposed=True),
    F.conv_transpose2d: _conv(transposed=True),
    F.conv_transpose3d: _conv(transposed=True),
    F.adaptive_avg_pool1d: _adaptive_pool,
    F.adaptive_avg_pool2d: _adaptive_pool,
    F.adaptive_avg_pool3d: _adaptive_pool,
    torch.arange: _arange,
}


#: the most elements a check allocates for its CPU call (the zero-strided one did not raise)
_CHECKED = 1 << 22


def _expanded(t: Tensor) -> Tensor:
    """A CPU tensor of ``t``'s shape and dtype that holds one element (strides of zero)."""
    return torch.zeros((), dtype=t.dtype, device="cpu").expand(t.shape)


def _whole(t: Tensor) -> Tensor:
    """A CPU tensor of ``t``'s shape, strides and dtype, of zeros."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu").zero_()


def _cpu_error(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], made: Callable[[Tensor], Tensor]
) -> BaseException | None:
    cpu_args, cpu_kwargs = map_tensors(made, args), map_tensors(made, kwargs)
    if "device" in cpu_kwargs:
        cpu_kwargs["device"] = "cpu"
    try:
        func(*cpu_args, **cpu_kwargs)
    except Exception as error:  # (torch's refusal, in its words)
        return error
    return None


def refused(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException | None:
    """torch's own error for a call its real kernels refuse and its meta kernel may accept
    (see the module doc), or None."""
    rule = _RULES.get(func)
    if rule is None:
        return None
    try:
        refuses = rule(*args, **kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):  # (arguments it cannot read)
        return None
    if not refuses:
        return None
    error = _cpu_error(func, args, kwargs, _expanded)
    if error is None:  # (some kernels take another path for strides of zero: 1-D linear)
        sizes: list[int] = []
        map_tensors(lambda t: sizes.append(t.numel()), (args, kwargs))
        if sum(sizes) <= _CHECKED:
            error = _cpu_error(func, args, kwargs, _whole)
    return error
