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

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from .._module.placeholder import relocate
from .._module.state import find_state
from .._module.tensors import is_placeholder, own_slots, raw

__all__ = ["ATTRIBUTES", "StandIns", "meta_version", "placeholders_on_meta", "swap_back"]


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


#: the containers a call's arguments nest tensors in
_NESTED = (tuple, list, dict)
#: what a tensor's attribute read or write reaches a function mode as (``t.shape``: the
#: descriptor's ``__get__``)
ATTRIBUTES = frozenset({"__get__", "__set__"})
#: what reads a tensor as the object it is (its hash is its identity; a copy of it is a copy
#: of its values, as in eager code), not through its stand-in
_AS_ITSELF = frozenset({"__hash__", "__deepcopy__", "__reduce_ex__", "__getstate__"})


class StandIns:
    """The stand-ins of one rehearsal (see the module doc): ``of(t)`` makes or finds one,
    ``seen(args)`` replaces the real tensors of a call's arguments, ``shown(out)`` gives a
    stand-in back as its real tensor."""

    def __init__(
        self,
        tensors: Iterable[torch.Tensor] = (),
        make: Callable[[torch.Tensor], torch.Tensor] = meta_version,
    ) -> None:
        #: how a stand-in is made (a meta one; the training estimate's: a fake CPU one)
        self.make = make
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

    def stand_in(self, tensor: torch.Tensor, stand_in: torch.Tensor) -> None:
        """Show ``tensor`` (a placeholder the run gave a meta one in its slots) as
        ``stand_in``, wherever else the forward reaches it."""
        self._model[id(tensor)] = tensor
        self._of[id(tensor)] = stand_in

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stand-in of the real ``tensor``."""
        found = self._of.get(id(tensor))
        if found is not None:
            return found
        with torch.inference_mode(False):  # (a forward inside the mode: as the model's)
            stand_in = self._of[id(tensor)] = self.make(tensor)
        self._back[id(stand_in)] = tensor
        return stand_in

    def through(
        self,
        name: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    ) -> Any:
        """A call a function mode sees (``name``: its function's), made by ``call(args,
        kwargs)`` on the stand-ins of the model's tensors, its result given back as theirs."""
        if name in ATTRIBUTES:  # (a tensor's attribute read or write: the stand-in's)
            if args and self.needs(args[0]):
                return self.shown(call((self.of(args[0]), *self.seen(args[1:])), kwargs))
            return call(args, kwargs)
        if name in _AS_ITSELF:
            return call(args, kwargs)
        return self.shown(call(self.seen(args), self.seen(kwargs)))

    def seen(self, value: Any) -> Any:
        """``value`` (a call's arguments: tensors, and lists, tuples and dicts of them) with
        each of the model's tensors replaced by its stand-in; ``value`` itself when none is
        (the common case, found without copying)."""
        if not self._reaches(value):
            return value
        return self._replaced(value)

    def _reaches(self, value: Any) -> bool:
        model = self._model
        if type(value) in (tuple, list):
            return any(id(v) in model or (type(v) in _NESTED and self._reaches(v)) for v in value)
        if isinstance(value, dict):
            return any(self._reaches(v) for v in value.values()) if value else False
        if isinstance(value, (list, tuple)):  # (a named tuple, a subclass)
            return any(self._reaches(v) for v in value)
        return id(value) in model

    def _replaced(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.of(value) if self.needs(value) else value
        if isinstance(value, (list, tuple)):
            items = [self._replaced(v) for v in value]
            if type(value) in (list, tuple):
                return type(value)(items)
            if hasattr(value, "_fields"):  # a named tuple
                return type(value)(*items)
            return type(value)(items)
        if isinstance(value, dict):
            return {k: self._replaced(v) for k, v in value.items()}
        return value

    def shown(self, value: Any) -> Any:
        """A call's result with each stand-in given back as its real tensor (the result
        itself, or an item of a tuple or list of results)."""
        if isinstance(value, torch.Tensor):
            return self._back.get(id(value), value)
        if type(value) in (tuple, list) and any(id(v) in self._back for v in value):
            return type(value)(self._back.get(id(v), v) for v in value)
        return value


@contextlib.contextmanager
def placeholders_on_meta(
    modules: dict[str, nn.Module], seen: StandIns | None = None
) -> Iterator[dict[str, dict[str, int]]]:
    """Inside, each placeholder of ``modules`` (by their paths in the model) is a meta
    placeholder for the run, which its layer's build fills on meta, and each real buffer a
    lazy layer's build resets (``num_batches_tracked``) a copy of itself: the same objects,
    their contents swapped (``torch.utils.swap_tensors``), so that what holds one elsewhere
    (a list, a registry by ``id()``, a tie) holds it still. Each gets its own content back on
    exit, before the run's snapshot puts back the rest. One whose content torch will not swap
    (something holds it weakly: a compiled model's guards) is replaced in its slots instead
    (the snapshot puts them back), and ``seen``, the run's stand-ins, then show it as its
    meta one wherever else the forward reaches it. Yields, for each module holding
    placeholders, by its path, the ``id()`` of the tensor in each of its slots (what counts
    ties once)."""
    #: id -> (the tensor, its content for the run, the slots and state maps holding it)
    wanted: dict[int, tuple[torch.Tensor, torch.Tensor, list[tuple[dict[Any, Any], Any]]]] = {}

    def for_the_run(tensor: torch.Tensor, place: tuple[dict[Any, Any], Any]) -> None:
        if id(tensor) not in wanted:
            placeholder = is_placeholder(tensor)
            other = relocate(tensor, "meta") if placeholder else tensor.detach().clone()
            wanted[id(tensor)] = (tensor, other, [])
        wanted[id(tensor)][2].append(place)

    held: dict[str, dict[str, int]] = {}
    for path, module in modules.items():
        slots = list(own_slots(module))
        state = find_state(module)
        if state is None and not any(is_placeholder(t) for _, _, t in slots):
            continue
        held[path] = {name: id(t) for _, name, t in slots}
        for store, name, tensor in slots:
            if is_placeholder(tensor) and not raw(tensor).is_meta:
                for_the_run(tensor, (store, name))
        lazy = state.placeholders if state is not None else {}
        for key, tensor in lazy.items():
            if is_placeholder(tensor) and not raw(tensor).is_meta:
                for_the_run(tensor, (lazy, key))
        known = getattr(type(module), "known_buffers", ()) if state is not None else ()
        for name in known:  # (a real buffer its build resets: a copy for the run)
            buffer = module._buffers.get(name)
            if buffer is not None and not is_placeholder(buffer):
                for_the_run(buffer, (module._buffers, name))
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        for tensor, other, places in wanted.values():
            try:
                torch.utils.swap_tensors(tensor, other)
            except RuntimeError:  # (held weakly: replaced in its places, put back after)
                for holder, key in places:
                    holder[key] = other
                if seen is not None and is_placeholder(tensor):
                    seen.stand_in(tensor, other)
                continue
            swapped.append((tensor, other))
        yield held
    finally:
        for tensor, other in reversed(swapped):
            swap_back(tensor, other)


def swap_back(tensor: torch.Tensor, other: torch.Tensor) -> None:
    """Give ``tensor`` back the content :func:`placeholders_on_meta` swapped into ``other``,
    even where the run made weak references to it (a recurrent layer's flat weights):
    they refer to the object, which keeps its identity. ``torch.utils.swap_tensors`` refuses
    any weakly held tensor; this is its swap without that check (``torch._C.
    _swap_tensor_impl``: private, guarded by tests/ecosystem/test_torch_internals.py)."""
    tensor.__class__, other.__class__ = other.__class__, tensor.__class__
    tensor.__dict__, other.__dict__ = other.__dict__, tensor.__dict__
    torch._C._swap_tensor_impl(tensor, other)
