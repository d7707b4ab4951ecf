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

# torch's own key for "the same storage" (see _memory.py)
from torch.multiprocessing.reductions import StorageWeakRef

# TorchDispatchMode lives in a private module, but it is the documented way to write a mode
# ("Extending PyTorch"); tests/materialize/test_materialize.py exercises it.
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Writes"]


def _key(tensor: torch.Tensor) -> StorageWeakRef:
    """The identity of a tensor's storage (a DTensor's: its local shard's); meta tensors,
    whose data pointers are all 0, are told apart by their storage objects. A weak reference:
    while it is held, no other storage can take the written one's place (a temporary an
    initializer wrote and freed does not make a later tensor at its address look written)."""
    local = getattr(tensor, "_local_tensor", tensor)
    return StorageWeakRef(local.untyped_storage())


class Writes(TorchDispatchMode):
    """Records the storages written while active (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.storages: set[StorageWeakRef] = set()

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
                    self.storages.add(_key(tensor))
        return func(*args, **kwargs)

    def wrote(self, tensor: torch.Tensor) -> bool:
        """Whether an op wrote into ``tensor``'s storage while the mode was active."""
        return _key(tensor) in self.storages
