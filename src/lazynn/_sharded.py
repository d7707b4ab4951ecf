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
start at multiples of 16 and the last is at least 16 long. tests/test_sharded.py checks this
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
# ("Extending PyTorch"); tests/test_distributed.py exercises it on 2 ranks.
from torch.utils._python_dispatch import TorchDispatchMode

from ._errors import LazynnError, message

__all__ = ["ShardedInit", "draw_slice", "init_mode"]

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


def _shard_rows(tensor: Any) -> tuple[int, int] | None:
    """(first row, rows) of this rank's shard of a DTensor sharded on dim 0 (and replicated
    on any other mesh dimension), or None for another placement."""
    # (torch.distributed.tensor imports sympy: only a process holding DTensors gets here, and
    # it has imported it already.)
    from torch.distributed.tensor import Replicate, Shard

    start, rows = 0, tensor.shape[0]
    for mesh_dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Replicate):
            continue
        if not (isinstance(placement, Shard) and placement.dim == 0):
            return None
        # torch.chunk's split, which DTensor's Shard uses: ceil(rows / n) per rank
        n = tensor.device_mesh.size(mesh_dim)
        rank = tensor.device_mesh.get_local_rank(mesh_dim)
        per = -(-rows // n)
        start += min(rank * per, rows)
        rows = max(0, min(per, rows - rank * per))
    return start, rows


class ShardedInit(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Random fills of DTensors draw as the full tensor would (see the module doc).

    ``where`` names the module being initialized, for errors.
    """

    def __init__(self, where: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.where = where

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        from torch.distributed.tensor import DTensor  # (see _shard_rows)

        target = args[0] if args else None
        if not isinstance(target, DTensor):
            return func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        fill = _FILLS.get(func)
        if fill is None:
            if name.startswith(_RANDOM_PREFIXES) and name.endswith("_"):
                raise self._refuse(f"a random fill ({name})")
            return func(*args, **kwargs)
        local = target.to_local()
        if local.device.type != "cpu":
            # Chunked draws reproduce the CPU kernels only (module doc); elsewhere DTensor's
            # own random ops (offset-based on CUDA) draw, and shards differ from unsharded.
            return func(*args, **kwargs)
        if all(p.is_replicate() for p in target.placements):
            fill(local, *args[1:], **kwargs)  # every rank draws the whole tensor
            return target
        rows = _shard_rows(target)
        if rows is None or local.shape[0] != rows[1] or not local.is_contiguous():
            raise self._refuse(f"the placements {tuple(target.placements)}")
        row = math.prod(target.shape[1:])
        draw_slice(local, fill, tuple(target.shape), rows[0] * row, args[1:], kwargs)
        return target

    def _refuse(self, what: str) -> LazynnError:
        return LazynnError(
            message(
                f"lazynn.materialize at '{self.where}'",
                "sharded parameters initialized by uniform_/normal_ fills of parameters "
                "sharded on dim 0 (FSDP2's default), so that they equal an unsharded model's",
                what,
                "materialize before sharding, or keep FSDP2's default Shard(0) placement; the "
                "model is unchanged",
            )
        )


def init_mode(module: torch.nn.Module, where: str) -> Any:
    """A :class:`ShardedInit` if ``module`` holds DTensors, else a context that does nothing."""
    tensors = (*module.parameters(), *module.buffers())  # (an initializer may reach below)
    if not any(type(t).__name__ == "DTensor" for t in tensors):
        return contextlib.nullcontext()
    return ShardedInit(where)
