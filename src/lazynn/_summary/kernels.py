"""What CPU kernels keep for the backward beyond the shapes of their outputs.

The training estimate (``memory.py``) runs the forward on fake CPU tensors: every kernel is
the one a CPU chooses, and returns outputs of the CPU's shapes, so autograd saves what it
saves on a CPU. Two kernels keep more than their fake (meta) kernels make; :class:`CpuKernels`,
a dispatch mode over the fake tensors, gives their outputs the CPU's sizes:

- ``aten.mkldnn_rnn_layer``, oneDNN's LSTM (``nn.LSTM`` on a CPU in float32, or bfloat16
  where the CPU has it, when oneDNN is on: torch's default), called once per layer and
  direction: it returns a *workspace* (the gates and states of every step, and room for the
  backward's), which the fake kernel returns empty. Its size is oneDNN 3's
  (:func:`lstm_workspace`).
- ``aten._embedding_bag`` on a CPU, mode ``mean`` or ``max`` (or ``sum`` off its fast path):
  its ``offset2bag`` is allocated one element longer than it is, then shrunk (ATen's
  ``make_offset2bag_out``), so the storage autograd keeps is one element larger than the
  fake kernel's; and a bfloat16 weight's sum takes the fast path, with no ``offset2bag``,
  which the meta kernel takes for float32 and float16 only.

GRU, RNN, the cells, an LSTM with ``proj_size`` or in float64 run ATen's step-by-step
kernels, whose every op the fake forward already runs (tests/summary/test_training_memory.py
checks each against a real CPU step).

>>> lstm_workspace(steps=5, batch=4, inputs=8, hidden=16, itemsize=4)
32768
"""

from __future__ import annotations

from typing import Any

import torch

# TorchDispatchMode: torch's private module for Python dispatch modes (FlopCounterMode and
# FakeTensorMode are ones); no public equivalent
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CpuKernels", "lstm_workspace"]


def _op(name: str) -> Any:
    """The default overload of ``aten.<name>`` (None if this torch has no such op)."""
    return getattr(getattr(torch.ops.aten, name, None), "default", None)


#: the ops nn.LSTM (oneDNN's kernel, per layer and direction) and nn.EmbeddingBag call
_ONEDNN_LSTM, _EMBEDDING_BAG = _op("mkldnn_rnn_layer"), _op("_embedding_bag")
#: oneDNN starts each part of an RNN workspace on a page of this many bytes
_PAGE = 4096
#: the bytes of oneDNN's accumulators (float), which hold the backward's differences
_ACCUMULATOR = 4


def _good_ld(dim: int, itemsize: int) -> int:
    """oneDNN's leading dimension for ``dim`` elements: a multiple of 64 bytes, not of 256
    elements (4K aliasing), as ``rnn_utils::get_good_ld``."""
    step = 64 // itemsize
    ld = -(-dim // step) * step
    return ld + step if ld % 256 == 0 else ld


def lstm_workspace(
    steps: int, batch: int, inputs: int, hidden: int, itemsize: int, paged: bool = True
) -> int:
    """The bytes of oneDNN 3's workspace for one LSTM layer in one direction, trained on
    ``steps`` x ``batch`` inputs of ``inputs`` features into ``hidden`` features, of
    ``itemsize`` bytes (4: float32, 2: bfloat16): oneDNN's ``set_workspace_sizes`` for one
    layer and direction, each part started on a 4 KiB page (``set_offsets``; ``paged=False``:
    the parts alone, linear in the batch). The states have a row for the initial one."""
    states, widest = (steps + 1) * batch, max(inputs, hidden)
    parts = [
        steps * batch * _good_ld(4 * hidden, itemsize) * itemsize,  # the gates of each step
        steps * batch * _good_ld(hidden, itemsize) * itemsize,  # each step's output
        2 * states * _good_ld(widest, itemsize) * itemsize,  # the layer's states (in, out)
        2 * states * hidden * itemsize,  # the cell states
        2 * states * _good_ld(widest, _ACCUMULATOR) * _ACCUMULATOR,  # the backward's: layer
        2 * states * _good_ld(widest, _ACCUMULATOR) * _ACCUMULATOR,  # ... iteration
        2 * states * hidden * _ACCUMULATOR,  # ... cell states
    ]
    if not paged:
        return sum(parts)
    return sum(-(-part // _PAGE) * _PAGE for part in parts)


class CpuKernels(TorchDispatchMode):
    """Over fake CPU tensors: the outputs of the kernels above, of the CPU's sizes (see the
    module doc). ``paged``: the LSTM workspace as oneDNN lays it out (False: per sample, its
    parts alone, linear in the batch)."""

    def __init__(self, paged: bool = True) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.paged = paged

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is _ONEDNN_LSTM:
            return self._lstm(args, out)
        if func is _EMBEDDING_BAG:
            return _offset2bag(args, kwargs or {}, out)
        return out

    def _lstm(self, args: tuple[Any, ...], out: Any) -> Any:
        # (input, weight_ih, weight_hh, bias_ih, bias_hh, hx, cx, reverse, batch_sizes, mode,
        # hidden_size, num_layers, has_biases, bidirectional, batch_first, train): the input
        # comes time-major whatever batch_first says (torch transposes it first)
        x, weight_ih, hidden, batch_sizes, train = args[0], args[1], args[10], args[8], args[15]
        if not train or batch_sizes or weight_ih.shape[0] != 4 * hidden:
            return out  # (no workspace, or not a case measured: the fake kernel's)
        steps, batch = x.shape[0], x.shape[1]
        size = lstm_workspace(
            steps, batch, weight_ih.shape[1], hidden, x.dtype.itemsize, paged=self.paged
        )
        workspace = torch.empty(size, dtype=torch.uint8, device=out[3].device)
        return (*out[:3], workspace)


def _offset2bag(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """``_embedding_bag``'s outputs with the CPU kernel's ``offset2bag``: none on its fast
    path (mode sum, a float32, float16 or bfloat16 weight of unit stride, per-sample weights
    of unit stride, no padding index: ATen's ``is_fast_path``, which the meta kernel takes
    for float32 and float16 only), else one element longer in storage than in shape."""
    weight, offset2bag = args[0], out[1]
    if offset2bag.device.type != "cpu":
        return out
    mode = _argument(args, kwargs, 4, "mode", 0)
    scale = _argument(args, kwargs, 6, "per_sample_weights", None)
    padding_idx = _argument(args, kwargs, 8, "padding_idx", -1)
    fast = (
        mode == 0
        and weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and weight.stride(1) == 1
        and (scale is None or scale.stride(0) == 1)
        and padding_idx < 0
    )
    count = 0 if fast else args[1].numel()
    kept = torch.empty(count + (count > 0), dtype=offset2bag.dtype, device="cpu")
    kept.resize_(count)  # (shrunk in place: its storage keeps the element)
    return (out[0], kept, *out[2:])


def _argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any
) -> Any:
    """An operator's argument, given by position or by name, or its default."""
    if index < len(args):
        return args[index]
    return kwargs.get(name, default)
