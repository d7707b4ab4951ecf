"""``nn.init.trunc_normal_`` drawn in part: its rejection rounds, counted on one block and agreed.

torch (2.12 and later) fills a tensor with ``normal_``, then, while any element lies outside
``[a, b]``, draws a whole new ``normal_`` tensor and takes its elements where the old ones lay
outside (``torch.where``). Each round draws the words of one whole ``normal_``; how many rounds
there are is the maximum over the elements. A block of the tensor therefore takes its values
from the same rounds drawn on the block alone (:func:`~lazynn._program.draws.draw_region`,
skipping the other elements' words), and its own number of rounds; the tensor's number is
the maximum over blocks, which the holders of the blocks agree on (``agree``: an
``all_reduce(MAX)`` between ranks); the generator then moves on by the rounds the block did
not need. The narrow-window branch (``p <= 0.3``: uniform candidates and an acceptance test),
fewer than 16 elements and other dtypes are not split (:func:`splittable` is False): they are
drawn whole, as torch does.

>>> import torch
>>> from lazynn._program.stream import Stream
>>> full = torch.nn.init.trunc_normal_(
...     torch.empty(40, 8), std=1.0, a=-1.0, b=1.0, generator=torch.Generator().manual_seed(3)
... )
>>> block = torch.empty(20, 8)
>>> stream = Stream(torch.Generator().manual_seed(3))
>>> alone = lambda rounds: rounds  # (the other block's holder would pass its own)
>>> trunc_normal_block(block, (40, 8), (20, 0), (0.0, 1.0, -1.0, 1.0), stream, alone)
>>> torch.equal(block, full[20:])
True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .draws import draw_region
from .stream import Stream, fill_words

__all__ = ["splittable", "trunc_normal_block", "trunc_normal_whole"]


def _p(mean: float, std: float, a: float, b: float) -> float:
    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    return cdf((b - mean) / std) - cdf((a - mean) / std)


def splittable(dtype: torch.dtype, numel: int, bounds: tuple[object, ...]) -> bool:
    """Whether a ``trunc_normal_`` of ``numel`` elements with ``bounds`` (mean, std, a, b) can
    be drawn in blocks (the redraw branch, a known number of words a round)."""
    if len(bounds) != 4 or not all(isinstance(v, (int, float)) for v in bounds):
        return False
    mean, std, a, b = (float(v) for v in bounds)  # type: ignore[arg-type]
    known = fill_words("normal", dtype, numel, numel) is not None
    return known and std > 0 and _p(mean, std, a, b) > 0.3


def trunc_normal_block(
    local: torch.Tensor,
    full_shape: tuple[int, ...],
    offset: tuple[int, ...],
    bounds: tuple[float, ...],
    stream: Stream,
    agree: Callable[[int], int],
) -> None:
    """Fill ``local`` with the block at ``offset`` of ``trunc_normal_(torch.empty(full_shape),
    *bounds)`` drawn from ``stream`` (see the module doc); ``agree(rounds)`` returns the most
    rounds any block needed (every holder calls it once, in the same order)."""
    mean, std, a, b = (float(v) for v in bounds)
    dtype = local.dtype
    # (torch casts the bounds to the tensor's dtype, so the test sees representable values)
    lo = torch.tensor(a, dtype=dtype, device="cpu").item()
    hi = torch.tensor(b, dtype=dtype, device="cpu").item()
    total = math.prod(full_shape)
    words = fill_words("normal", dtype, total, total)
    assert words is not None  # (splittable)
    kwargs = {"generator": stream.generator}
    with torch.no_grad():
        draw_region(
            local, torch.Tensor.normal_, full_shape, offset, (mean, std), kwargs, stream=stream
        )
        rounds = 1
        while local.numel():
            mask = (local < lo) | (local > hi)
            if not mask.any():
                break
            fresh = torch.empty_like(local)
            draw_region(
                fresh, torch.Tensor.normal_, full_shape, offset, (mean, std), kwargs, stream=stream
            )
            local.copy_(torch.where(mask, fresh, local))
            rounds += 1
    stream.skip((agree(rounds) - rounds) * words)


def trunc_normal_whole(
    tensor: torch.Tensor, bounds: tuple[float, ...], normal: Callable[[torch.Tensor], object]
) -> None:
    """torch's rounds of ``trunc_normal_(tensor, *bounds)`` (the redraw branch), each round's
    ``normal_(mean, std)`` drawn by ``normal`` (by threads: ``draws.draw_parts``)."""
    _, _, a, b = bounds
    lo = torch.tensor(a, dtype=tensor.dtype, device="cpu").item()
    hi = torch.tensor(b, dtype=tensor.dtype, device="cpu").item()
    with torch.no_grad():
        normal(tensor)
        while True:
            mask = (tensor < lo) | (tensor > hi)
            if not mask.any():
                break
            fresh = torch.empty_like(tensor)
            normal(fresh)
            tensor.copy_(torch.where(mask, fresh, tensor))
