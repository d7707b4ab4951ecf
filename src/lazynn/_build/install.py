"""The values of a model's init programs, computed and put in its modules.

Every meta tensor of a model that keeps its program (``_program/program.py``: a model
``lazynn.build`` built on meta, in either form, wrapped, copied or pickled since) gets its
value by a replay of its construction's tape (``_program/replay.py``): one replay per tape,
in program order, on the target device, so that values, ties and the generator's end are the
eager program's. A sharded tensor (FSDP2, tensor parallel: a ``DTensor`` whose local shard is
on meta) is a :class:`~lazynn._program.replay.Block`: only this rank's block is allocated, and
computed block by block where its program allows (whole-tensor fills and elementwise steps,
``trunc_normal_`` with its rounds agreed between the ranks), else computed whole and its
block kept; each rank draws only its blocks' words and jumps over the rest. A tensor that is
no longer on meta (loaded with ``assign=True``) keeps its value; its steps only move the
stream on. The Python attributes the construction set on a tensor are set on its value. A
tensor that its program leaves as uninitialized memory (``empty`` written in part) is
refused, naming it, before anything changes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._errors import LazynnError, message
from .._program.program import PROGRAM_KEY, Program, drop, loaded, programs, tensor_slots
from .._program.replay import Block, Ranks, Replay
from .._program.tape import Tape, View, uninitialized

__all__ = ["block_offset", "install", "pending", "region"]

#: one tensor slot: (module, its path, the tensor's name, the program)
_Slot = tuple[nn.Module, str, str, Program]


def _is_dtensor(tensor: Any) -> bool:
    return type(tensor).__name__ == "DTensor"


def _current(module: nn.Module, name: str) -> Any:
    for store in (module._parameters, module._buffers, module.__dict__):
        if name in store:
            return store[name]
    return None


def _pending_meta(tensor: Any) -> bool:
    if _is_dtensor(tensor):
        return bool(tensor._local_tensor.is_meta)  # (DTensor's own tensor: to_local())
    return isinstance(tensor, torch.Tensor) and tensor.is_meta


def pending(model: nn.Module) -> list[_Slot]:
    """The slots of ``model`` whose meta tensor a program gives a value, in module order."""
    paths = {id(m): p for p, m in model.named_modules()}
    return [
        (module, paths.get(id(module), ""), name, program)
        for module, name, program in programs(model)
        if _pending_meta(_current(module, name))
    ]


def _label(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check(slots: list[_Slot]) -> None:
    """Refuse tensors their program leaves as uninitialized memory (before any change)."""
    left = [
        _label(path, name)
        for _, path, name, program in slots
        if uninitialized(program.tape, program.view.storage)
    ]
    if left:
        raise LazynnError(
            message(
                "lazynn.materialize",
                "init code that writes every element of each tensor it makes with torch.empty",
                "tensors it writes only in part (a write through an index or slice, "
                "w[0].normal_()): " + ", ".join(f"'{t}'" for t in left[:8]),
                "write the whole tensor in the module's __init__ or reset_parameters() (fill "
                "it first: torch.zeros, or .zero_(), then write the part)",
                outcome="the model is unchanged, on meta",
            )
        )


def _check_replaced(model: nn.Module, kept: list[tuple[nn.Module, str, Program]]) -> None:
    """Refuse tensors replaced since the build on meta other than by a checkpoint load
    (``to_empty``: uninitialized memory; an assignment) whose values nothing vouches for: not
    loaded, nor tied to a tensor a checkpoint loaded or the build made real."""
    vouched: set[int] = set()
    for module in model.modules():
        programmed = module.__dict__.get(PROGRAM_KEY, {})
        for _, name, tensor in tensor_slots(module):
            if name not in programmed or name in loaded(module):
                vouched.add(id(tensor))
    left = [
        (module, name)
        for module, name, _ in kept
        if not _pending_meta(tensor := _current(module, name)) and id(tensor) not in vouched
    ]
    if not left:
        return
    paths = {id(m): p for p, m in model.named_modules()}
    named = [_label(paths.get(id(m), ""), n) for m, n in left]
    raise LazynnError(
        message(
            "lazynn.materialize",
            "each tensor of the build on meta still on meta (materialize gives it its "
            "values), or loaded from a checkpoint since",
            "tensors replaced since the build by something other than a load ("
            "module.to_empty(), which leaves uninitialized memory, or an assignment): "
            + ", ".join(f"'{t}'" for t in named[:8])
            + (" ..." if len(named) > 8 else ""),
            "materialize before to_empty (it allocates each tensor, or each rank's shard of "
            "it, with the eager values: build(..., device='meta'), shard, materialize), or "
            "load a checkpoint into them (load_state_dict(..., assign=True))",
            outcome="the model is unchanged",
        )
    )


def install(model: nn.Module, target: torch.device, advance: Any = None, threads: int = 1) -> int:
    """Give every meta tensor of ``model`` that keeps a program its value on ``target`` (see
    the module doc); returns how many elements were allocated. ``advance(n)`` is called as
    they are (a progress bar); ``threads`` draw each large fill in parts."""
    slots = pending(model)
    _check(slots)
    kept = list(programs(model))
    _check_replaced(model, kept)
    tapes: dict[int, tuple[Tape, list[_Slot]]] = {}
    # (every tape, also one whose tensors a checkpoint filled since: it still moves the
    # generators as the eager construction did, drawing through)
    for _, _, program in kept:
        tapes.setdefault(id(program.tape), (program.tape, []))
    for slot in slots:
        tapes[id(slot[3].tape)][1].append(slot)
    count, state, done = 0, None, []
    for tape, mine in tapes.values():  # (each tape's default generator starts where the last ended)
        job = _Install(model, tape, mine, target, advance, threads, state)
        count += job.run()
        state = job.replay.default.get_state()
        done.append(job)
    for job in done:  # (generators moved once every tape ran: a failure leaves them as they were)
        job.replay.finish()
    for module, name, _ in kept:  # (the programs of tensors a checkpoint filled: spent too)
        drop(module, name)
    return count


class _Install:
    """One tape's replay, its values put in their slots (ties: one value for one view)."""

    def __init__(
        self,
        model: nn.Module,
        tape: Tape,
        slots: list[_Slot],
        target: torch.device,
        advance: Any,
        threads: int,
        default: torch.Tensor | None,
    ) -> None:
        self.model, self.slots, self.advance = model, slots, advance
        self.wanted: dict[View, Block | None] = {}
        #: id(a slot's dtensor) -> a new DTensor on the target, whose block the replay fills
        self.shards: dict[int, Any] = {}
        #: id(a slot's dtensor) -> where its block is (copied from a whole value: a tie)
        self.offsets: dict[int, tuple[int, ...]] = {}
        for module, path, name, program in slots:
            tensor = _current(module, name)
            if _is_dtensor(tensor) and id(tensor) not in self.shards:  # (a tie: one shard)
                shard: Any = torch.empty_like(tensor, device=target)
                empty = shard.to_local().numel() == 0  # (an uneven shard: draws, keeps none)
                offset = (0,) * shard.ndim if empty else block_offset(shard, _label(path, name))
                self.shards[id(tensor)] = shard
                self.offsets[id(tensor)] = offset
                if program.view not in self.wanted:
                    self.wanted[program.view] = Block(program.view, offset, shard.to_local())
            elif not _is_dtensor(tensor):
                self.wanted[program.view] = None  # (whole, also when a tie wants a block)
        ranks = _ranks(list(self.shards.values()), target)
        self.replay = Replay(tape, target, default, ranks=ranks, threads=threads)
        #: (view, id(the slot's meta tensor)) -> what took its place
        self.made: dict[tuple[View, int], Any] = {}
        self.count = 0

    def run(self) -> int:
        with torch.inference_mode(False):
            values = self.replay.run(self.wanted)
        for slot in self.slots:
            self.put(slot, values[slot[3].view])
        return self.count

    def put(self, slot: _Slot, value: torch.Tensor) -> None:
        module, _, name, program = slot
        tensor = _current(module, name)
        key = (program.view, id(tensor))
        if key not in self.made:
            shard = self.shards.get(id(tensor))
            if shard is not None and self.wanted.get(program.view) is None:
                # (a tie of a sharded slot and a whole one: the block from the whole value)
                local = shard.to_local()
                offset = self.offsets[id(tensor)]
                index = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
                with torch.no_grad():
                    local.copy_(value[index])
            made = _value(tensor, program, value, shard)
            self.made[key] = made
            self.count += made.numel()
            if self.advance is not None:
                self.advance(made.numel())
        _put(module, name, self.made[key])
        drop(module, name)


def _ranks(shards: list[Any], target: torch.device) -> Ranks | None:
    """The ranks replaying a tape together: every process of the default group, when the
    shards' meshes span it and it reduces CPU tensors (gloo); else None (each rank draws
    ``trunc_normal_``'s rounds whole)."""
    import torch.distributed as dist

    if not shards or target.type != "cpu" or not dist.is_initialized():
        return None
    if dist.get_backend() == "nccl":
        return None
    size = dist.get_world_size()
    if any(shard.device_mesh.size() != size for shard in shards):
        return None

    def agree(rounds: int) -> int:
        most = torch.tensor([rounds], dtype=torch.int64)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most.item())

    return Ranks(dist.get_rank(), size, agree)


def _value(tensor: Any, program: Program, value: torch.Tensor, shard: Any) -> Any:
    """What takes the slot of the meta ``tensor``: the replay's ``value`` (for a sharded one,
    its shard, now holding its block), of the tensor's dtype and kind, with the Python
    attributes its construction and the user gave it."""
    if shard is not None:
        result: Any = shard  # (its local block is the replay's value)
    else:
        result = value.detach()
        if result.dtype != tensor.dtype:
            result = result.to(tensor.dtype)
    if isinstance(tensor, nn.Parameter):
        result = nn.Parameter(result, tensor.requires_grad)
    for key, attr in {**program.attrs, **tensor.__dict__}.items():
        if not key.startswith("_lazynn") and key not in result.__dict__:
            result.__dict__[key] = attr
    return result


def _put(module: nn.Module, name: str, value: Any) -> None:
    for store in (module._parameters, module._buffers, module.__dict__):
        if name in store:
            store[name] = value
            return


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
