"""Tensors as lazynn walks them: a module's own tensors, trees of tensors, meta copies.

One walker for each thing that is walked, so that every part of lazynn sees the same:

* :func:`own_slots` / :func:`own_tensors`: a module's own parameters and buffers (not its
  submodules'), with the dict that holds each, for code that replaces them;
* :func:`map_tensors`: every tensor in nested tuples, lists, dicts, named tuples and
  ``PackedSequence``\\ s;
* :func:`meta_like`: a meta tensor of a tensor's shape and dtype (a symbolic size read by
  its hint, so that torch.compile keeps it symbolic);
* :func:`is_placeholder` and :func:`raw`: what an uninitialized parameter or buffer is
  (:class:`Placeholder`, as type checkers see one), and the empty tensor inside one.

>>> import torch
>>> map_tensors(lambda t: t.shape, ([torch.ones(2)], {"x": torch.ones(3, 1)}, 5))
([torch.Size([2])], {'x': torch.Size([3, 1])}, 5)
>>> meta_like(torch.ones(2, 3)).device
device(type='meta')
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .._errors import shape_str

__all__ = [
    "Placeholder",
    "byte_size",
    "copy_values",
    "describe",
    "hint",
    "is_placeholder",
    "map_tensors",
    "meta_like",
    "move_to_meta",
    "own_slots",
    "own_tensors",
    "raw",
    "shapes",
]

Store = dict[str, Any]

if TYPE_CHECKING:

    class Placeholder(torch.Tensor):
        """A placeholder (an uninitialized parameter or buffer, lazynn's or torch's) as type
        checkers see it: torch's stubs leave out the mixin every placeholder class has, and
        with it ``cls_to_become`` and ``materialize``."""

        cls_to_become: ClassVar[type[torch.Tensor]]
        #: the unbuilt checkpoint entry it was saved as (``LazyModuleMixin.state_dict``)
        _lazynn_checkpoint: str

        def materialize(
            self,
            shape: int | Sequence[int],
            device: torch.device | str | None = None,
            dtype: torch.dtype | None = None,
        ) -> None: ...

else:
    #: the base of every placeholder class, torch's and lazynn's (at run time, the mixin)
    Placeholder = nn.parameter.UninitializedTensorMixin


def is_placeholder(obj: object) -> TypeGuard[Placeholder]:
    """True for a lazynn or torch placeholder (an uninitialized parameter or buffer)."""
    return isinstance(obj, Placeholder)


def raw(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor inside a tensor subclass (a placeholder's is empty, with its dtype
    and device), read without the subclass's ``__torch_function__``."""
    # torch._C.DisableTorchFunctionSubclass is private; torch.Tensor.__torch_function__ uses
    # it for the same purpose. tests/ecosystem/test_torch_internals.py checks that it still exists.
    with torch._C.DisableTorchFunctionSubclass():
        return t.data


def own_slots(module: nn.Module) -> Iterator[tuple[Store, str, torch.Tensor]]:
    """(the dict holding it, its name, the tensor) for each of the module's own parameters,
    then buffers; empty (None) slots are skipped. Safe to replace ``store[name]`` while
    iterating."""
    stores: tuple[Store, ...] = (module._parameters, module._buffers)
    for store in stores:
        for name, tensor in list(store.items()):
            if tensor is not None:
                yield store, name, tensor


def own_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The module's own parameters and buffers (not its submodules'), in that order."""
    return [tensor for _, _, tensor in own_slots(module)]


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, lists, dicts and named tuples.

    A ``PackedSequence`` keeps its ``batch_sizes`` (torch requires them on the CPU).
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, PackedSequence):
        return PackedSequence(
            fn(obj.data),
            obj.batch_sizes,
            None if obj.sorted_indices is None else fn(obj.sorted_indices),
            None if obj.unsorted_indices is None else fn(obj.unsorted_indices),
        )
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(fn, v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj


def shapes(value: Any) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every tensor in ``value``, in :func:`map_tensors` order."""
    found: list[tuple[tuple[int, ...], torch.dtype]] = []
    map_tensors(lambda t: found.append((tuple(t.shape), t.dtype)), value)
    return found


def hint(size: int | torch.SymInt) -> int:
    """A size as an int; a symbolic one (torch.compile's ``dynamic=True``, ``mark_dynamic``)
    by its hint, which adds no guard (``int()`` would specialize the graph to it)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    # torch.fx.experimental.symbolic_shapes is public but experimental: optimization_hint
    # (newer torch) replaced hint_int (older). tests/ecosystem/test_compile.py's mark_dynamic cases
    # cover it. Imported here, not at the top: it imports sympy, which a process has loaded
    # already when it holds a SymInt, and which nothing else of lazynn needs.
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint as read
    except ImportError:  # pragma: no cover - older torch
        from torch.fx.experimental.symbolic_shapes import (  # type: ignore[attr-defined,no-redef]
            hint_int as read,
        )
    return int(read(size))


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor of ``t``'s shape and dtype (sizes read by :func:`hint`)."""
    return torch.empty(tuple(hint(s) for s in t.shape), dtype=t.dtype, device="meta")


def describe(value: object) -> str:
    """A short description of a forward argument for an error message."""
    if isinstance(value, torch.Tensor):
        if is_placeholder(value):
            return f"an unbuilt {type(value).__name__}"
        where = "" if value.is_meta else f" on {value.device}"  # meta: the user gave a shape
        return f"a {value.dtype} tensor of shape {shape_str(value.shape)}{where}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v) for v in value)
        return f"{type(value).__name__}[{inner}]"
    return repr(value) if len(repr(value)) < 60 else type(value).__name__


def copy_values(source: nn.Module, target: nn.Module) -> None:
    """Give ``target`` (a copy of ``source``, built with the same sizes) ``source``'s values."""
    named = [
        (*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False))
        for m in (source, target)
    ]
    for (name, a), (other, b) in zip(*named, strict=True):
        assert name == other, (name, other)
        b.copy_(a)


def byte_size(n: int) -> str:
    """``n`` bytes for a reader: ``512 B``, ``1.50 KiB``, ``37.25 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def move_to_meta(
    module: nn.Module,
    shared: dict[int, torch.Tensor],
    only_shared: bool = False,
    names: Collection[str] | None = None,
) -> None:
    """Move a module's own tensors to meta, one meta tensor per real one (ties kept);
    ``only_shared``: move only those another module already moved (its tied weights);
    ``names``: move only these (and the shared ones), the others keep their values."""
    for store, name, tensor in own_slots(module):
        moved = id(tensor) in shared
        if tensor.is_meta or (only_shared and not moved):
            continue
        if names is not None and name not in names and not moved:
            continue  # (its initializer does not write it: materialize could not remake it)
        if id(tensor) not in shared:
            meta = torch.empty_like(tensor, device="meta")
            shared[id(tensor)] = (
                nn.Parameter(meta, tensor.requires_grad)
                if isinstance(tensor, nn.Parameter)
                else meta
            )
        store[name] = shared[id(tensor)]
