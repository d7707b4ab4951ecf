"""Sharded parameters that keep no init program, initialized by ``reset_parameters()`` with
the numbers an unsharded model gets; and where a rank's block of a sharded tensor is.

A model made on meta without lazynn, then sharded (FSDP2's ``fully_shard``, tensor parallel),
has each parameter a ``DTensor`` whose local shard is a block of the full parameter, and no
init program (``install.py`` runs programs, block by block). ``materialize`` allocates only
the shards and runs each module's ``reset_parameters()`` on them (``reset.py``). The
deterministic parts of an initialization (``zeros_``, ``fill_``, scaling) act on each shard as
on the full tensor; the random fills do not: a rank drawing ``uniform_`` into its shard would
draw the *first* numbers of the stream, not those of its block.

:class:`ShardedInit` is a dispatch mode, active only there, that fills a sharded tensor's
random part as the full tensor would be filled: each rank draws its block's numbers and
skips the rest of the stream (``_program/draws.py``). What cannot be reproduced on shards is
refused, naming it. :func:`~lazynn._build.install.block_offset` says where a rank's block is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

# TorchDispatchMode lives in a private module, but it is the documented way to write a mode
# ("Extending PyTorch"); tests/building/test_distributed.py exercises it on 2 ranks.
from torch.utils._python_dispatch import TorchDispatchMode

from .._errors import LazynnError, first_line, message
from .._program.draws import draw_region, draw_slice
from .install import block_offset

__all__ = ["ShardedInit", "init_mode", "sharded_failure"]

#: the random in-place fills whose chunked draws equal a whole draw (see module doc)
#: the random in-place fills whose chunked draws equal a whole draw (``_program/draws.py``)
_FILLS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.uniform_.default: torch.Tensor.uniform_,
    torch.ops.aten.normal_.default: torch.Tensor.normal_,
}
_RANDOM_PREFIXES = ("bernoulli", "random", "exponential", "geometric", "log_normal", "cauchy")


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
        from torch.distributed.tensor import DTensor  # (see install.py's region)

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
