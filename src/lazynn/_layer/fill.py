"""A lazy layer's build, its last step: the eager layer's tensors moved into its placeholders.

The eager layer is constructed (for real, drawing its numbers; or given, from a checkpoint's
layout). :func:`plan_moves` decides, before anything changes, what each placeholder takes:
the eager tensor, converted to the placeholder's dtype and device (as moved since); a tensor a
tied layer's build already put in its place; or, for a layer whose parameters are on meta and
buffers are not (accelerate's ``init_empty_weights``), the buffer's value from a construction
there. A tensor that stands in a placeholder's place and does not fit (a tie to a layer of
another size, ``torch.func``) is refused, naming the layer. :func:`commit` then fills each
placeholder in place (the same Python object: an optimizer holding it trains it), or, where a
tensor must change device type (``.to("meta")``), puts a new one in its slot;
:func:`reset_known_buffers` resets ``num_batches_tracked`` as torch's lazy norms do, and
:func:`take_settings` copies the eager layer's settings (``in_features``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import InferenceError, message, module_path
from .._module.kept import SELF, Init, inits_of
from .._module.placeholder import fill, hooks_materialize
from .._module.state import QUEUE_KEY
from .._module.tensors import Placeholder, is_placeholder, raw
from .._program.record import recording
from .construct import MODULE_KEYS, Slot, by_path, key_text
from .inputs import substitute_error

__all__ = [
    "REPLACED",
    "Move",
    "Pending",
    "commit",
    "copy_kept",
    "goes_through_materialize",
    "materialize_each",
    "plan_moves",
    "reset_as_eager",
    "reset_known_buffers",
    "take_settings",
]

#: initializations written on placeholders, each with the tensor it fills (``_module/kept.py``)
Pending = list[tuple[Init, torch.Tensor]]

#: a placeholder's attribute: the tensor a build put in its place on another device type
REPLACED = "_lazynn_replaced_by"


@dataclass(frozen=True)
class Move:
    """What one placeholder (``tensor``, in ``module``'s slot ``name``) takes: ``value``."""

    module: nn.Module
    name: str
    tensor: Placeholder
    value: torch.Tensor
    #: the dtype it takes after its kept initializations have run, or None
    later: torch.dtype | None = None


def plan_moves(
    layer: nn.Module,
    eager: nn.Module,
    placed: Iterable[tuple[Slot, torch.Tensor]],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    elsewhere: Callable[[torch.device], nn.Module],
) -> list[Move]:
    """What each placeholder of ``layer`` takes from ``eager`` (see the module doc).
    ``device`` / ``dtype``: where and as what the build makes them (None: as each placeholder
    was moved); ``elsewhere(device)``: the eager layer constructed on another device, for
    buffers that are not on meta with their parameters."""
    eager_modules, own_modules = by_path(eager), by_path(layer)
    real: dict[torch.device, dict[str, nn.Module]] = {}

    def eager_value(prefix: str, name: str, held: torch.device) -> torch.Tensor:
        value: torch.Tensor = getattr(eager_modules[prefix], name).detach()
        if device is None and value.is_meta and held.type != "meta":
            # Parameters on meta and buffers not (accelerate's init_empty_weights): the
            # buffers get the values an eager construction there gives them, drawing
            # nothing (an eager layer under init_empty_weights draws nothing either).
            if held not in real:
                real[held] = dict(elsewhere(held).named_modules())
            value = getattr(real[held][prefix], name).detach()
        return value

    moves = []
    for (prefix, name), tensor in placed:  # allocate everything first, commit after
        if not is_placeholder(tensor):
            continue
        value = eager_value(prefix, name, raw(tensor).device)
        # tied to a layer whose build put a new tensor in its place: take it (the tie holds)
        replaced = tensor.__dict__.get(REPLACED)
        if replaced is not None and tuple(replaced.shape) == tuple(value.shape):
            moves.append(Move(own_modules[prefix], name, tensor, replaced))
            continue
        current = getattr(own_modules[prefix], name)
        if current is not tensor and (
            is_placeholder(current) or tuple(current.shape) != tuple(value.shape)
        ):
            path = module_path(layer)
            raise substitute_error(path, key_text((prefix, name)), value.shape, current)
        held = raw(tensor)
        target_device = held.device if device is None else value.device
        target_dtype = held.dtype if dtype is None or not value.is_floating_point() else dtype
        later = None
        written = inits_of(tensor) or QUEUE_KEY in layer.__dict__  # (kept, or queued on it)
        here = device is None or torch.device(device).type == "meta"  # (where it was declared)
        if written and value.dtype != target_dtype and here and dtype is None:
            # (moved to another dtype since: eager code initialized it in the dtype it was
            # made in, then moved it; the work written on it runs first, then the move)
            later, target_dtype = target_dtype, value.dtype
        if value.device != target_device or value.dtype != target_dtype:
            value = value.to(device=target_device, dtype=target_dtype)
        moves.append(Move(own_modules[prefix], name, tensor, value, later))
    return moves


def reset_known_buffers(
    layer: nn.Module, eager: nn.Module, names: Iterable[str], device: torch.device | str | None
) -> None:
    """``num_batches_tracked``: eager's value (zero) in place, as torch's lazy norms reset it
    (the snapshot puts it back on a rollback); a new tensor where the build moves it."""
    known: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for name in names:
        current, built = layer._buffers.get(name), eager._buffers.get(name)
        if current is not None and built is not None and not is_placeholder(current):
            where = current.device if device is None else built.device
            zero = torch.zeros(built.shape, dtype=current.dtype, device=where)
            known.append((name, current, zero))
    for name, current, value in known:
        if current.device == value.device and not current.is_inference():
            with torch.no_grad():
                current.copy_(value)
        else:
            layer._buffers[name] = value


def commit(moves: list[Move]) -> Pending:
    """Fill each placeholder with its value (see the module doc); returns the initializations
    written on the placeholders, each with the built tensor, for the caller to run."""
    pending: Pending = []
    for move in moves:
        module, name, tensor, value = move.module, move.name, move.tensor, move.value
        store: dict[str, Any] = (
            module._parameters if name in module._parameters else module._buffers
        )
        inits = inits_of(tensor)
        if value is tensor.__dict__.get(REPLACED):
            store[name] = value
        elif raw(tensor).device.type == value.device.type:
            fill(tensor, value)  # in place: an optimizer holding it trains it
            value = tensor
        else:  # a tensor cannot change device type in place (as eager `.to("meta")`)
            kind = type(tensor).cls_to_become
            new = nn.Parameter(value, tensor.requires_grad) if kind is nn.Parameter else value
            tensor.__dict__[REPLACED] = value = new  # (a snapshot takes it back)
            if store.get(name) is tensor:  # (a slot tied to a built tensor keeps it)
                store[name] = new
        pending += [(init, value) for init in inits]
        if move.later is not None:  # (after every initialization written so far)
            pending.append((Init(_to_dtype, (SELF, move.later), {}), value))
    return pending


def materialize_each(
    layout: nn.Module,
    placed: Iterable[tuple[Slot, torch.Tensor]],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> tuple[Pending, bool]:
    """Materialize each placeholder through its own ``materialize()`` (a subclass may
    override it: ``hooks_materialize``) with the shape of its tensor in ``layout`` (the eager
    layer, on meta or real), as torch's lazy modules build. Returns the initializations
    written on the placeholders, and whether some ``materialize()`` gave another shape."""
    modules = dict(layout.named_modules())
    pending: Pending = []
    changed = False
    for (prefix, name), tensor in placed:
        if not is_placeholder(tensor):
            continue
        like = getattr(modules[prefix], name)
        pending += [(init, tensor) for init in inits_of(tensor)]  # (before it is built)
        kind = dtype if dtype is not None and like.is_floating_point() else None
        tensor.materialize(tuple(like.shape), device=device, dtype=kind)
        changed = changed or tuple(tensor.shape) != tuple(like.shape)
    return pending, changed


def copy_kept(eager: nn.Module, placed: Iterable[tuple[Slot, torch.Tensor]]) -> None:
    """Give each tensor of ``placed`` (just materialized) that has its eager shape the eager
    value (those whose ``materialize()`` changed the shape are left to
    ``reset_parameters()``)."""
    modules = dict(eager.named_modules())
    with torch.no_grad():
        for (prefix, name), tensor in placed:
            value = getattr(modules[prefix], name)
            if tensor is not value and tuple(tensor.shape) == tuple(value.shape):
                tensor.copy_(value)


def goes_through_materialize(
    placed: Iterable[tuple[Slot, torch.Tensor]], device: torch.device | str | None
) -> bool:
    """Whether a build goes through the placeholders' own ``materialize()``: one has its
    own (``hooks_materialize``), and they stay on their device type (a build recorded on
    meta, or one that moves them to another device type, fills them as any placeholder)."""
    placed = list(placed)
    if recording() is not None or not any(hooks_materialize(t) for _, t in placed):
        return False
    held = {raw(t).device.type for _, t in placed if is_placeholder(t)}
    return device is None or held == {torch.device(device).type}


def reset_as_eager(layer: nn.Module) -> None:
    """Initialize ``layer``'s tensors by its eager class's ``reset_parameters()`` (or
    ``_reset_parameters()``), as torch's lazy modules do after materializing: for tensors
    whose own ``materialize()`` shaped them otherwise than the eager layer's."""
    eager_class: Any = layer.cls_to_become
    reset = getattr(eager_class, "reset_parameters", None)
    reset = reset if callable(reset) else getattr(eager_class, "_reset_parameters", None)
    if not callable(reset):
        raise InferenceError(
            message(
                module_path(layer),
                "an eager class with reset_parameters() to initialize tensors whose own "
                "materialize() gave them another shape than the eager layer's",
                f"{eager_class.__name__}, which has none",
                "initialize those tensors in your code after the first call, or give the "
                "placeholders a materialize() that keeps the shape it is given",
            )
        )
    own = type(layer)
    layer.__class__ = eager_class  # (its code, on this layer; the build swaps it for good)
    try:
        with torch.no_grad():
            reset(layer)
    finally:
        layer.__class__ = own


def _to_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """Move ``tensor`` to ``dtype`` as ``module.to(dtype)`` does (in place of its data)."""
    tensor.data = tensor.data.to(dtype)


def take_settings(layer: nn.Module, eager: nn.Module) -> None:
    """Give ``layer`` (and its submodules) the eager layer's settings (``in_features``)."""
    own_modules = by_path(layer)
    for prefix, module in by_path(eager).items():
        for key, value in module.__dict__.items():
            if key not in MODULE_KEYS:
                own_modules[prefix].__dict__[key] = value
