"""``nn.init.trunc_normal_`` drawn in part: its rejection rounds, worked a part at a time on one
block, counted and agreed.

torch (2.12 and later) fills a tensor with ``normal_``, then, while any element lies outside
``[a, b]``, draws a whole new ``normal_`` tensor and takes its elements where the old ones lay
outside (``torch.where``). Each round draws the words of one whole ``normal_``; how many rounds
there are is the maximum over the elements. A block of the tensor therefore takes its values
from the same rounds drawn on the block alone (:class:`~lazynn._program.draws.Cursor`,
skipping the other elements' words), and its own number of rounds; the tensor's number is
the maximum over blocks, which the holders of the blocks agree on (``agree``: an
``all_reduce(MAX)`` between ranks); the generator then moves on by the rounds the block did
not need. The narrow-window branch (``p <= 0.3``: uniform candidates and an acceptance test),
fewer than 16 elements and other dtypes are not split (:func:`splittable` is False): they are
drawn whole, as torch does.

A round after the first is worked in parts of at most :data:`SPAN` elements of the stream:
a part whose elements all lie inside keeps them (it is skipped in every later round), and
a part that still has some draws its numbers of the round into one part's memory and takes
them where its elements lie outside. Memory beyond the block is a part's numbers, its mask
and the cursor's scratch: under one chunk (:data:`~lazynn._program.draws.CHUNK` numbers),
where torch's rounds hold two more tensors of the block. The first use in a process checks
these rounds against torch's own ``trunc_normal_`` (:func:`vouched`); if they differ, every
``trunc_normal_`` is drawn whole by torch's function.

>>> import torch
>>> from lazynn._program.stream import Stream
>>> full = torch.nn.init.trunc_normal_(
...     torch.empty(40, 8), std=1.0, a=-1.0, b=1.0, generator=torch.Generator().manual_seed(3)
... )
>>> block = torch.empty(20, 8)
>>> stream = Stream(torch.Generator().manual_seed(3))
>>> # (alone: the rounds this block needs; the other block's holder would pass its own)
>>> trunc_normal_block(block, (40, 8), (20, 0), (0.0, 1.0, -1.0, 1.0), stream, alone)
>>> torch.equal(block, full[20:])
True
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
import warnings
from collections.abc import Callable

import torch

from .draws import CHUNK, Cursor, contiguous_in, draw_parts, draw_region
from .stream import Stream, fill_words

__all__ = [
    "SPAN",
    "alone",
    "count_rounds",
    "splittable",
    "trunc_normal_block",
    "trunc_normal_parts",
    "vouched",
]

#: elements of the stream a part of a round spans: its numbers, its mask (a byte an element)
#: and the cursor's scratch stay under one chunk of numbers in every dtype
SPAN = CHUNK // 4


def alone(rounds: int) -> int:
    """The rounds agreed by a process drawing a tensor's rounds on its own: its count."""
    return rounds


def _p(mean: float, std: float, a: float, b: float) -> float:
    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    return cdf((b - mean) / std) - cdf((a - mean) / std)


def splittable(dtype: torch.dtype, numel: int, bounds: tuple[object, ...]) -> bool:
    """Whether a ``trunc_normal_`` of ``numel`` elements with ``bounds`` (mean, std, a, b) can
    be drawn in blocks (the redraw branch, a known number of words a round, rounds this
    release draws as this module does: :func:`vouched`)."""
    numbers = [v for v in bounds if isinstance(v, (int, float))]
    if len(bounds) != 4 or len(numbers) != 4:
        return False
    mean, std, a, b = (float(v) for v in numbers)
    known = fill_words("normal", dtype, numel, numel) is not None
    return known and std > 0 and _p(mean, std, a, b) > 0.3 and vouched()


def _limits(bounds: tuple[float, ...], dtype: torch.dtype) -> tuple[float, float]:
    # (torch casts the bounds to the tensor's dtype, so the test sees representable values)
    _, _, a, b = bounds
    lo = torch.tensor(a, dtype=dtype, device="cpu").item()
    hi = torch.tensor(b, dtype=dtype, device="cpu").item()
    return lo, hi


def _outside(values: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """torch's test, ``(values < lo) | (values > hi)``, holding two masks at most."""
    mask = values < lo
    mask |= values > hi
    return mask


def _parts(
    full_shape: tuple[int, ...], offset: tuple[int, ...], shape: tuple[int, ...], span: int
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """The shape a block's parts are cut along (for a block that is one run of the full
    tensor's elements, the flat ``(numel,)``, else ``full_shape``) and the parts: ranges of
    its dim 0, each spanning at most ``span`` elements of the stream (a few rows at least),
    cut at multiples of 16 elements and never within 16 of the fill's end, so that parts
    drawn in order draw on from one :class:`~lazynn._program.draws.Cursor`."""
    total = math.prod(full_shape)
    if contiguous_in(full_shape, shape):
        strides = [math.prod(full_shape[d + 1 :]) for d in range(len(full_shape))]
        first = sum(o * st for o, st in zip(offset, strides, strict=True))
        full_shape, last, row = (total,), first + math.prod(shape), 1
    else:
        first, last, row = offset[0], offset[0] + shape[0], total // full_shape[0]
    step = 16 // math.gcd(row, 16)  # (rows whose elements make a multiple of 16)
    per = max(step, span // row // step * step)
    cuts = [c for c in range(first - first % per + per, last, per) if total - c * row >= 16]
    return full_shape, list(itertools.pairwise([first, *cuts, last]))


def trunc_normal_block(
    local: torch.Tensor,
    full_shape: tuple[int, ...],
    offset: tuple[int, ...],
    bounds: tuple[float, ...],
    stream: Stream,
    agree: Callable[[int], int],
    span: int | None = None,
) -> None:
    """Fill ``local`` with the block at ``offset`` of ``trunc_normal_(torch.empty(full_shape),
    *bounds)`` drawn from ``stream`` (see the module doc); ``agree(rounds)`` returns the most
    rounds any block needed (every holder calls it once, in the same order). The block that
    is the whole tensor, with ``agree`` returning its argument, is torch's ``trunc_normal_``
    worked in parts of ``span`` elements."""
    span = span or SPAN
    mean, std = float(bounds[0]), float(bounds[1])
    lo, hi = _limits(bounds, local.dtype)
    total = math.prod(full_shape)
    words = fill_words("normal", local.dtype, total, total)
    assert words is not None  # (splittable)
    kwargs = {"generator": stream.generator}
    shape, parts = _parts(full_shape, offset, tuple(local.shape), span)
    flat = len(shape) == 1
    block = local.view(-1) if flat else local
    first = parts[0][0]
    with torch.no_grad():
        draw_region(local, _NORMAL, full_shape, offset, (mean, std), kwargs, stream=stream)
        pending = [p for p in parts if _outside(block[p[0] - first : p[1] - first], lo, hi).any()]
        rounds = 1
        while pending:  # (a round: the parts that still have elements outside)
            rounds += 1
            cursor = Cursor(
                _NORMAL, shape, local.dtype, local.device, (mean, std), kwargs, span, stream
            )
            left = []
            for a, b in pending:
                part = block[a - first : b - first]
                mask = _outside(part, lo, hi)
                fresh = torch.empty_like(part)
                cursor.region(fresh, (a,) if flat else (a, *offset[1:]))
                torch.where(mask, fresh, part, out=part)  # (torch's where, in place)
                del mask, fresh
                if _outside(part, lo, hi).any():
                    left.append((a, b))
            cursor.finish()
            pending = left
    stream.skip((agree(rounds) - rounds) * words)


def count_rounds(
    total: int,
    start: int,
    stop: int,
    dtype: torch.dtype,
    bounds: tuple[float, ...],
    stream: Stream,
    agree: Callable[[int], int],
    span: int | None = None,
) -> None:
    """Draw what ``trunc_normal_`` of ``total`` elements draws, keeping none of it, counting
    the rounds elements ``start:stop`` need, agreed (``agree``, as :func:`trunc_normal_block`):
    where no process keeps the tensor, each counts on a slice of it. Each part keeps only
    which of its elements are still outside: their indices, or a mask where they are many
    (at most a byte an element of the slice)."""
    span = span or SPAN
    mean, std = float(bounds[0]), float(bounds[1])
    lo, hi = _limits(bounds, dtype)
    words = fill_words("normal", dtype, total, total)
    assert words is not None  # (splittable)
    kwargs = {"generator": stream.generator}
    shape, parts = _parts((total,), (start,), (stop - start,), span)
    pending: list[tuple[int, int, torch.Tensor | None]] = [(a, b, None) for a, b in parts]
    rounds = 0
    with torch.no_grad():
        while pending:
            rounds += 1
            cursor = Cursor(
                _NORMAL, shape, dtype, torch.device("cpu"), (mean, std), kwargs, span, stream
            )
            left: list[tuple[int, int, torch.Tensor | None]] = []
            for a, b, before in pending:
                values = torch.empty(b - a, dtype=dtype, device="cpu")
                cursor.region(values, (a,))
                still = _outside(values, lo, hi)
                del values
                if before is not None:
                    still &= before if before.dtype == torch.bool else _mask(before, b - a)
                count = int(still.sum())
                if count:
                    left.append((a, b, still.nonzero().view(-1) if 8 * count < b - a else still))
            cursor.finish()
            pending = left
    stream.skip((agree(rounds) - rounds) * words)


def _mask(indices: torch.Tensor, size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool, device="cpu")
    return mask.index_fill_(0, indices, True)


def trunc_normal_parts(
    tensor: torch.Tensor, bounds: tuple[float, ...], generator: torch.Generator, threads: int
) -> None:
    """torch's rounds of ``trunc_normal_(tensor, *bounds)`` (the redraw branch), each round's
    ``normal_`` drawn in parts by ``threads`` threads (:func:`~.draws.draw_parts`; holding
    each round's tensor whole, as torch does)."""
    mean, std = float(bounds[0]), float(bounds[1])
    lo, hi = _limits(bounds, tensor.dtype)

    def normal(t: torch.Tensor) -> None:
        if not draw_parts(t, _NORMAL, (mean, std), {}, generator, threads):
            t.normal_(mean, std, generator=generator)

    with torch.no_grad():
        normal(tensor)
        while True:
            mask = _outside(tensor, lo, hi)
            if not mask.any():
                break
            fresh = torch.empty_like(tensor)
            normal(fresh)
            tensor.copy_(torch.where(mask, fresh, tensor))


#: (shape, dtype, (mean, std, a, b)): windows that take many rounds, parts of a few rows
_CASES = (
    ((40, 24), torch.float32, (0.0, 1.0, -0.6, 0.6)),
    ((333,), torch.float64, (0.5, 2.0, -1.0, 3.0)),
    ((50, 17), torch.bfloat16, (0.0, 1.0, -0.55, 0.55)),
)
_warned = threading.Event()


@functools.cache
def vouched() -> bool:
    """Whether this torch release's ``trunc_normal_`` is the rounds :func:`trunc_normal_block`
    draws (values and the generator's end, on tensors that take many rounds worked in parts
    of 64 elements; once a process). If not, lazynn warns once and draws every
    ``trunc_normal_`` whole, by torch's function."""
    for shape, dtype, bounds in _CASES:
        theirs = torch.Generator().manual_seed(1234)
        whole = torch.nn.init.trunc_normal_(
            torch.empty(shape, dtype=dtype, device="cpu"), *bounds, generator=theirs
        )
        stream = Stream(torch.Generator().manual_seed(1234))
        mine = torch.empty(shape, dtype=dtype, device="cpu")  # (under a meta device too)
        trunc_normal_block(mine, shape, (0,) * len(shape), bounds, stream, alone, span=64)
        same = torch.equal(mine, whole)
        if not (same and torch.equal(stream.settle().get_state(), theirs.get_state())):
            if not _warned.is_set():
                _warned.set()
                warnings.warn(
                    f"lazynn: on torch {torch.__version__}, trunc_normal_'s rounds differ from "
                    f"lazynn's ({tuple(shape)} {dtype}); every trunc_normal_ is drawn whole "
                    "by torch's function (exact, holding its rounds whole on every rank). "
                    "Please report it with the torch release.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return False
    return True


_NORMAL = torch.Tensor.normal_
