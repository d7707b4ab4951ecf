"""What a forward may write that a model's modules reach, to any depth, and how it is put back.

A rehearsal runs the model's own forward (``_rehearsal/rehearse.py``), which may write any
state its modules share: a list the blocks append to, a dict one block fills and another
reads, a counter in a state object, a cache on a module. :class:`Reach`, taken by a
``Snapshot(reach=True)`` before the run, holds what it must put back after: the dicts, lists,
sets and deques in the modules' attributes and in those; the attribute dicts (and slots) of
the other objects there that are state (objects of the user's classes, namespaces: a shared
state object, a config, a module stashed outside the tree, a torch distribution); closure
cells; tensors' own attribute dicts; the states of torch's, Python's and numpy's random
generators; arrays' and bytearrays' values; weak dictionaries' items; and an instance's
``lru_cache`` (cleared, where the run computed an entry: its entries are the run's meta
tensors).

Modules of Python, classes, functions' globals, the runtime's objects (locks, events, threads,
loggers, files: another thread may be waiting on them), torch's and numpy's other objects,
iterators and counters (``itertools.count``: no state to take), and numpy arrays (a model may
reach gigabytes of them, a dataset through a trainer: a forward that writes one is not put
back) are not the model's state, and are not taken; nor are lazynn's own objects a model holds while
lazynn works on it (a rehearsal's recording hooks, bound to its run: :data:`UNREACHED`).
Tensors' values are not taken either: a rehearsal writes only their stand-ins.

:func:`put_back` writes a container back only where it differs from what was taken. It
cannot tell the run's writes from another thread's: a change another thread makes meanwhile
to state the snapshot took is undone with the run's (``docs/design.md``, "Threads").

>>> from torch import nn
>>> block = nn.Module()
>>> block.shared = {"seen": []}
>>> reach = Reach([(block, type(block), dict(block.__dict__))], [])
>>> block.shared["seen"].append(1); block.shared["extra"] = 2
>>> reach.restore()
>>> block.shared
{'seen': []}
"""

from __future__ import annotations

import array
import collections
import dataclasses
import functools
import random
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .state import LazyState

__all__ = ["UNREACHED", "Reach", "put_back"]


def put_back(container: Any, content: Any) -> None:
    """Give ``container`` (a dict, list, set or deque) back ``content`` (None: empty), in
    place, where it differs (by identity of its items, in order)."""
    if content is None:
        if container:
            container.clear()
    elif isinstance(container, dict):
        if len(container) != len(content) or any(
            a is not b or x is not y
            for (a, x), (b, y) in zip(container.items(), content.items(), strict=True)
        ):
            container.clear()
            container.update(content)
    elif isinstance(container, set):
        if container != content:
            container.clear()
            container.update(content)
    elif len(container) != len(content) or any(
        a is not b for a, b in zip(container, content, strict=True)
    ):
        if isinstance(container, list):
            container[:] = content
        else:  # a deque
            container.clear()
            container.extend(content)


#: a class attribute: lazynn's own objects a model may hold while lazynn works on it (a
#: rehearsal's recording hooks, bound to its run), which a snapshot does not take
UNREACHED = "_lazynn_unreached"
#: weak proxies (a trainer's back reference): not the model's, and a dead one refuses reads
_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
#: types a forward may write in place, taken whole by :class:`Reach`
_HOLDERS = (dict, list, set, collections.deque)
#: types whose instances hold nothing of the model (or nothing a forward writes)
_LEAVES = (
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    weakref.ReferenceType,
    weakref.ProxyType,
    weakref.CallableProxyType,
    str,
    bytes,
    int,
    float,
    complex,
    range,
    slice,
    property,
    torch.dtype,
    torch.device,
    torch.Size,
    torch.layout,
    torch.memory_format,
)


class Reach:
    """What a forward may write that ``modules`` (a snapshot's: each with its class and
    attribute dict) and ``containers`` (the snapshot's, each with its content) reach, to any
    depth, and its :meth:`restore` (see the module doc)."""

    def __init__(
        self, modules: list[tuple[nn.Module, type, dict[str, Any]]], containers: list[Any]
    ) -> None:
        #: (a container, its content): the dicts, lists, sets and deques reached
        self.holders: list[tuple[Any, Any]] = []
        #: (an object, its attribute dict): objects reached, and tensors' own attributes
        self.objects: list[tuple[Any, dict[str, Any]]] = []
        #: (an object, its slot values by name: absent ones left out)
        self.slots: list[tuple[Any, dict[str, Any]]] = []
        #: (a closure's cell, its content)
        self.cells: list[tuple[types.CellType, Any]] = []
        #: (a private random generator, its state)
        self.generators: list[tuple[torch.Generator, torch.Tensor]] = []
        #: (a module outside the tree, its class)
        self.classes: list[tuple[nn.Module, type]] = []
        #: what puts back objects whose state is not an attribute dict (Python's and numpy's
        #: random generators, numpy arrays, weak dictionaries, caches of functions)
        self.opaque: list[Callable[[], None]] = []
        #: the tensors reached (placeholders included)
        self.tensors: list[torch.Tensor] = []
        seen = {id(m) for m, _, _ in modules} | {id(c) for c, _ in containers}
        self._seen = seen
        pending: list[Any] = []
        for _, _, attrs in modules:
            pending.extend(attrs.values())
        for container, _ in containers:
            pending.extend(_items(container))
        self._walk(pending)

    def _walk(self, pending: list[Any]) -> None:
        seen = self._seen
        while pending:
            value = pending.pop()
            if (
                id(value) in seen
                or type(value) in _PROXIES  # (before isinstance, which a dead one refuses)
                or isinstance(value, _LEAVES)
                or value is None
                or getattr(type(value), UNREACHED, False)
            ):
                continue
            seen.add(id(value))
            if isinstance(value, torch.Tensor):
                # (its values: a rehearsal writes only stand-ins; its attribute dict, here)
                self.objects.append((value, dict(value.__dict__)))
                self.tensors.append(value)
                continue
            if isinstance(value, _HOLDERS):
                self.holders.append((value, _content(value) if value else None))
                pending.extend(_items(value))
                if type(value) in (dict, list, set):
                    continue  # (a subclass may hold attributes of its own too)
            elif isinstance(value, (tuple, frozenset)):
                pending.extend(value)
                continue
            elif isinstance(value, types.FunctionType):
                for cell in value.__closure__ or ():
                    try:
                        content = cell.cell_contents
                    except ValueError:  # (a name not bound yet)
                        continue
                    self.cells.append((cell, content))
                    pending.append(content)
                continue
            elif isinstance(value, types.MethodType):
                pending.extend((value.__self__, value.__func__))
                continue
            elif isinstance(value, functools.partial):
                pending.extend((value.func, value.args, value.keywords))
            elif isinstance(value, torch.Generator):
                self.generators.append((value, value.get_state()))
                continue
            elif isinstance(value, LazyState):
                continue  # (a module's own: the snapshot holds it)
            restorer = _opaque(value)
            if restorer is not None:
                self.opaque.append(restorer)
                continue
            if isinstance(value, nn.Module):
                self.classes.append((value, type(value)))
            elif not _state_object(value):
                continue
            try:
                attrs = object.__getattribute__(value, "__dict__")
            except AttributeError:  # (no attribute dict: slots only, or none)
                attrs = None
            if isinstance(attrs, dict):
                self.objects.append((value, dict(attrs)))
                pending.extend(attrs.values())
            slots = _slot_values(value)
            if slots:
                self.slots.append((value, slots))
                pending.extend(v for v in slots.values() if v is not _ABSENT)

    def restore(self) -> None:
        for module, cls in self.classes:
            if module.__class__ is not cls:
                module.__class__ = cls
        for holder, content in self.holders:
            put_back(holder, content)
        for obj, attrs in self.objects:
            put_back(obj.__dict__, attrs or None)
        for obj, slots in self.slots:
            now_values = _slot_values(obj)
            for name, slot_value in slots.items():
                now = now_values.get(name, _ABSENT)
                if now is slot_value:
                    continue
                if slot_value is _ABSENT:  # (set by the run: unset again)
                    object.__delattr__(obj, name)
                else:
                    object.__setattr__(obj, name, slot_value)
        for cell, content in self.cells:
            if cell.cell_contents is not content:
                cell.cell_contents = content
        for generator, state in self.generators:
            if not torch.equal(generator.get_state(), state):
                generator.set_state(state)
        for restorer in self.opaque:
            restorer()


_ABSENT = object()


#: the top-level packages whose objects are not a model's state (the interpreter's runtime:
#: locks, events, threads, loggers, files; torch's and numpy's own objects), but for these
_NOT_STATE = frozenset({*sys.stdlib_module_names, "torch", "numpy"}) - {"__main__"}
_STATE_TYPES = frozenset({("types", "SimpleNamespace"), ("argparse", "Namespace")})


def _state_object(value: Any) -> bool:
    """Whether ``value`` (an object that is not a module, container or function) is state a
    forward may write: an object of the user's classes (dataclasses too, wherever made),
    a namespace, a torch distribution; not the runtime's (a lock another thread waits on,
    which a snapshot must never put back)."""
    kind = type(value)
    module = kind.__module__ or ""
    if module.partition(".")[0] not in _NOT_STATE:
        return True
    if module.startswith("torch.distributions") or dataclasses.is_dataclass(value):
        return True
    return (module, kind.__name__) in _STATE_TYPES


def _content(holder: Any) -> Any:
    """A copy of what a dict, list, set or deque holds (a dict, list or set)."""
    if isinstance(holder, dict):
        return dict(holder)
    if isinstance(holder, (set, frozenset)):
        return set(holder)
    return list(holder)


def _items(container: Any) -> Iterable[Any]:
    """What a container holds (a dict: its keys and values)."""
    if isinstance(container, dict):
        return [*container.keys(), *container.values()]
    return list(container)


def _slot_values(obj: Any) -> dict[str, Any]:
    """The values of ``obj``'s ``__slots__``, by name (:data:`_ABSENT` for one not set), read
    through each slot's own descriptor (not ``__getattr__``, which may answer for one)."""
    found: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__") or name in found:
                continue
            slot = cls.__dict__.get(name)
            try:
                found[name] = slot.__get__(obj, type(obj)) if slot is not None else _ABSENT
            except AttributeError:
                found[name] = _ABSENT
    return found


def _opaque(value: Any) -> Callable[[], None] | None:
    """What puts ``value`` back where it is now, where its state is not an attribute dict
    a snapshot can take (None: it is not such an object). numpy arrays are not taken: a
    model may reach gigabytes of them (a dataset, through a trainer)."""
    if isinstance(value, random.Random):
        saved = value.getstate()
        return lambda: value.setstate(saved) if value.getstate() != saved else None
    if isinstance(value, weakref.WeakKeyDictionary | weakref.WeakValueDictionary):
        items = list(value.items())
        return lambda: _put_back_weak(value, items)
    if isinstance(value, functools._lru_cache_wrapper):  # (an instance's cache of a function)
        misses = value.cache_info().misses  # (a call it had no entry for: one of the run's)
        return lambda: value.cache_clear() if value.cache_info().misses != misses else None
    if isinstance(value, bytearray | array.array):
        content: Any = value[:]
        return lambda: value.__setitem__(slice(None), content) if value != content else None
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    if isinstance(value, numpy.random.RandomState):
        state = value.get_state()
        return lambda: value.set_state(state)
    if isinstance(value, numpy.random.Generator):
        bits = value.bit_generator.state
        return lambda: setattr(value.bit_generator, "state", bits)
    if isinstance(value, numpy.random.BitGenerator):
        held = value.state
        return lambda: setattr(value, "state", held)
    return None


def _put_back_weak(holder: Any, items: list[tuple[Any, Any]]) -> None:
    """A weak dictionary given back its items (those still alive), where it differs (by the
    identity of its keys and values: a tensor's ``==`` is elementwise)."""
    now = list(holder.items())
    if len(now) != len(items) or any(
        a is not c or b is not d for (a, b), (c, d) in zip(now, items, strict=True)
    ):
        holder.clear()
        holder.update(items)
