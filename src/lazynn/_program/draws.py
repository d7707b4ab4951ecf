"""Drawing part of a random fill: the numbers a whole ``uniform_`` or ``normal_`` would put in one
slice or block of a tensor, drawing the whole stream in bounded chunks (a sharded tensor's
block; a fill whose values nothing keeps, drawn only to move its generator on).

Chunking preserves the numbers of the CPU kernels torch uses (``uniform_`` draws one number
per element in order; ``normal_`` draws all its uniforms first and transforms them in blocks
of 16, recomputing the last 16 when the size is not a multiple of 16). Chunks therefore
start at multiples of 16 and the last is at least 16 long. tests/materialize/test_sharded_draws.py
checks this against torch for many sizes and dtypes, so a kernel change fails a test, not a
model.

>>> import torch
>>> _ = torch.manual_seed(0)
>>> full = torch.empty(100).normal_()
>>> _ = torch.manual_seed(0)
>>> part = torch.empty(30)
>>> draw_slice(part, torch.Tensor.normal_, (100,), 40, (), {}, chunk=32)
>>> torch.equal(part, full[40:70])
True
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CHUNK", "FILLS", "draw_region", "draw_slice", "draw_through"]

#: the random in-place fills whose chunked draws equal a whole draw (see the module doc)
FILLS: dict[str, Callable[..., Any]] = {
    "aten::uniform_.default": torch.Tensor.uniform_,
    "aten::normal_.default": torch.Tensor.normal_,
}
#: elements per chunk of the stream (a multiple of 16): 4 MiB of float32
CHUNK = 1 << 20


def draw_slice(
    out: torch.Tensor,
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    start: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
) -> None:
    """Fill ``out`` with elements ``start : start + out.numel()`` (flat, row-major) of what
    ``fill(torch.empty(full_shape), *args)`` would draw, drawing the whole stream."""
    total = math.prod(full_shape)
    chunk = max(16, chunk - chunk % 16)
    bounds = list(range(0, total, chunk))
    if len(bounds) > 1 and total - bounds[-1] < 16:
        bounds.pop()  # the last chunk must hold at least 16 elements
    bounds.append(total)
    flat = out.view(-1)
    stop = start + flat.numel()
    scratch: torch.Tensor | None = None  # one buffer for the chunks not wholly this slice's
    for lo, hi in itertools.pairwise(bounds):
        a, b = max(lo, start), min(hi, stop)
        if a == lo and b == hi:  # wholly inside the slice: draw in place (a contiguous view)
            fill(flat[lo - start : hi - start], *args, **kwargs)
            continue
        if scratch is None:  # (as wide as the widest chunk: no wider than the tensor)
            widest = max(y - x for x, y in itertools.pairwise(bounds))
            scratch = torch.empty(widest, dtype=out.dtype, device=out.device)
        buffer = scratch[: hi - lo]
        fill(buffer, *args, **kwargs)
        if a < b:
            flat[a - start : b - start].copy_(buffer[a - lo : b - lo])


def draw_region(
    out: torch.Tensor,
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    offset: tuple[int, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
) -> None:
    """Fill ``out`` with the block at ``offset`` (one start per dimension, ``out``'s shape) of
    what ``fill(torch.empty(full_shape), *args)`` would draw, drawing the whole stream.

    A block whose elements are contiguous in the full tensor (a ``Shard(0)`` shard) is one
    flat slice (:func:`draw_slice`). Any other (a ``Shard(1)`` column block, a 2-D shard) is
    drawn in chunks of whole rows of dim 0, each copied from where it overlaps the block.

    >>> _ = torch.manual_seed(0)
    >>> full = torch.empty(5, 40).uniform_()
    >>> _ = torch.manual_seed(0)
    >>> block = torch.empty(3, 16)
    >>> draw_region(block, torch.Tensor.uniform_, (5, 40), (1, 20), (), {}, chunk=32)
    >>> torch.equal(block, full[1:4, 20:36])
    True
    """
    shape = tuple(out.shape)
    if math.prod(shape) == 0:  # an empty shard (uneven sharding): draw the stream, keep none
        draw_slice(out, fill, full_shape, 0, args, kwargs, chunk)
        return
    # contiguous in the full tensor: size 1 before the first partial dim, full after it
    partial = next((d for d in range(len(shape)) if shape[d] != full_shape[d]), None)
    if partial is None or (
        all(shape[d] == 1 for d in range(partial))
        and all(shape[d] == full_shape[d] for d in range(partial + 1, len(shape)))
    ):
        strides = [math.prod(full_shape[d + 1 :]) for d in range(len(full_shape))]
        start = sum(o * st for o, st in zip(offset, strides, strict=True))
        draw_slice(out, fill, full_shape, start, args, kwargs, chunk)
        return
    row = math.prod(full_shape[1:])
    rows = full_shape[0]
    step = 16 // math.gcd(row, 16)  # rows per chunk: a multiple of this keeps chunks at 16s
    per = max(step, (max(chunk, row) // row) // step * step)
    bounds = list(range(0, rows, per))
    if len(bounds) > 1 and (rows - bounds[-1]) * row < 16:
        bounds.pop()  # the last chunk must hold at least 16 elements
    bounds.append(rows)
    widest = max(hi - lo for lo, hi in itertools.pairwise(bounds))
    scratch = torch.empty(widest * row, dtype=out.dtype, device=out.device)
    inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], shape[1:], strict=True))
    first, last = offset[0], offset[0] + shape[0]
    for lo, hi in itertools.pairwise(bounds):
        buffer = scratch[: (hi - lo) * row]
        fill(buffer, *args, **kwargs)
        a, b = max(lo, first), min(hi, last)
        if a < b:
            index = (slice(a - lo, b - lo), *inner)
            out[a - first : b - first].copy_(buffer.view(hi - lo, *full_shape[1:])[index])


def draw_through(
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    dtype: torch.dtype,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
) -> None:
    """Draw what ``fill(torch.empty(full_shape, dtype=dtype), *args, **kwargs)`` would draw,
    keeping nothing: its generator ends where the whole fill leaves it, and memory stays at one
    chunk.

    >>> _ = torch.manual_seed(0); _ = torch.empty(50).normal_(); after = torch.get_rng_state()
    >>> _ = torch.manual_seed(0)
    >>> draw_through(torch.Tensor.normal_, (50,), torch.float32, (), {}, chunk=16)
    >>> torch.equal(torch.get_rng_state(), after)
    True
    """
    nothing = torch.empty(0, dtype=dtype)
    draw_slice(nothing, fill, full_shape, 0, args, kwargs, chunk)
