"""Initializing sharded parameters with the numbers an unsharded model gets.

After ``build(model, ..., device="meta")`` and FSDP2's ``fully_shard``, each parameter is a
``DTensor`` whose local shard is a slice of the full parameter. ``materialize`` allocates
only the shards and runs each module's ``reset_parameters()`` on them. The
deterministic parts of an initialization (``zeros_``, ``fill_``, scaling) act on each shard
as on the full tensor; the random fills do not: a rank drawing ``uniform_`` into its shard
would draw the *first* numbers of the stream, not those of its slice.

:class:`ShardedInit` is a dispatch mode, active only inside ``materialize``, that fills a
sharded tensor's random part as the full tensor would be filled: every rank draws the whole
stream, chunk by chunk (bounded memory, never a full layer), and keeps its slice. So the
gathered parameters equal an eager model's under the same seed, and every rank's generator
ends where an eager construction leaves it.

Chunking preserves the numbers of the CPU kernels torch uses (``uniform_`` draws one number
per element in order; ``normal_`` draws all its uniforms first and transforms them in blocks
of 16, recomputing the last 16 when the size is not a multiple of 16). Chunks therefore
start at multiples of 16 and the last is at least 16 long. tests/materialize/test_sharded_draws.py
checks this
against torch for many sizes and dtypes, so a kernel change fails a test, not a model.

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

import contextlib
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

# TorchDispatchMode lives in a private module, but it is the documented way to write a mode
# ("Extending PyTorch"); tests/materialize/test_distributed.py exercises it on 2 ranks.
from torch.utils._python_dispatch import TorchDispatchMode

from .._errors import LazynnError, first_line, message

__all__ = [
    "ShardedInit",
    "block_offset",
    "draw_region",
    "draw_slice",
    "init_mode",
    "region",
    "sharded_failure",
]

#: the random in-place fills whose chunked draws equal a whole draw (see module doc)
_FILLS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.uniform_.default: torch.Tensor.uniform_,
    torch.ops.aten.normal_.default: torch.Tensor.normal_,
}
_RANDOM_PREFIXES = ("bernoulli", "random", "exponential", "geometric", "log_normal", "cauchy")
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
        if scratch is None or scratch.numel() < hi - lo:
            scratch = torch.empty(max(chunk, hi - lo), dtype=out.dtype, device=out.device)
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


def region(tensor: Any) -> tuple[int, ...] | None:
    """The offset in the full tensor of this rank's shard of a DTensor (its local tensor is
    the block there), or None for a placement that holds no block of it (``Partial``)."""
    # (torch.distributed.tensor imports sympy: only a process holding DTensors gets here, and
    # it has imported it already.)
    from torch.distributed.tensor import Partial

    if any(isinstance(p, Partial) for p in tensor.placements):
        return None
    # DTensor.__create_chunk_list__ is the protocol torch.distributed.checkpoint reads a
    # shard's place with (DTensor documents it; torch's own offsets, _StridedShard included)
    (chunk,) = tensor.__create_chunk_list__()
    if tuple(chunk.sizes) != tuple(tensor.to_local().shape):
        return None
    return tuple(int(o) for o in chunk.offsets)


#: random ops a DTensor would draw per shard (its CPU fallback): the eager numbers need the
#: whole stream, so only ``_FILLS`` are drawn; these are refused
_RANDOM = ("rand", "normal", "bernoulli", "multinomial", "poisson", "uniform", *_RANDOM_PREFIXES)


class ShardedInit(TorchDispatchMode):
    """Random fills of DTensors draw as the full tensor would (see the module doc); what
    cannot be reproduced on shards is refused.

    ``where`` names the module being initialized, for errors; ``tensors`` are its own (and
    below): the storages an initializer may write into. A write into any other DTensor is a
    write into a gathered copy of a part of one (``weight[padding_idx].fill_(0)``, ``eye_``,
    ``dirac_`` across shards), which DTensor drops: refused.
    """

    def __init__(self, where: str, tensors: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.where = where
        #: each DTensor's local storage -> its full shape
        self.owners = {
            _storage(t): tuple(t.shape) for t in tensors if type(t).__name__ == "DTensor"
        }

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        from torch.distributed.tensor import DTensor  # (see region)

        name = func.__name__.split(".")[0]
        if isinstance(kwargs.get("out"), DTensor):  # (eye_: torch.eye(out=...), per shard)
            raise self._refuse(
                f"an op writing into a sharded tensor with out= ({name})",
                "initialize it before sharding (materialize, then shard)",
            )
        written = args[0] if args and name.endswith("_") else None
        if isinstance(written, DTensor) and _storage(written) not in self.owners:
            raise self._refuse(
                f"a write ({name}) into part of a sharded tensor taken across its shards (an "
                "index or slice: padding_idx, eye_, dirac_), which DTensor makes a copy of",
                "initialize it before sharding (materialize, then shard), or fill it whole",
            )
        target = args[0] if args else None
        if not isinstance(target, DTensor):
            if name.startswith(_RANDOM) and any(isinstance(a, DTensor) for a in args):
                raise self._refuse(f"a random op ({name}) that DTensor draws per shard")
            return func(*args, **kwargs)
        fill = _FILLS.get(func)
        if fill is None:
            if name.startswith(_RANDOM):
                raise self._refuse(f"a random op ({name}) that DTensor draws per shard")
            return func(*args, **kwargs)
        local = target.to_local()
        if local.device.type != "cpu":
            # Chunked draws reproduce the CPU kernels only (module doc); elsewhere DTensor's
            # own random ops (offset-based on CUDA) draw, and shards differ from unsharded.
            return func(*args, **kwargs)
        if all(p.is_replicate() for p in target.placements):
            fill(local, *args[1:], **kwargs)  # every rank draws the whole tensor
            return target
        if local.numel() == 0:  # an empty shard: draw the stream, keep nothing
            draw_slice(local, fill, tuple(target.shape), 0, args[1:], kwargs)
            return target
        if tuple(target.shape) != self.owners.get(_storage(target)):  # a view of part of one
            raise self._refuse(
                f"a random fill ({name}) of a view of a sharded parameter (a reshape, slice or "
                "index of it), whose shards are not blocks of the parameter",
                "initialize it before sharding (materialize, then shard), or fill it whole",
            )
        offset = block_offset(target, self.where)
        if not local.is_contiguous():
            raise self._refuse(
                f"a random fill ({name}) of part of a sharded parameter (a slice or index)",
                "initialize it before sharding (materialize, then shard), or fill it whole",
            )
        draw_region(local, fill, tuple(target.shape), offset, args[1:], kwargs)
        return target

    def _refuse(self, what: str, fix: str | None = None) -> LazynnError:
        return LazynnError(
            message(
                f"lazynn.materialize at '{self.where}'",
                "an initializer that fills whole sharded parameters (uniform_, normal_, "
                "elementwise ops) whose placements hold a block of the full tensor (Shard, "
                "Replicate), so that they equal an unsharded model's",
                what,
                fix
                or "materialize before sharding, or shard parameters with Shard or Replicate "
                "placements (a Partial parameter holds no block of its values)",
                outcome="the model is unchanged",
            )
        )


def block_offset(tensor: Any, where: str) -> tuple[int, ...]:
    """The offset of this rank's block of a DTensor (:func:`region`); a placement that holds
    no block of it (``Partial``) is refused, naming ``where``."""
    offset = region(tensor)
    if offset is None:
        raise LazynnError(
            message(
                f"lazynn.materialize at '{where}'",
                "sharded parameters whose placements hold a block of the full tensor (Shard, "
                "Replicate), so that they take an unsharded model's values",
                f"the placements {tuple(tensor.placements)}",
                "materialize before sharding, or shard parameters with Shard or Replicate "
                "placements (a Partial parameter holds no block of its values)",
                outcome="the model is unchanged",
            )
        )
    return offset


def sharded_failure(where: str, error: Exception) -> LazynnError:
    """The refusal of an initializer that torch cannot run on sharded parameters (an op
    DTensor has no sharding for, a plain tensor copied into a DTensor)."""
    return LazynnError(
        message(
            f"lazynn.materialize at '{where}'",
            "an initializer that runs on sharded parameters (DTensors)",
            f"one that fails there: {type(error).__name__}: {first_line(error)}",
            "initialize it before sharding (materialize, then shard), or write the "
            "initializer with whole-tensor fills (uniform_, normal_, elementwise ops)",
            outcome="the model is unchanged",
        )
    )


def _storage(tensor: Any) -> int:
    """The address of a DTensor's local storage (real: shards are allocated by now)."""
    return int(tensor.to_local().untyped_storage().data_ptr())


def init_mode(module: torch.nn.Module, where: str) -> Any:
    """A :class:`ShardedInit` if ``module`` holds DTensors, else a context that does nothing."""
    tensors = (*module.parameters(), *module.buffers())  # (an initializer may reach below)
    if not any(type(t).__name__ == "DTensor" for t in tensors):
        return contextlib.nullcontext()
    return ShardedInit(where, tensors)
