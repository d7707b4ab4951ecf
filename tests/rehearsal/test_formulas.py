"""The rehearsal's formulas (``_rehearsal/formulas.py``) give exactly what torch's meta kernels
give: the same shape, dtype and strides (the input itself where torch returns it), the same
FLOPs, and, for an input torch refuses, torch's own error (the formula leaves it to torch).
One harness: each function the formulas answer is a row, its inputs drawn by hypothesis
(broadcasting, type promotion with scalars and mixed dtypes, batch-less inputs, ``dim=None``,
negative dims, empty dims, strided inputs, invalid shapes).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from torch.utils.flop_counter import FlopCounterMode

from lazynn._rehearsal.formulas import FLOPS, answer, flops
from lazynn._rehearsal.meta_device import MetaDevice
from paths import ROOT

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
DTYPES = [*FLOATS, torch.int64, torch.int32, torch.bool]

Draw = Callable[[st.DataObject], tuple[tuple[Any, ...], dict[str, Any]]]


def meta(data: st.DataObject, shape: tuple[int, ...], dtypes: list[torch.dtype] = FLOATS) -> Any:
    """A meta tensor of ``shape``: mostly row-major, sometimes strided (a permutation's)."""
    dtype = data.draw(st.sampled_from(dtypes))
    if len(shape) > 1 and data.draw(st.integers(0, 4)) == 0:
        order = data.draw(st.permutations(range(len(shape))))
        base = torch.empty([shape[i] for i in order], dtype=dtype, device="meta")
        return base.permute([order.index(i) for i in range(len(shape))])
    return torch.empty(shape, dtype=dtype, device="meta")


def shape(data: st.DataObject, least: int = 0, most: int = 4, low: int = 0) -> tuple[int, ...]:
    rank = data.draw(st.integers(least, most))
    return tuple(data.draw(st.lists(st.integers(low, 4), min_size=rank, max_size=rank)))


def one(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (meta(data, shape(data), DTYPES),), {}


def activation(*extra: str) -> Draw:
    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if data.draw(st.booleans()):
            kwargs["inplace"] = data.draw(st.booleans())
        for name in extra:
            if data.draw(st.booleans()):
                kwargs[name] = data.draw(st.sampled_from([0.1, 2, -1.0]))
        return (meta(data, shape(data), DTYPES),), kwargs

    return draw


def gelu(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    kwargs = {"approximate": data.draw(st.sampled_from(["none", "tanh", "bad"]))}
    return (meta(data, shape(data), DTYPES),), kwargs if data.draw(st.booleans()) else {}


def operand(data: st.DataObject, like: tuple[int, ...]) -> Any:
    kind = data.draw(st.sampled_from(["same", "broadcast", "other", "scalar", "zero-dim"]))
    if kind == "scalar":
        return data.draw(st.sampled_from([2, -1, 0.5, True, 3.0]))
    if kind == "zero-dim":
        return meta(data, (), DTYPES)
    if kind == "other":
        return meta(data, shape(data), DTYPES)
    dims = list(like)
    if kind == "broadcast":
        dims = [1 if data.draw(st.booleans()) else n for n in dims][data.draw(st.integers(0, 2)) :]
    return meta(data, tuple(dims), DTYPES)


def binary(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    first = meta(data, shape(data), DTYPES)
    second = operand(data, tuple(first.shape))
    kwargs = {"alpha": data.draw(st.sampled_from([1, 2]))} if data.draw(st.booleans()) else {}
    return (first, second), kwargs


def dunder(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    first = meta(data, shape(data), DTYPES)
    return (first, operand(data, tuple(first.shape))), {}


def divide(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    (a, b), _ = dunder(data)
    mode = data.draw(st.sampled_from([None, None, "floor", "trunc"]))
    return (a, b), {"rounding_mode": mode} if mode or data.draw(st.booleans()) else {}


def outer(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    dtypes = [torch.float32, torch.float32, torch.int64, torch.bool]
    first = meta(data, shape(data, 1, 2), dtypes)
    return (first, meta(data, shape(data, 1, 2), dtypes)), {}


def to(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data), DTYPES)
    dtype = data.draw(st.sampled_from(DTYPES))
    how = data.draw(st.sampled_from(["arg", "kwarg", "copy"]))
    if how == "arg":
        return (x, dtype), {}
    return (x,), {"dtype": dtype} | ({"copy": True} if how == "copy" else {})


def repeat_interleave(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data), DTYPES)
    repeats = data.draw(st.integers(-1, 3))
    dim = data.draw(st.one_of(st.none(), st.integers(-4, 3)))
    return (x, repeats), {"dim": dim} if dim is not None or data.draw(st.booleans()) else {}


def softmax(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data), DTYPES)
    dim = data.draw(st.one_of(st.none(), st.integers(-5, 4)))
    return (x,), {"dim": dim} if dim is not None or data.draw(st.booleans()) else {}


def method_softmax(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (meta(data, shape(data), DTYPES), data.draw(st.integers(-5, 4))), {}


def dropout(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data), DTYPES)
    p = data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, -0.1, 1.5]))
    training, inplace = data.draw(st.booleans()), data.draw(st.booleans())
    return (x, p, training), {"inplace": inplace} if inplace else {}


def affine(data: st.DataObject, sizes: tuple[int, ...], dtype: torch.dtype) -> Any:
    kind = data.draw(st.sampled_from(["none", "right", "right", "wrong", "dtype"]))
    if kind == "none":
        return None
    if kind == "wrong":
        return meta(data, (*sizes, 2) if sizes else (3,), [dtype])
    return meta(data, sizes, [dtype] if kind == "right" else FLOATS)


def layer_norm(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data, 1, 4, 1), DTYPES)
    k = data.draw(st.integers(1, max(x.dim(), 1)))
    sizes = tuple(x.shape[x.dim() - k :]) if data.draw(st.integers(0, 4)) else (5,)
    return (x, sizes, affine(data, sizes, x.dtype), affine(data, sizes, x.dtype)), {}


def batch_norm(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data, 1, 5, 1), DTYPES)
    if x.dim() == 4 and data.draw(st.integers(0, 3)) == 0:  # (channels-last)
        x = x.contiguous(memory_format=torch.channels_last)
    c = (x.shape[1],) if x.dim() > 1 else (1,)
    stats = [affine(data, c, x.dtype) for _ in range(2)]
    training = data.draw(st.booleans())
    kwargs = {"training": training, "momentum": 0.1, "eps": 1e-5}
    return (x, *stats, affine(data, c, x.dtype), affine(data, c, x.dtype)), kwargs


def rms_norm(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args, _ = layer_norm(data)
    return args[:3], {"eps": data.draw(st.sampled_from([None, 1e-6]))}


def group_norm(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data, 1, 4, 1), DTYPES)
    groups = data.draw(st.integers(1, 4))
    c = (x.shape[1],) if x.dim() > 1 else (1,)
    return (x, groups, affine(data, c, x.dtype), affine(data, c, x.dtype)), {}


def linear(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data, 0, 4, 0), FLOATS)
    features = x.shape[-1] if x.dim() and data.draw(st.integers(0, 5)) else 3
    out = data.draw(st.integers(0, 4))
    w = meta(data, (out, features), [x.dtype] if data.draw(st.integers(0, 5)) else FLOATS)
    b = affine(data, (out,), x.dtype)
    return (x, w, b) if b is not None or data.draw(st.booleans()) else (x, w), {}


def attention(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    batch = shape(data, 0, 2, 1)
    length, keys, e, ev = (data.draw(st.integers(1, 4)) for _ in range(4))
    dtype = data.draw(st.sampled_from(FLOATS))
    q = meta(data, (*batch, length, e), [dtype])
    k = meta(data, (*batch, keys, e if data.draw(st.integers(0, 5)) else e + 1), [dtype])
    v = meta(data, (*batch, keys, ev), [dtype])
    kwargs = {"is_causal": data.draw(st.booleans()), "dropout_p": 0.1}
    return (q, k, v), kwargs


def conv(rank: int) -> Draw:
    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        batched = data.draw(st.booleans())
        groups = data.draw(st.sampled_from([1, 1, 2]))
        c_in = groups * data.draw(st.integers(1, 2))
        spatial = tuple(data.draw(st.integers(1, 6)) for _ in range(rank))
        x = meta(data, (2, c_in, *spatial) if batched else (c_in, *spatial), FLOATS)
        kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(rank))
        c_out = groups * data.draw(st.integers(1, 2))
        w = meta(data, (c_out, c_in // groups + data.draw(st.sampled_from([0, 0, 0, 1])), *kernel))
        w = w.to(x.dtype) if data.draw(st.integers(0, 5)) else w
        kwargs = {
            "stride": data.draw(st.integers(1, 2)),
            "padding": data.draw(st.sampled_from([0, 1, "same", "valid", (1,) * rank])),
            "dilation": data.draw(st.integers(1, 2)),
            "groups": groups,
        }
        return (x, w, affine(data, (c_out,), x.dtype)), kwargs

    return draw


def conv_transpose(rank: int) -> Draw:
    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        batched = data.draw(st.booleans())
        groups = data.draw(st.sampled_from([1, 1, 2]))
        c_in = groups * data.draw(st.integers(1, 2)) + data.draw(st.sampled_from([0, 0, 0, 1]))
        spatial = tuple(data.draw(st.integers(1, 5)) for _ in range(rank))
        x = meta(data, (2, c_in, *spatial) if batched else (c_in, *spatial), FLOATS)
        kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(rank))
        c_out = data.draw(st.integers(1, 2))
        w = meta(data, (groups * data.draw(st.integers(1, 2)), c_out, *kernel))
        w = w.to(x.dtype) if data.draw(st.integers(0, 5)) else w
        kwargs = {
            "stride": data.draw(st.sampled_from([1, 2, (2,) * rank])),
            "padding": data.draw(st.sampled_from([0, 1, 2, (1,) * rank])),
            "output_padding": data.draw(st.sampled_from([0, 0, 1, (1,) * rank])),
            "dilation": data.draw(st.integers(1, 2)),
            "groups": groups,
        }
        return (x, w, affine(data, (c_out * groups,), x.dtype)), kwargs

    return draw


def recurrent(gates: int, cell: bool) -> Draw:
    """``torch.lstm`` / ``gru`` / ``rnn_*`` as torch.nn's layers call them, a weight or a
    state of the wrong size now and then."""

    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        layers, directions = data.draw(st.integers(1, 2)), data.draw(st.sampled_from([1, 2]))
        batch_first, bias = data.draw(st.booleans()), data.draw(st.booleans())
        steps, batch, features = (data.draw(st.integers(1, 4)) for _ in range(3))
        hidden = data.draw(st.integers(2, 4))
        proj = data.draw(st.integers(0, hidden - 1)) if cell else 0
        out_size = proj or hidden
        dtype = data.draw(st.sampled_from(FLOATS))

        def new(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device="meta")

        x = meta(
            data, (batch, steps, features) if batch_first else (steps, batch, features), [dtype]
        )
        weights = []
        for layer in range(layers):
            for _ in range(directions):
                inputs = features if layer == 0 else directions * out_size
                weights += [new(gates * hidden, inputs), new(gates * hidden, out_size)]
                weights += [new(gates * hidden) for _ in range(2 * bias)]
                weights += [new(out_size, hidden)] if proj else []
        if data.draw(st.integers(0, 5)) == 0:  # a weight of another size
            at = data.draw(st.integers(0, len(weights) - 1))
            weights[at] = new(*(n + 1 for n in weights[at].shape))
        wrong = data.draw(st.integers(0, 7)) == 0  # a state of another size
        h0 = new(layers * directions, batch + wrong, out_size)
        hx: Any = (h0, new(layers * directions, batch, hidden)) if cell else h0
        flags = (bias, layers, 0.0, data.draw(st.booleans()), directions == 2, batch_first)
        return (x, hx, weights, *flags), {}

    return draw


def max_pool(rank: int) -> Draw:
    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = meta(data, shape(data, rank + 1, rank + 2, 1), FLOATS)
        kwargs = {
            "kernel_size": data.draw(st.integers(1, 3)),
            "stride": data.draw(st.sampled_from([None, 1, 2])),
            "padding": data.draw(st.integers(0, 1)),
            "dilation": data.draw(st.integers(1, 2)),
            "ceil_mode": data.draw(st.booleans()),
        }
        return (x,), kwargs

    return draw


def adaptive(rank: int) -> Draw:
    def draw(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = meta(data, shape(data, rank + 1, rank + 2, 0), FLOATS)
        size = data.draw(
            st.one_of(
                st.integers(0, 3),
                st.tuples(*[st.one_of(st.none(), st.integers(1, 3))] * rank),
            )
        )
        return (x, size), {}

    return draw


def cat(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    first = shape(data, 0, 3)
    parts = []
    for _ in range(data.draw(st.integers(1, 3))):
        dims = list(first)
        if dims and data.draw(st.booleans()):
            dims[data.draw(st.integers(0, len(dims) - 1))] = data.draw(st.integers(0, 3))
        parts.append(meta(data, tuple(dims), [torch.float32, torch.float32, torch.int64]))
    return (parts,), {"dim": data.draw(st.integers(-4, 3))}


def arange(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = tuple(data.draw(st.lists(st.integers(-6, 6), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from([None, torch.float32, torch.int32, torch.bool]))
    return args, {"device": "meta"} | ({"dtype": dtype} if dtype else {})


def embedding(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    idx = meta(data, shape(data, 0, 3), [torch.int64, torch.int32, torch.float32])
    w = meta(data, (data.draw(st.integers(1, 5)), data.draw(st.integers(0, 3))), FLOATS)
    pad = data.draw(st.sampled_from([None, None, 0, -1, 7]))
    return (idx, w), {"padding_idx": pad} if pad is not None else {}


def reduction(data: st.DataObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = meta(data, shape(data), DTYPES)
    dim = data.draw(
        st.one_of(st.none(), st.integers(-5, 4), st.lists(st.integers(-4, 3), max_size=3))
    )
    kwargs = {"keepdim": data.draw(st.booleans())} if data.draw(st.booleans()) else {}
    return (x,), kwargs | ({"dim": dim} if dim is not None or data.draw(st.booleans()) else {})


UNARY = ("cos", "sin", "exp", "rsqrt", "sqrt", "log")

#: function -> how its inputs are drawn
CASES: dict[Any, Draw] = {
    F.relu: activation(),
    F.silu: activation(),
    F.hardswish: activation(),
    F.mish: activation(),
    F.relu6: activation(),
    F.elu: activation("alpha"),
    F.leaky_relu: activation("negative_slope"),
    torch.relu: one,
    torch.Tensor.relu: one,
    torch.sigmoid: one,
    torch.Tensor.sigmoid: one,
    torch.tanh: one,
    torch.Tensor.tanh: one,
    **{f: one for n in UNARY for f in (getattr(torch, n), getattr(torch.Tensor, n))},
    torch.neg: one,
    torch.Tensor.neg: one,
    torch.Tensor.__neg__: one,
    torch.pow: dunder,
    torch.Tensor.pow: dunder,
    torch.Tensor.__pow__: dunder,
    torch.Tensor.__rpow__: dunder,
    torch.div: divide,
    torch.Tensor.div: divide,
    torch.outer: outer,
    torch.Tensor.to: to,
    torch.Tensor.repeat_interleave: repeat_interleave,
    torch.repeat_interleave: repeat_interleave,
    F.gelu: gelu,
    torch.add: binary,
    torch.Tensor.add: binary,
    torch.sub: binary,
    torch.Tensor.sub: binary,
    torch.mul: dunder,
    torch.Tensor.mul: dunder,
    torch.Tensor.__add__: dunder,
    torch.Tensor.__radd__: dunder,
    torch.Tensor.__sub__: dunder,
    torch.Tensor.__rsub__: dunder,
    torch.Tensor.__mul__: dunder,
    torch.Tensor.__rmul__: dunder,
    torch.Tensor.__truediv__: dunder,
    F.softmax: softmax,
    torch.Tensor.softmax: method_softmax,
    F.dropout: dropout,
    F.layer_norm: layer_norm,
    F.batch_norm: batch_norm,
    F.rms_norm: rms_norm,
    F.group_norm: group_norm,
    F.linear: linear,
    F.scaled_dot_product_attention: attention,
    F.conv1d: conv(1),
    F.conv2d: conv(2),
    F.conv3d: conv(3),
    F.conv_transpose1d: conv_transpose(1),
    F.conv_transpose2d: conv_transpose(2),
    F.conv_transpose3d: conv_transpose(3),
    F.max_pool1d: max_pool(1),
    F.max_pool2d: max_pool(2),
    F.max_pool3d: max_pool(3),
    torch.lstm: recurrent(4, cell=True),
    torch.gru: recurrent(3, cell=False),
    torch.rnn_tanh: recurrent(1, cell=False),
    torch.rnn_relu: recurrent(1, cell=False),
    F.adaptive_avg_pool1d: adaptive(1),
    F.adaptive_avg_pool2d: adaptive(2),
    F.adaptive_avg_pool3d: adaptive(3),
    torch.cat: cat,
    torch.arange: arange,
    F.embedding: embedding,
    torch.mean: reduction,
    torch.Tensor.mean: reduction,
    torch.sum: reduction,
    torch.Tensor.sum: reduction,
}


def _name(func: Any) -> str:
    return f"{getattr(func, '__module__', None) or 'Tensor'}.{func.__name__}"


def test_every_answered_function_has_a_row() -> None:
    from lazynn._rehearsal import formulas

    assert set(formulas._FORMULAS) == set(CASES)


def _run(func: Any, args: Any, kwargs: Any, fast: bool) -> tuple[Any, Any, list[Any]]:
    """(output, error, warnings) of the call under the rehearsal's device mode."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            with torch.no_grad(), MetaDevice(fast=fast):
                return func(*args, **kwargs), None, warned
        except Exception as error:  # (compared with torch's below)
            return None, error, warned


@pytest.mark.parametrize("dims", [2, 3, 4, 5])
def test_the_batch_norm_formula_gives_the_kernels_strides_for_every_dense_layout(
    dims: int,
) -> None:
    """(Found by hypothesis in CI.) Each layout of small shapes, size-1 dimensions included,
    that F.batch_norm takes: where the formula answers, the strides are the kernel's (a
    (1, 2) input with strides (1, 1) gives (2, 1); a (1, C, 1, 1, 1) channels-last one gives
    row-major strides, where a 4-d one keeps its own)."""
    sizes = [1, 2, 3]
    for shape in itertools.product(sizes, repeat=dims):
        for order in itertools.permutations(range(dims)):
            base = torch.empty([shape[i] for i in order], device="meta")
            t = base.permute([order.index(i) for i in range(dims)])
            mean = torch.empty(shape[1], device="meta")
            args = (t, mean, mean.clone())
            with torch.no_grad():
                answered = answer(F.batch_norm, args, {"training": False})
            if answered is None:
                continue
            expected, refused, _ = _run(F.batch_norm, args, {"training": False}, fast=False)
            assert refused is None, (shape, t.stride())
            assert answered.stride() == expected.stride(), (shape, t.stride())


@pytest.mark.parametrize("func", list(CASES), ids=_name)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_formula_gives_what_torchs_meta_kernel_gives(func: Any, data: st.DataObject) -> None:
    args, kwargs = CASES[func](data)
    with torch.no_grad():
        answered = answer(func, args, kwargs)
    expected, refused, warned = _run(func, args, kwargs, fast=False)
    got, raised, _ = _run(func, args, kwargs, fast=True)
    # (torch's warnings: a formula answers no call torch warns of; torch warns some only once)
    assert answered is None or not warned, [str(w.message) for w in warned]
    if refused is not None:  # torch refuses it: the formula leaves it to torch's kernel
        assert answered is None, f"answered an input torch refuses: {refused!r}"
        assert type(raised) is type(refused)
        assert str(raised) == str(refused)
        return
    assert raised is None, raised
    wants = expected if isinstance(expected, tuple) else (expected,)  # (a recurrent layer's)
    for answer_or_got in (got, answered) if answered is not None else (got,):
        outs = answer_or_got if isinstance(answer_or_got, tuple) else (answer_or_got,)
        assert len(outs) == len(wants)
        for out, want in zip(outs, wants, strict=True):
            assert (out.shape, out.dtype, out.stride()) == (
                want.shape,
                want.dtype,
                want.stride(),
            ), (args, kwargs)
            assert out.device.type == "meta"
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            assert any(out is a for a in inputs) == any(want is a for a in inputs)
    if answered is not None and func in FLOPS:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            func(*args, **kwargs)
        assert flops(func, answered, args, kwargs)[1] == counter.get_total_flops()


#: the recurrent kernels: torch's CPU LSTM crashes the process on some inputs the rows draw
#: (compared with the meta kernel only, above)
RECURRENT = {torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu}
#: what the CPU kernels refuse and another device's accept (mixed dtypes in the norms: CUDA
#: takes float weights with a half input; the CPU's max_pool3d takes two memory formats
#: only): left to the meta kernel (kernel_checks.py)
DEVICE_SPECIFIC = {F.layer_norm, F.group_norm, F.rms_norm, F.batch_norm, F.max_pool3d}


#: refusals of values (the CPU call's ones), which no meta run can see
VALUE_DEPENDENT = ("out of DATA bounds", "index out of range")


def _on_cpu(value: Any) -> Any:
    """``value`` with each meta tensor a CPU tensor of its shape, strides and dtype, of ones
    (no value-dependent refusal: an integer division by zero)."""
    if isinstance(value, torch.Tensor):
        cpu = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
        return cpu.fill_(1)
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: "cpu" if k == "device" else _on_cpu(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("func", [f for f in CASES if f not in RECURRENT], ids=_name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_rehearsal_refuses_what_torchs_kernel_refuses(func: Any, data: st.DataObject) -> None:
    """Against the CPU kernel (the meta kernels accept more: a bool subtraction, integer
    activations, a softmax's dimension out of range...): a call it refuses, the rehearsal
    refuses too, with its error where the meta kernel would have accepted it; a call it
    accepts, the rehearsal accepts."""
    args, kwargs = CASES[func](data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            func(*_on_cpu(args), **_on_cpu(kwargs))
            cpu_error = None
        except Exception as error:
            cpu_error = error
        _, meta_error, _ = _run(func, args, kwargs, fast=False)
    _, raised, _ = _run(func, args, kwargs, fast=True)
    if cpu_error is not None and any(v in str(cpu_error) for v in VALUE_DEPENDENT):
        return  # (ones as indices, out of a table of one row: the values' fault, not shapes')
    if cpu_error is None:  # (or the meta kernel's own refusal: a 1-D transposed convolution
        # of an empty output, which the CPU's batched kernel gives and meta refuses)
        assert raised is None or meta_error is not None, (raised, args, kwargs)
        return
    if func in DEVICE_SPECIFIC and meta_error is None:
        return
    assert raised is not None, f"accepted what torch refuses: {cpu_error!r}"
    if meta_error is None:  # (refused by the rehearsal's checks: in torch's words)
        assert (type(raised), str(raised)) == (type(cpu_error), str(cpu_error))


@pytest.mark.parametrize(
    ("func", "args"),
    [
        (F.relu, (torch.empty(2, 3),)),  # a real tensor
        (torch.Tensor.__add__, (torch.empty(2, 3, device="meta"), torch.tensor(1.0))),
        (F.relu, (torch.empty(2, 3, device="meta", dtype=torch.int64),)),
        (F.relu, (torch.empty(3, 2, device="meta").t(),)),  # strided: torch's strides rule
    ],
)
def test_what_a_formula_is_not_sure_of_is_left_to_torch(func: Any, args: Any) -> None:
    assert answer(func, args, {}) is None


def test_inside_a_functorch_transform_nothing_is_answered() -> None:
    x = torch.empty(4, 3, device="meta")
    seen = []

    def f(row: torch.Tensor) -> torch.Tensor:
        seen.append(answer(torch.relu, (row,), {}))
        return torch.relu(row)

    torch.func.vmap(f)(x)
    assert seen == [None]


def test_a_fresh_process_building_and_summarizing_imports_no_compiler() -> None:
    """torch.nn layers and the common functions, built (both forms) and summarized: neither
    torch._dynamo nor sympy is imported (torch's Python meta kernels import them). Not
    covered: a model the user constructs under ``torch.device("meta")`` (torch's own
    ``normal_`` on meta imports them, before lazynn runs), and the layers and functions
    without a formula (``matmul`` of some shapes, ``avg_pool``, ``interpolate``, a packed
    sequence's recurrent layer...) whose meta kernels are Python references."""
    code = textwrap.dedent(
        """
        import sys
        import torch
        from torch import nn
        import torch.nn.functional as F
        import lazynn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Sequential(
                    lazynn.LazyConv2d(8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                    nn.MaxPool2d(2), lazynn.LazyConvTranspose2d(8, 2, stride=2),
                    nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.GroupNorm(2, 8), nn.SiLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                )
                self.emb = nn.Embedding(10, 8)
                self.rnn = lazynn.LazyLSTM(8)
                self.norm = nn.LayerNorm(8)
                self.fc = lazynn.LazyLinear(16)
                self.head = nn.Sequential(nn.GELU(), nn.Dropout(0.1), lazynn.LazyLinear(4))

            def forward(self, x):
                t = torch.arange(4, device=x.device)
                h = self.conv(x) + self.rnn(self.emb(t)[:, None])[0].mean((0, 1))
                q = self.fc(self.norm(h)).view(-1, 2, 2, 4).transpose(1, 2)
                a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
                y = torch.cat([a.transpose(1, 2).reshape(-1, 16), h * 2], dim=-1)
                return F.softmax(self.head(y), dim=-1)

        built = lazynn.build(Net(), (2, 3, 16, 16))
        assert built(torch.randn(2, 3, 16, 16)).shape == (2, 4)
        lazynn.build(Net, (2, 3, 16, 16))
        lazynn.summary(Net(), (2, 3, 16, 16))
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


@pytest.mark.parametrize(
    ("func", "args", "kwargs"),
    [
        (torch.rsub, ("mask", 1), {}),
        (torch.sub, (), {"input": "mask", "other": 1}),
        (torch.Tensor.sub, ("mask",), {"other": 1}),
        (torch.relu_, ("mask",), {}),
        (F.log_softmax, ("long",), {"dim": 1}),
        (torch.Tensor.log_softmax, ("long", 1), {}),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v),
)
def test_the_rehearsal_refuses_in_torchs_words_however_the_call_is_written(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Keyword arguments, in-place and log variants of what the checks refuse."""
    made = {
        "mask": lambda device: torch.ones(2, 3, dtype=torch.bool, device=device),
        "long": lambda device: torch.ones(2, 3, dtype=torch.long, device=device),
    }

    def call(device: str) -> Any:
        a = tuple(made[v](device) if v in made else v for v in args)
        k = {
            n: made[v](device) if isinstance(v, str) and v in made else v for n, v in kwargs.items()
        }
        return func(*a, **k)

    with pytest.raises((RuntimeError, NotImplementedError)) as torch_s:
        call("cpu")
    with pytest.raises(type(torch_s.value)) as ours, torch.no_grad(), MetaDevice(fast=True):
        call("meta")
    assert str(ours.value) == str(torch_s.value)
