"""materialize() of a model the factory form built on meta: adopt a real construction's tensors.

``lazynn.build(Net, example, device="meta")`` records how the model was made (a
:class:`~lazynn._module.state.FactoryRecipe`). Its values are whatever ``Net.__init__`` computes: an
init loop, a mask or rotary-frequency buffer, a gain filled in ``__init__``, ties. No
per-module initializer reproduces all that, so :func:`adopt` runs the construction once more,
for real on the target (``_factory.realize``: the eager program, drawing what it draws), and
each tensor still on meta takes the value of its counterpart (same module path and name):

* a plain tensor: the counterpart itself (no copy);
* a sharded parameter (a ``DTensor`` of FSDP2 or tensor parallel): its local shard is
  allocated and takes this rank's block of the counterpart (``__create_chunk_list__``).

So every tensor gets the eager model's value, and the random generator ends where eager
construction leaves it. Tensors that are no longer on meta (loaded with ``assign=True``) keep
theirs. A tensor with no counterpart of its shape (the model was changed since the build) is
refused, naming it, before anything changes. The cost: one eager construction on the target;
on a sharded model each rank constructs the whole model and keeps its blocks (peak memory of
one unsharded model per rank, for the moment of the construction).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._build.factory import realize
from .._errors import LazynnError, message
from .._module.state import FactoryRecipe
from .._module.tensors import own_slots
from .sharded import block_offset

__all__ = ["adopt"]


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"


def _counterpart(module: nn.Module | None, name: str, store_is_params: bool) -> Any:
    if module is None:
        return None
    store = module._parameters if store_is_params else module._buffers
    found = store.get(name)
    if found is None:
        found = module._parameters.get(name, module._buffers.get(name))
    return found


def adopt(model: nn.Module, recipe: FactoryRecipe, target: torch.device) -> None:
    """Give every meta tensor of ``model`` its value from a real construction of ``recipe``
    on ``target`` (see the module doc)."""
    with torch.device(target):
        fresh = realize(recipe)
    theirs = dict(fresh.named_modules())
    plan: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
    missing: list[str] = []
    for path, module in model.named_modules():
        other = theirs.get(path)
        for store, name, tensor in own_slots(module):
            if not tensor.is_meta:
                continue
            value = _counterpart(other, name, store is module._parameters)
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(tensor.shape):
                missing.append(f"{path}.{name}" if path else name)
                continue
            plan.append((store, name, tensor, value))
        for key, attribute in list(module.__dict__.items()):
            if isinstance(attribute, torch.Tensor) and attribute.is_meta:  # (a plain attribute)
                value = other.__dict__.get(key) if other is not None else None
                if isinstance(value, torch.Tensor) and value.shape == attribute.shape:
                    plan.append((module.__dict__, key, attribute, value))
                else:
                    missing.append(f"{path}.{key}" if path else key)
    if missing:
        raise LazynnError(
            message(
                "lazynn.materialize",
                "tensors that the model's factory constructs, of the same shapes (the model "
                "was built with lazynn.build(factory, ..., device='meta'))",
                "tensors it does not construct: "
                + ", ".join(f"'{m}'" for m in missing[:8])
                + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""),
                "materialize the model as lazynn.build made it (sharding and loading with "
                "assign=True are fine; other changes made on meta are not)",
                outcome="the model is unchanged",
            )
        )
    adopted: dict[int, torch.Tensor] = {}
    for store, name, tensor, value in plan:
        if id(tensor) not in adopted:
            adopted[id(tensor)] = _taken(tensor, value, target, name)
        store[name] = adopted[id(tensor)]


def _taken(tensor: torch.Tensor, value: torch.Tensor, target: torch.device, name: str) -> Any:
    """What takes ``tensor``'s place: ``value`` (as ``tensor``'s kind and dtype), or for a
    sharded one, a new shard holding this rank's block of ``value``."""
    value = value.detach().to(dtype=tensor.dtype)
    if _is_dtensor(tensor):
        shard = torch.empty_like(tensor, device=target)
        offset = block_offset(shard, name)
        local = shard.to_local()  # type: ignore[attr-defined]
        block = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
        with torch.no_grad():
            local.copy_(value[block])
        value = shard
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(value, tensor.requires_grad)
    return value
