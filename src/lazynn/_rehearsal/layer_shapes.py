"""torch.nn's layers' output shapes by formula (linear, convolution and its transpose,
pooling, attention, embedding, the recurrent layers), and the checks every formula of the
rehearsal shares (``formulas.py`` is the table; its module doc says when a formula answers).

A check that fails raises :class:`Unsure`: the formula is not sure of torch's answer, and
torch's kernel runs (and raises its own error for an input it refuses).

>>> import torch
>>> x, w = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
>>> LAYERS[torch.nn.functional.conv2d](x, w, None, 2, 1).shape
torch.Size([2, 4, 4, 4])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "FLOATS",
    "FLOPS",
    "LAYERS",
    "NUMBER",
    "Unsure",
    "check",
    "dim_index",
    "empty",
    "floating",
    "like",
    "plain_meta",
    "row_major",
]

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_PLAIN = frozenset({Tensor, torch.nn.Parameter})
NUMBER = (bool, int, float)
_aten = torch.ops.aten


class Unsure(Exception):
    """The formula is not sure of torch's answer: torch's kernel runs."""


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def plain_meta(t: object) -> Tensor:
    """``t``, a plain meta tensor (else: unsure)."""
    if not isinstance(t, Tensor) or type(t) not in _PLAIN or not t.is_meta:
        raise Unsure
    return t


def row_major(t: object) -> Tensor:
    """``t``, a plain meta tensor with row-major strides (else: unsure)."""
    tensor = plain_meta(t)
    if tensor.stride() != _row_major(tensor.shape):
        raise Unsure
    return tensor


def floating(t: object, strided: bool = False) -> Tensor:
    """``t``, a plain meta tensor of a floating dtype, row-major unless ``strided``."""
    tensor = plain_meta(t) if strided else row_major(t)
    if tensor.dtype not in FLOATS:
        raise Unsure
    return tensor


def _strides_in(shape: Sequence[int], memory_format: torch.memory_format) -> tuple[int, ...]:
    """The strides of a tensor of ``shape`` in ``memory_format``."""
    return tuple(torch.empty(shape, device="meta", memory_format=memory_format).stride())


def empty(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def like(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def check(condition: bool) -> None:
    if not condition:
        raise Unsure


def dim_index(dim: object, rank: int) -> int:
    bound = max(rank, 1)
    if type(dim) is not int or not -bound <= dim < bound:
        raise Unsure
    return dim % bound


# --- layers with weights, pooling ------------------------------------------------------------
def _linear(t: Any, weight: Any, bias: Any = None) -> Tensor:
    # (any strides: the output is a matrix product's, row-major)
    t, weight = floating(t, strided=True), row_major(weight)
    check(t.dim() >= 1 and weight.dim() == 2 and weight.dtype == t.dtype)
    check(t.shape[-1] == weight.shape[1])
    out = weight.shape[0]
    check(bias is None or (row_major(bias).shape == (out,) and bias.dtype == t.dtype))
    return empty((*t.shape[:-1], out), t.dtype)


def _linear_flops(out: Tensor, t: Tensor, weight: Tensor, bias: Any = None) -> tuple[Any, int]:
    rows = math.prod(t.shape[:-1])
    return (_aten.addmm if bias is not None else _aten.mm), 2 * rows * t.shape[-1] * out.shape[-1]


def _attention(
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: Any = 0.0,
    is_causal: Any = False,
    scale: Any = None,
    enable_gqa: Any = False,
) -> Tensor:
    # (any strides: on meta torch runs the math kernel, whose output is row-major)
    q, k, v = floating(q, True), floating(k, True), floating(v, True)
    check(attn_mask is None and not enable_gqa and type(is_causal) is bool)
    check(isinstance(dropout_p, NUMBER) and (scale is None or isinstance(scale, NUMBER)))
    check(q.dim() >= 2 and q.dim() == k.dim() == v.dim() and q.dtype == k.dtype == v.dtype)
    check(q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and k.shape[-2] == v.shape[-2])
    check(q.shape[-1] == k.shape[-1] and q.numel() > 0 and k.numel() > 0 and v.numel() > 0)
    return empty((*q.shape[:-1], v.shape[-1]), q.dtype)


def _attention_flops(out: Tensor, q: Tensor, k: Tensor, v: Tensor, *_: Any, **__: Any) -> Any:
    # (on meta torch runs the math kernel: two batched matmuls, q @ k^T and the weights @ v)
    batch, length, keys = math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2]
    return _aten.bmm, 2 * batch * length * keys * (q.shape[-1] + v.shape[-1])


def _expand(value: Any, rank: int, least: int) -> tuple[int, ...]:
    """A convolution's stride, padding or dilation as ``rank`` ints of at least ``least``."""
    values = (value,) * rank if type(value) is int else tuple(value)
    if len(values) == 1:
        values = values * rank
    check(len(values) == rank and all(type(v) is int and v >= least for v in values))
    return values


def _convolved(
    t: Any, weight: Any, bias: Any, groups: Any, rank: int, transposed: bool
) -> tuple[Tensor, int]:
    """A convolution's checked input, and its output channels. The weight is (out, in /
    groups, *kernel); transposed, (in, out / groups, *kernel)."""
    t, weight = floating(t), row_major(weight)
    check(t.dim() in (rank + 1, rank + 2) and weight.dim() == rank + 2)
    check(weight.dtype == t.dtype and type(groups) is int and groups > 0)
    if transposed:
        out_channels = weight.shape[1] * groups
        check(t.shape[-rank - 1] == weight.shape[0] and weight.shape[0] % groups == 0)
    else:
        out_channels = weight.shape[0]
        check(t.shape[-rank - 1] == weight.shape[1] * groups and out_channels % groups == 0)
    check(t.numel() > 0 and weight.numel() > 0)
    check(bias is None or (row_major(bias).shape == (out_channels,) and bias.dtype == t.dtype))
    return t, out_channels


def _conv(rank: int) -> Callable[..., Tensor]:
    def formula(
        t: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: Any = 1,
    ) -> Tensor:
        t, out_channels = _convolved(t, weight, bias, groups, rank, transposed=False)
        kernel = weight.shape[2:]
        strides, dilations = _expand(stride, rank, 1), _expand(dilation, rank, 1)
        spatial = t.shape[-rank:]
        if padding == "same":
            check(strides == (1,) * rank)
            # (an odd total padding: torch warns of a padded copy; its kernel answers)
            check(all(d * (k - 1) % 2 == 0 for d, k in zip(dilations, kernel, strict=True)))
            sizes = tuple(spatial)
        else:
            pads = _expand(0 if padding == "valid" else padding, rank, 0)
            sizes = tuple(
                (n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, p, d, k, s in zip(spatial, pads, dilations, kernel, strides, strict=True)
            )
            reach = zip(spatial, pads, dilations, kernel, strict=True)
            check(all(n + 2 * p >= d * (k - 1) + 1 for n, p, d, k in reach))
        check(all(n > 0 for n in sizes))
        return empty((*t.shape[: -rank - 1], out_channels, *sizes), t.dtype)

    return formula


def _conv_transpose(rank: int) -> Callable[..., Tensor]:
    def formula(
        t: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: Any = 1,
        dilation: Any = 1,
    ) -> Tensor:
        t, out_channels = _convolved(t, weight, bias, groups, rank, transposed=True)
        kernel = weight.shape[2:]
        strides, dilations = _expand(stride, rank, 1), _expand(dilation, rank, 1)
        pads, extra = _expand(padding, rank, 0), _expand(output_padding, rank, 0)
        # (torch: "output padding must be smaller than either stride or dilation")
        check(all(e < s or e < d for e, s, d in zip(extra, strides, dilations, strict=True)))
        sizes = tuple(
            (n - 1) * s - 2 * p + d * (k - 1) + e + 1
            for n, s, p, d, k, e in zip(
                t.shape[-rank:], strides, pads, dilations, kernel, extra, strict=True
            )
        )
        check(all(n > 0 for n in sizes))
        return empty((*t.shape[: -rank - 1], out_channels, *sizes), t.dtype)

    return formula


def _conv_flops(transposed: bool) -> Callable[..., tuple[Any, int]]:
    # (FlopCounterMode's conv_flop_count of aten.convolution: an unbatched input is batched;
    # over the output's positions, or, transposed, the input's)
    def count(out: Tensor, t: Tensor, weight: Tensor, *_: Any, **__: Any) -> Any:
        rank = weight.dim() - 2
        batch = t.shape[0] if t.dim() == rank + 2 else 1
        positions = math.prod((t if transposed else out).shape[-rank:])
        return _aten.convolution, 2 * batch * math.prod(weight.shape) * positions

    return count


def _pooled(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """ATen's ``pooling_output_shape``."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _spatial(t: Tensor, rank: int) -> tuple[int, ...]:
    """An image-like input's spatial sizes: batched or not, none of them or its channels 1
    (where row-major strides are also channels-last ones, torch's choice is not sure)."""
    check(t.dim() in (rank + 1, rank + 2) and t.numel() > 0)
    check(all(n > 1 for n in t.shape[-rank - 1 :]) or rank == 1)
    return tuple(t.shape[-rank:])


def _max_pool(rank: int) -> Callable[..., Tensor]:
    def formula(
        t: Any,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: Any = False,
        return_indices: Any = False,
    ) -> Tensor:
        t = floating(t)
        spatial = _spatial(t, rank)
        check(return_indices is False and type(ceil_mode) is bool)
        kernel = _expand(kernel_size, rank, 1)
        strides = kernel if stride is None or stride == [] else _expand(stride, rank, 1)
        pads, dilations = _expand(padding, rank, 0), _expand(dilation, rank, 1)
        check(all(p <= k // 2 for p, k in zip(pads, kernel, strict=True)))
        sizes = tuple(
            _pooled(*a, ceil_mode)
            for a in zip(spatial, kernel, strides, pads, dilations, strict=True)
        )
        check(all(n > 0 for n in sizes))
        return empty((*t.shape[:-rank], *sizes), t.dtype)

    return formula


def _adaptive_pool(rank: int) -> Callable[..., Tensor]:
    def formula(t: Any, output_size: Any) -> Tensor:
        t = floating(t)
        _spatial(t, rank)
        sizes = (output_size,) * rank if type(output_size) is int else tuple(output_size)
        check(len(sizes) == rank and (rank > 1 or None not in sizes))
        kept = tuple(t.shape[-rank + i] if s is None else s for i, s in enumerate(sizes))
        check(all(type(s) is int and s >= 0 for s in kept))
        return empty((*t.shape[:-rank], *kept), t.dtype)

    return formula


def _embedding(
    t: Any,
    weight: Any,
    padding_idx: Any = None,
    max_norm: Any = None,
    norm_type: Any = 2.0,
    scale_grad_by_freq: Any = False,
    sparse: Any = False,
) -> Tensor:
    # (any strides of the indices: the output is an index_select's, row-major)
    t, weight = plain_meta(t), floating(weight)
    check(t.dtype in (torch.int64, torch.int32) and weight.dim() == 2 and max_norm is None)
    check(padding_idx is None or (type(padding_idx) is int and abs(padding_idx) < weight.shape[0]))
    check(padding_idx is None or padding_idx >= -weight.shape[0])
    return empty((*t.shape, weight.shape[1]), weight.dtype)


def _recurrent(gates: int, cell: bool) -> Callable[..., tuple[Tensor, ...]]:
    """``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` as ``nn.LSTM``/``GRU``/``RNN``
    call them on a padded input (``_VF.lstm(input, hx, weights, has_biases, num_layers,
    dropout, train, bidirectional, batch_first)``; a packed sequence's form is left to torch):
    the output, then the last hidden state (and, for an LSTM, the last cell state)."""

    def formula(
        t: Any,
        hx: Any,
        weights: Any,
        has_biases: Any,
        num_layers: Any,
        dropout: Any,
        train: Any,
        bidirectional: Any,
        batch_first: Any,
    ) -> tuple[Tensor, ...]:
        t = floating(t)
        flags = (has_biases, train, bidirectional, batch_first)
        check(t.dim() == 3 and t.numel() > 0 and all(type(f) is bool for f in flags))
        check(type(num_layers) is int and num_layers > 0 and isinstance(dropout, NUMBER))
        states = tuple(hx) if cell and isinstance(hx, (tuple, list)) else (hx,)
        check(len(states) == (2 if cell else 1) and isinstance(weights, (tuple, list)))
        layers, directions = num_layers, 2 if bidirectional else 1
        batch, steps, features = (
            (t.shape[0], t.shape[1], t.shape[2])
            if batch_first
            else (t.shape[1], t.shape[0], t.shape[2])
        )
        h0 = row_major(states[0])
        check(h0.dim() == 3 and h0.shape[:2] == (layers * directions, batch))
        out_size = h0.shape[2]
        hidden = row_major(states[-1]).shape[2] if cell and states[-1].dim() == 3 else out_size
        check(states[-1].shape == (layers * directions, batch, hidden))
        each, left = divmod(len(weights), layers * directions)
        projected = each - 2 - 2 * has_biases
        check(left == 0 and projected in ((0, 1) if cell else (0,)))
        check(all(s.dtype == t.dtype for s in states) and out_size > 0 and hidden > 0)
        for number, at in enumerate(range(0, len(weights), each)):
            inputs = features if number < directions else directions * out_size
            shapes: list[tuple[int, ...]] = [(gates * hidden, inputs), (gates * hidden, out_size)]
            shapes += [(gates * hidden,)] * (2 * has_biases) + [(out_size, hidden)] * projected
            for w, shape in zip(weights[at : at + each], shapes, strict=True):
                check(row_major(w).shape == shape and w.dtype == t.dtype)
        width = directions * out_size
        if batch_first:  # (torch's kernel runs time-major and hands back a transposed view)
            out = torch.empty_strided(
                (batch, steps, width), (width, batch * width, 1), dtype=t.dtype, device="meta"
            )
        else:
            out = empty((steps, batch, width), t.dtype)
        last = empty((layers * directions, batch, out_size), t.dtype)
        if cell:
            return out, last, empty((layers * directions, batch, hidden), t.dtype)
        return out, last

    return formula


def _recurrent_flops(gates: int) -> Callable[..., tuple[Any, int]]:
    """FlopCounterMode's count of torch's kernel: per layer and direction, the input's
    projection over every step, then each step's hidden (and projection) products."""

    def count(out: tuple[Tensor, ...], t: Tensor, hx: Any, weights: Any, *args: Any) -> Any:
        has_biases, num_layers, _, _, bidirectional, batch_first = args
        directions = 2 if bidirectional else 1
        steps = t.shape[1] if batch_first else t.shape[0]
        each = len(weights) // (num_layers * directions)
        total = 0
        for at in range(0, len(weights), each):
            w_ih, w_hh = weights[at], weights[at + 1]
            rows = steps * out[1].shape[1]  # (steps x batch)
            total += 2 * rows * math.prod(w_ih.shape) + 2 * rows * math.prod(w_hh.shape)
            if each - 2 - 2 * has_biases:  # (an LSTM's projection)
                total += 2 * rows * math.prod(weights[at + each - 1].shape)
        return _aten.mm, total

    return count


#: torch.nn's layers' functions -> their formulas
def _batch_norm(
    t: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: Any = False,
    momentum: Any = 0.1,
    eps: Any = 1e-5,
) -> Tensor:
    # (F.batch_norm's own checks come after a function mode's turn: a batch of one in
    # training, channels the tensors do not have, are left to it, and its words)
    t = floating(t, strided=True)
    check(t.dim() >= 2 and isinstance(training, bool) and isinstance(eps, NUMBER))
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    # (the output's strides are the input's where they are row-major, or channels-last and
    # not row-major too; other strides torch's kernel chooses among, a size-1 dimension's)
    check(
        t.stride() == _row_major(t.shape)
        or (
            t.dim() in formats
            and not t.is_contiguous()
            and t.stride() == _strides_in(t.shape, formats[t.dim()])
        )
    )
    channels = t.shape[1]
    check(not training or t.numel() // max(channels, 1) > 1)
    check(training or (running_mean is not None and running_var is not None))
    for tensor in (running_mean, running_var, weight, bias):
        if tensor is not None:
            check(plain_meta(tensor).dtype == t.dtype and tuple(tensor.shape) == (channels,))
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


LAYERS: dict[Any, Callable[..., Tensor | tuple[Tensor, ...]]] = {
    F.linear: _linear,
    F.batch_norm: _batch_norm,
    F.scaled_dot_product_attention: _attention,
    F.embedding: _embedding,
    F.conv1d: _conv(1),
    F.conv2d: _conv(2),
    F.conv3d: _conv(3),
    F.conv_transpose1d: _conv_transpose(1),
    F.conv_transpose2d: _conv_transpose(2),
    F.conv_transpose3d: _conv_transpose(3),
    F.max_pool1d: _max_pool(1),
    F.max_pool2d: _max_pool(2),
    F.max_pool3d: _max_pool(3),
    F.adaptive_avg_pool1d: _adaptive_pool(1),
    F.adaptive_avg_pool2d: _adaptive_pool(2),
    F.adaptive_avg_pool3d: _adaptive_pool(3),
    torch.lstm: _recurrent(4, cell=True),
    torch.gru: _recurrent(3, cell=False),
    torch.rnn_tanh: _recurrent(1, cell=False),
    torch.rnn_relu: _recurrent(1, cell=False),
}

#: the answered functions with FLOPs: function -> (out, *args, **kwargs) -> (aten op, FLOPs),
#: as ``FlopCounterMode`` counts them (only the total is read: the op is the likeliest)
FLOPS: dict[Any, Callable[..., tuple[Any, int]]] = {
    F.linear: _linear_flops,
    F.scaled_dot_product_attention: _attention_flops,
    F.conv1d: _conv_flops(transposed=False),
    F.conv2d: _conv_flops(transposed=False),
    F.conv3d: _conv_flops(transposed=False),
    F.conv_transpose1d: _conv_flops(transposed=True),
    F.conv_transpose2d: _conv_flops(transposed=True),
    F.conv_transpose3d: _conv_flops(transposed=True),
    torch.lstm: _recurrent_flops(4),
    torch.gru: _recurrent_flops(3),
    torch.rnn_tanh: _recurrent_flops(1),
    torch.rnn_relu: _recurrent_flops(1),
}
