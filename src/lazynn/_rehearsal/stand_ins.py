"""The model's real tensors as a rehearsal sees them: meta tensors of their shape.

A rehearsal runs the model itself: its own modules, hooks and Python state, so the user's code
sees the objects, ``id()`` and ``type()`` an eager forward sees. Its parameters and buffers
stay where they are, with their values, for every other thread. On the rehearsal's thread,
under its device mode (``meta_device.MetaDevice``), each tensor the model holds (its
parameters and buffers, and any tensor its modules reach: a mask kept as an attribute, a
cache in a dict; on meta too: their version counters are not moved either) is seen through a
*stand-in*: a meta tensor of its shape, strides, dtype and ``requires_grad`` (a parameter's
an ``nn.Parameter``), made at its first use and kept for the run. What the forward does to a
real tensor (an op, an attribute read such as ``.device`` or ``.shape``, an attribute write, an
in-place op) it does to the stand-in, so the real tensor is never written; a result that is the
stand-in itself (an in-place op returns its input) is given back as the real tensor, so
``self.buf.add_(1) is self.buf`` holds as in eager code. One tensor has one stand-in, so ties
hold.

A tensor the forward makes on a real device by name (``torch.ones(2, device="cpu")``) is
not the model's: it is computed for real, as in eager code. Integer scalars (BatchNorm's
``num_batches_tracked``) stand in as a real CPU copy: a forward that reads its value
(``momentum=None``) reads it, and what it adds stays in the copy.
Placeholders are not seen through: the rehearsal gives each one a meta placeholder for the
run, which its layer's build fills (``rehearse.py``).

>>> import torch
>>> weight = torch.nn.Parameter(torch.ones(2, 3))
>>> seen = StandIns([weight])
>>> stand_in = seen.of(weight)
>>> stand_in.device.type, tuple(stand_in.shape), type(stand_in).__name__
('meta', (2, 3), 'Parameter')
>>> seen.of(weight) is stand_in, seen.shown(stand_in) is weight
(True, True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from .._module.placeholder import relocate
from .._module.tensors import is_placeholder

__all__ = ["StandIns", "meta_version"]


def meta_version(tensor: torch.Tensor) -> torch.Tensor:
    """A stand-in for a real tensor or a placeholder (any kind): a meta one, but for an
    integer scalar (a counter), which stays a real CPU scalar."""
    if is_placeholder(tensor):
        return relocate(tensor, "meta")
    if tensor.dim() == 0 and not tensor.is_floating_point() and not tensor.is_complex():
        # a counter (BatchNorm's num_batches_tracked): a real one, for a forward that reads
        # it (momentum=None); its value decides no shape (meta, or elsewhere: a zero)
        if tensor.device.type == "cpu":
            return tensor.detach().clone()
        return torch.zeros((), dtype=tensor.dtype)
    # (a new tensor, even of a meta one: a detached one would share its version counter)
    meta = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="meta")
    meta.requires_grad_(tensor.requires_grad and not isinstance(tensor, nn.Parameter))
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(meta, tensor.requires_grad)
    return meta


class StandIns:
    """The stand-ins of one rehearsal (see the module doc): ``of(t)`` makes or finds one,
    ``seen(args)`` replaces the real tensors of a call's arguments, ``shown(out)`` gives a
    stand-in back as its real tensor."""

    def __init__(self, tensors: Iterable[torch.Tensor] = ()) -> None:
        #: id -> the model's real tensors (kept: their ids are not reused while the run lasts)
        self._model: dict[int, torch.Tensor] = {}
        self.add(tensors)
        #: id(real tensor) -> its stand-in
        self._of: dict[int, torch.Tensor] = {}
        #: id(stand-in) -> its real tensor
        self._back: dict[int, torch.Tensor] = {}

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count ``tensors`` among the model's (placeholders left out)."""
        for tensor in tensors:
            if not is_placeholder(tensor):
                self._model[id(tensor)] = tensor

    def needs(self, value: Any) -> bool:
        """Whether ``value`` is one of the model's tensors (seen through a stand-in)."""
        return id(value) in self._model and self._model[id(value)] is value

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stand-in of the real ``tensor``."""
        found = self._of.get(id(tensor))
        if found is not None:
            return found
        stand_in = self._of[id(tensor)] = meta_version(tensor)
        self._back[id(stand_in)] = tensor
        return stand_in

    def seen(self, value: Any) -> Any:
        """``value`` (a call's arguments: tensors, and lists, tuples and dicts of them) with
        each real tensor replaced by its stand-in; ``value`` itself when none is."""
        if isinstance(value, torch.Tensor):
            return self.of(value) if self.needs(value) else value
        if isinstance(value, (list, tuple)):
            items = [self.seen(v) for v in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            if type(value) in (list, tuple):
                return type(value)(items)
            if hasattr(value, "_fields"):  # a named tuple
                return type(value)(*items)
            return type(value)(items)
        if isinstance(value, dict):
            changed = {k: self.seen(v) for k, v in value.items()}
            if all(changed[k] is v for k, v in value.items()):
                return value
            return changed
        return value

    def shown(self, value: Any) -> Any:
        """A call's result with each stand-in given back as its real tensor (the result
        itself, or an item of a tuple or list of results)."""
        if isinstance(value, torch.Tensor):
            return self._back.get(id(value), value)
        if type(value) in (tuple, list) and any(id(v) in self._back for v in value):
            return type(value)(self._back.get(id(v), v) for v in value)
        return value
