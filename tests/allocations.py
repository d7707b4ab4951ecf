"""What a block of code allocates on real devices, seen from torch's dispatcher.

:class:`Allocations` is a dispatch mode: each storage an op creates (a DTensor counts its
local shard; a view of a tensor made before creates none) is counted while some tensor holds
it, so ``peak`` is the most bytes held at once by what the block made, and ``largest`` the
biggest single storage.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["CHUNK_BYTES", "Allocations"]

#: one chunk of float32 numbers (``lazynn._program.draws.CHUNK``): the most a materialize
#: holds at once beyond what it keeps (a chunk of draws, a part of ``trunc_normal_``'s
#: rounds, a band of a computed tensor's intermediates), for float32 tensors; a chunk of a
#: float64 tensor's draws is twice this
CHUNK_BYTES = (1 << 20) * 4


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank


class Allocations(TorchDispatchMode):
    """Peak and largest bytes the ops run while active allocated (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.largest = 0
        self.largest_op = ""
        self._holders: dict[int, list[int]] = {}  # storage address -> [tensors holding it]

    def _release(self, address: int, nbytes: int) -> None:
        holders = self._holders.get(address)
        if holders is None:
            return
        holders[0] -= 1
        if holders[0] == 0:
            del self._holders[address]
            self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = {
            _local(t).untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            local = _local(tensor)
            storage = local.untyped_storage()
            address, nbytes = storage.data_ptr(), storage.nbytes()
            if address not in self._holders:
                if address in before:
                    continue  # a view of a tensor made before
                self._holders[address] = [0]
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                if nbytes > self.largest:
                    self.largest, self.largest_op = nbytes, str(func)
            self._holders[address][0] += 1
            weakref.finalize(local, self._release, address, nbytes)
        return out
