"""Drawing part of a random fill: the numbers a whole ``uniform_`` or ``normal_`` would put in one
slice or block of a tensor (a sharded tensor's block), or none of them (a fill whose values
nothing keeps, drawn only to move its generator on).

Pieces of a fill drawn apart preserve the numbers of the CPU kernels torch uses (``uniform_``
draws one number per element in order; ``normal_`` draws all its uniforms first and transforms
them in blocks of 16, recomputing the last 16 when the size is not a multiple of 16). Pieces
therefore start at multiples of 16 and the last is at least 16 long. The words of the pieces
nobody keeps are skipped (``stream.py``: jumped, or drawn through by numpy, many skips merged
into one), where the fill's words are known; elsewhere (CUDA, a release whose self-test failed)
they are drawn in bounded chunks and dropped. tests/building/test_sharded_draws.py checks
this against torch for many sizes and dtypes, so a kernel change fails a test, not a model.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .jump import advance, jump_pays
from .stream import Stream, fill_words

__all__ = [
    "CHUNK",
    "FILLS",
    "PART",
    "Cursor",
    "call_drawing",
    "contiguous_in",
    "draw_parts",
    "draw_region",
    "draw_slice",
    "draw_through",
]

#: the random in-place fills whose chunked draws equal a whole draw (see the module doc)
FILLS: dict[str, Callable[..., Any]] = {
    "aten::uniform_.default": torch.Tensor.uniform_,
    "aten::normal_.default": torch.Tensor.normal_,
}
#: elements per chunk of the stream (a multiple of 16): 4 MiB of float32
CHUNK = 1 << 20
_KINDS = {torch.Tensor.uniform_: "uniform", torch.Tensor.normal_: "normal"}
#: the fewest words a thread's part of a fill draws (a jump costs as much as ~1.3M words)
PART = 1 << 22


class Cursor:
    """One fill's stream, walked from its first element to its last: :meth:`skip_to` an
    element, :meth:`draw` a range of elements or a :meth:`region` (a block) into memory, in
    the stream's order, then :meth:`finish`. It holds at most ``chunk`` numbers of its own
    (a piece's scratch, or a block's rows)."""

    def __init__(
        self,
        fill: Callable[..., Any],
        full_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        chunk: int,
        stream: Stream | None,
    ) -> None:
        self.fill, self.dtype, self.device, self.args = fill, dtype, device, args
        self.kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        self.full_shape, self.total = full_shape, math.prod(full_shape)
        self.chunk = max(16, chunk - chunk % 16)
        self.kind = _KINDS.get(fill, "")
        generator = kwargs.get("generator")
        if stream is None and device.type == "cpu":
            stream = Stream(generator if generator is not None else torch.default_generator)
            self.own = True
        else:
            self.own = False
        self.stream = stream
        self.generator = generator
        self.at = 0  # the first element not yet drawn or skipped
        self.scratch: torch.Tensor | None = None

    def words(self, upto: int) -> int | None:
        return fill_words(self.kind, self.dtype, self.total, upto)

    def _fill(self, memory: torch.Tensor) -> None:
        generator = self.stream.settle() if self.stream is not None else self.generator
        if generator is not None:
            self.fill(memory, *self.args, **self.kwargs, generator=generator)
        else:
            self.fill(memory, *self.args, **self.kwargs)

    def _pieces(self, lo: int, hi: int) -> list[int]:
        """Bounds of pieces from ``lo`` to ``hi``: multiples of 16, at most a chunk each, the
        last piece of the fill at least 16 long (its start moved back by 16, so that no
        piece is longer than a chunk)."""
        points = [*range(lo, hi, self.chunk), hi]
        if len(points) > 2 and hi == self.total and hi - points[-2] < 16:
            points[-2] -= 16
            if points[-2] == points[-3]:  # (chunks of 16: the piece before is now empty)
                del points[-2]
        return points

    def _buffer(self, size: int) -> torch.Tensor:
        """Scratch for a piece of ``size`` elements (at most a chunk): grown to the largest
        piece asked for, never beyond it (a 16-element edge piece holds 16, not a chunk)."""
        if self.scratch is None or self.scratch.numel() < size:
            self.scratch = None  # (the smaller one freed before the larger is made)
            self.scratch = torch.empty(size, dtype=self.dtype, device=self.device)
        return self.scratch[:size]

    def skip_to(self, end: int) -> None:
        """Move on to element ``end`` (a multiple of 16, or the fill's end) without keeping
        what lies between."""
        if end <= self.at:
            return
        before, after = self.words(self.at), self.words(end)
        if (
            self.stream is not None
            and self.stream.jumps
            and before is not None
            and after is not None
        ):
            self.stream.skip(after - before)
        else:
            for lo, hi in itertools.pairwise(self._pieces(self.at, end)):
                self._fill(self._buffer(hi - lo))
        self.at = end

    def draw(self, flat: torch.Tensor, start: int) -> None:
        """Fill ``flat`` (contiguous) with elements ``start : start + flat.numel()``."""
        stop = start + flat.numel()
        lo = start - start % 16
        hi = min(self.total, -(-stop // 16) * 16)
        if self.kind != "uniform" and self.total - hi < 16:
            hi = self.total  # (normal_ draws the last 16 again; a last piece is 16 or more)
        if hi == self.total and hi - lo < 16:
            lo = max(0, (self.total - 16) - (self.total - 16) % 16)
        if lo < self.at:  # (a piece drawn before ends in this 16-block: draw on from it)
            raise AssertionError("lazynn: overlapping draws of one fill")
        self.skip_to(lo)
        for a, b in itertools.pairwise(self._pieces(lo, hi)):
            if start <= a and b <= stop:  # wholly wanted: drawn in place
                self._fill(flat[a - start : b - start])
                continue
            buffer = self._buffer(b - a)
            self._fill(buffer)
            x, y = max(a, start), min(b, stop)
            if x < y:
                flat[x - start : y - start].copy_(buffer[x - a : y - a])
        self.at = hi

    def region(self, out: torch.Tensor, offset: tuple[int, ...]) -> None:
        """Fill ``out`` (contiguous) with the block at ``offset`` (one start per dimension)
        of the fill, after what was drawn before (see :func:`draw_region`)."""
        full_shape, shape = self.full_shape, tuple(out.shape)
        strides = [math.prod(full_shape[d + 1 :]) for d in range(len(full_shape))]
        start = sum(o * st for o, st in zip(offset, strides, strict=True))
        if math.prod(shape) == 0:  # an empty shard (uneven sharding): nothing kept
            return
        if contiguous_in(full_shape, shape):
            self.draw(out.view(-1), start)
            return
        row, rows = strides[0], full_shape[0]
        first, last = offset[0], offset[0] + shape[0]
        in_row = math.prod(shape[1:])
        wide = 2 if out.dtype == torch.float64 else 1
        rowwise = all(shape[d] == full_shape[d] for d in range(2, len(shape)))  # (a run a row)
        if rowwise and self.words(0) is not None and jump_pays((row - in_row) * wide, True):
            for r in range(first, last):  # each row's run, the gaps between jumped
                self.draw(out[r - first].reshape(-1), start + (r - first) * row)
            return
        step = 16 // math.gcd(row, 16)  # rows per piece: a multiple of this keeps pieces at 16s
        per = max(step, (max(self.chunk, row) // row) // step * step)
        lo_row = first - first % step
        hi_row = min(rows, -(-last // step) * step)
        if (rows - hi_row) * row < 16:
            hi_row = rows  # (normal_'s last 16, drawn again)
        bounds = [*range(lo_row, hi_row, per), hi_row]
        if hi_row == rows and (rows - bounds[-2]) * row < 16:
            if len(bounds) > 2:
                del bounds[-2]
            else:  # (one short last piece: start it earlier, at least 16 elements)
                bounds[0] = max(0, (rows * row - 16) // (step * row) * step)
        inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], shape[1:], strict=True))
        self.skip_to(bounds[0] * row)
        widest = max(hi - lo for lo, hi in itertools.pairwise(bounds)) * row
        rows_buffer = torch.empty(widest, dtype=out.dtype, device=out.device)
        for lo, hi in itertools.pairwise(bounds):
            buffer = rows_buffer[: (hi - lo) * row]
            self.draw(buffer, lo * row)
            a, b = max(lo, first), min(hi, last)
            if a < b:
                index = (slice(a - lo, b - lo), *inner)
                out[a - first : b - first].copy_(buffer.view(hi - lo, *full_shape[1:])[index])

    def finish(self) -> None:
        """Move on to the fill's end; a stream of its own settled."""
        self.skip_to(self.total)
        if self.own and self.stream is not None:
            self.stream.settle()


def contiguous_in(full_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a block of ``shape`` is one run of the full tensor's elements, wherever it
    lies: size 1 before its first partial dimension, whole after it (a ``Shard(0)`` block)."""
    partial = next((d for d in range(len(shape)) if shape[d] != full_shape[d]), None)
    return partial is None or (
        all(shape[d] == 1 for d in range(partial))
        and all(shape[d] == full_shape[d] for d in range(partial + 1, len(shape)))
    )


def draw_slice(
    out: torch.Tensor,
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    start: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
    stream: Stream | None = None,
) -> None:
    """Fill ``out`` with elements ``start : start + out.numel()`` (flat, row-major) of what
    ``fill(torch.empty(full_shape), *args)`` would draw, leaving the generator where the whole
    fill does. ``stream``: the generator's :class:`~lazynn._program.stream.Stream` (skips
    merged with others'); default: the generator in ``kwargs`` (or the default one), settled
    on return."""
    cursor = Cursor(fill, full_shape, out.dtype, out.device, args, kwargs, chunk, stream)
    if out.numel():
        cursor.draw(out.view(-1), start)
    cursor.finish()


def draw_region(
    out: torch.Tensor,
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    offset: tuple[int, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
    stream: Stream | None = None,
) -> None:
    """Fill ``out`` with the block at ``offset`` (one start per dimension, ``out``'s shape) of
    what ``fill(torch.empty(full_shape), *args)`` would draw (``stream`` as in
    :func:`draw_slice`).

    A block whose elements are contiguous in the full tensor (a ``Shard(0)`` shard) is one
    flat slice (:func:`draw_slice`). Any other (a ``Shard(1)`` column block, a 2-D shard) is
    drawn in pieces of whole rows of dim 0, each copied from where it overlaps the block; or,
    where the gap between a row's part and the next row's is worth a jump, row by row.

    >>> _ = torch.manual_seed(0)
    >>> full = torch.empty(5, 40).uniform_()
    >>> _ = torch.manual_seed(0)
    >>> block = torch.empty(3, 16)
    >>> draw_region(block, torch.Tensor.uniform_, (5, 40), (1, 20), (), {}, chunk=32)
    >>> torch.equal(block, full[1:4, 20:36])
    True
    """
    cursor = Cursor(fill, full_shape, out.dtype, out.device, args, kwargs, chunk, stream)
    cursor.region(out, offset)
    cursor.finish()


def draw_through(
    fill: Callable[..., Any],
    full_shape: tuple[int, ...],
    dtype: torch.dtype,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    chunk: int = CHUNK,
    stream: Stream | None = None,
) -> None:
    """Draw what ``fill(torch.empty(full_shape, dtype=dtype), *args, **kwargs)`` would draw,
    keeping nothing: its generator ends where the whole fill leaves it (skipped where its
    words are known), and memory stays at one chunk.

    >>> _ = torch.manual_seed(0); _ = torch.empty(50).normal_(); after = torch.get_rng_state()
    >>> _ = torch.manual_seed(0)
    >>> draw_through(torch.Tensor.normal_, (50,), torch.float32, (), {}, chunk=16)
    >>> torch.equal(torch.get_rng_state(), after)
    True
    """
    nothing = torch.empty(0, dtype=dtype, device="cpu")  # (under a meta device too)
    draw_slice(nothing, fill, full_shape, 0, args, kwargs, chunk, stream)


def draw_parts(
    out: torch.Tensor,
    fill: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    generator: torch.Generator,
    threads: int,
) -> bool:
    """Fill the contiguous CPU tensor ``out`` as ``fill(out, *args, generator=generator)``
    would, in parts drawn by up to ``threads`` threads at once, each from ``generator`` jumped
    to its part (the jumps computed before the threads start; torch's kernels release the
    GIL); ``generator`` ends where the whole fill leaves it. Returns False, having drawn
    nothing, where that does not pay (parts under :data:`PART` words) or the fill's words
    are not known.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = torch.empty(3 * PART)
    >>> draw_parts(out, torch.Tensor.normal_, (), {}, g, threads=3)
    True
    >>> torch.equal(out, torch.empty(3 * PART).normal_(generator=torch.Generator().manual_seed(0)))
    True
    """
    kind, total = _KINDS.get(fill, ""), out.numel()
    words = fill_words(kind, out.dtype, total, total)
    count = min(threads, (words or 0) // PART)
    if words is None or count < 2 or out.device.type != "cpu" or not out.is_contiguous():
        return False
    if not Stream(generator).jumps:  # (the self-test failed: draw serially)
        return False
    edges = [16 * (total * i // count // 16) for i in range(count)] + [total]
    generators, state, at = [], generator.get_state(), 0
    for edge in edges[:-1]:  # (on this thread: the polynomials are pure Python)
        before = fill_words(kind, out.dtype, total, edge)
        assert before is not None
        state = advance(state, before - at, jump=jump_pays(before - at, repeated=True))
        at = before
        part = torch.Generator()
        part.set_state(state)
        generators.append(part)
    flat = out.view(-1)

    def draw(index: int) -> None:
        part = flat[edges[index] : edges[index + 1]]
        fill(part, *args, **kwargs, generator=generators[index])

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(draw, range(count)))
    generator.set_state(generators[-1].get_state())
    return True


def call_drawing(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], generator: torch.Generator
) -> Any:
    """``fn(*args, **kwargs)`` drawing from ``generator``: passed as ``generator=``, or, for the
    few ops that take none (dropout), lent the default generator's place for the call (another
    thread drawing from the default generator in that moment would draw from it too)."""
    schema = getattr(fn, "_schema", None)  # (torch.nn.init's functions have none)
    if schema is None or any(a.name == "generator" for a in schema.arguments):
        return fn(*args, **kwargs, generator=generator)
    held = torch.get_rng_state()
    torch.set_rng_state(generator.get_state())
    try:
        return fn(*args, **kwargs)
    finally:
        generator.set_state(torch.get_rng_state())
        torch.set_rng_state(held)
