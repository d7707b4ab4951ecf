"""Which tensors an initializer writes: so that no path leaves uninitialized memory.

``materialize`` gives a module's meta tensors memory, then runs the module's initializer
(``reset_parameters()``). A tensor the initializer does not write (a causal-mask buffer, a
rotary-frequency buffer, a gain filled in ``__init__``) would hold whatever the memory held.
:class:`Writes`, a dispatch mode active around initializers, records every storage an op
writes (in place, or through ``out=``), so that such tensors are found: ``build(...,
device="meta")`` keeps them off meta (their constructed values stay), and ``materialize``
refuses a model where one is left, naming it.

>>> import torch
>>> a, b = torch.empty(2), torch.empty(2)
>>> with Writes() as writes:
...     _ = a.fill_(1.0)
>>> writes.wrote(a), writes.wrote(b)
(True, False)
"""

from __future__ import annotations

from typing import Any

import torch

# torch's own key for "the same storage" (see _summary/memory.py)
from torch.multiprocessing.reductions import StorageWeakRef

# TorchDispatchMode lives in a private module, but it is the documented way to write a mode
# ("Extending PyTorch"); tests/building/test_materialize.py exercises it.
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Writes"]


def _key(tensor: torch.Tensor) -> StorageWeakRef:
    """The identity of a tensor's storage (a DTensor's: its local shard's); meta tensors,
    whose data pointers are all 0, are told apart by their storage objects. A weak reference:
    while it is held, no other storage can take the written one's place (a temporary an
    initializer wrote and freed does not make a later tensor at its address look written)."""
    local = getattr(tensor, "_local_tensor", tensor)
    return StorageWeakRef(local.untyped_storage())


#: ops that make a tensor without setting its elements
_EMPTY = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
)

#: where a write went in its storage: (size, stride, offset), in elements
_Where = tuple[tuple[int, ...], tuple[int, ...], int]


class Writes(TorchDispatchMode):
    """Records which elements of which storages are written while active (see the module
    doc): a write through a view (``w[0].normal_()``) sets that view's elements only. A tensor
    an op makes (``torch.randn``, ``zeros``) is written whole, unless the op is an ``empty``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # (else torch wraps __torch_dispatch__ in a dynamo "disable", which imports
        # torch._dynamo, 1-2 s, at the first op; this mode never runs under torch.compile)
        return False

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        #: storage -> None (written whole) or where its partial writes went
        self.storages: dict[StorageWeakRef, list[_Where] | None] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    self._note(tensor)
        result = func(*args, **kwargs)
        if func._schema.name.split("::")[-1] not in _EMPTY and not any(
            r.alias_info is not None for r in func._schema.returns
        ):
            for tensor in result if isinstance(result, (list, tuple)) else (result,):
                if isinstance(tensor, torch.Tensor):
                    self.storages[_key(tensor)] = None  # (made by it: set whole)
        return result

    def _note(self, tensor: torch.Tensor) -> None:
        local = getattr(tensor, "_local_tensor", tensor)
        key = _key(tensor)
        partial = self.storages.get(key, [])
        if partial is None:  # (written whole already)
            return
        where = (tuple(local.shape), tuple(local.stride()), int(local.storage_offset()))
        if _whole(local, where):
            self.storages[key] = None
        else:
            partial.append(where)
            self.storages[key] = partial

    def wrote(self, tensor: torch.Tensor) -> bool:
        """Whether ops set every element of ``tensor`` while the mode was active."""
        found = self.storages.get(_key(tensor), [])
        if found is None:
            return True
        if not found:
            return False
        local = getattr(tensor, "_local_tensor", tensor)
        mask = torch.zeros(_elements(local), dtype=torch.bool)
        for size, stride, offset in found:
            torch.as_strided(mask, size, stride, offset).fill_(True)
        mine = torch.as_strided(
            mask, tuple(local.shape), tuple(local.stride()), int(local.storage_offset())
        )
        return bool(mine.all())


def _elements(tensor: torch.Tensor) -> int:
    """How many elements of ``tensor``'s dtype its storage holds."""
    return int(tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1))


def _whole(tensor: torch.Tensor, where: _Where) -> bool:
    """Whether a write through ``where`` sets every element of ``tensor``'s storage."""
    size, _, offset = where
    numel = 1
    for n in size:
        numel *= n
    return offset == 0 and numel == _elements(tensor) and tensor.is_contiguous()
