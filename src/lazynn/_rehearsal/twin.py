"""A meta twin of a model's module tree, for the training-memory estimate.

``lazynn.summary(..., training=True)`` (``_summary/memory.py``) runs a training step on fake
tensors: it swaps every tensor of the model it runs for a fake one, and builds its lazy
layers on meta. It does so on a twin, made by :func:`meta_twin`, so the model is never
changed and another thread may use it meanwhile. (A rehearsal, which ``build`` and
``summary`` run, runs the model itself: ``rehearse.py``.)

The twin is the model's call path, with the model's own code: each module is a new instance of
the same class whose attribute dict is the original's, with

* each parameter and buffer (and tensor kept as a plain attribute, or in a list or dict of
  one) replaced by a meta tensor of its shape and dtype, one per original (so ties hold), and
  each placeholder by a meta placeholder;
* each submodule (and each reference to a module of the tree, in a list or a hook's closure)
  by its twin;
* each method bound to the module (``block.forward = types.MethodType(f, block)``, as
  patching and adapter libraries do) bound to the twin instead, and each function whose
  closure holds a module of the tree rebuilt with the twins in the closure;
* each container (dicts, lists, sets: hooks, ``_parameters``, a lazy layer's state) its own
  copy, so that what the run changes (a lazy layer's build, a list the forward appends to)
  stays in the twin.

Objects of other types are shared (a config, a tokenizer). What a running rehearsal installed
on the model (its recording hooks: :func:`rehearsal_only`) is left out of the twin.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2))
>>> twin = meta_twin(model)
>>> twin.root[0].weight.device, model[0].weight.device
(device(type='meta'), device(type='cpu'))
>>> twin.original(twin.root[0]) is model[0]
True
"""

from __future__ import annotations

import functools
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._module.state import LazyState
from .stand_ins import meta_version

__all__ = ["Twin", "is_rehearsals", "meta_twin", "rehearsal_only"]


#: the attribute of a hook or forward that a rehearsal installs on its twin (``rehearsal_only``)
_ONLY = "_lazynn_rehearsal_only"
#: the module attributes holding forward hooks
_HOOKS = ("_forward_pre_hooks", "_forward_hooks")

F = TypeVar("F", bound=Callable[..., Any])


def rehearsal_only(fn: F) -> F:
    """Mark ``fn``, a hook or forward a rehearsal installs on its twin (a method: its
    function), as the rehearsal's own: a twin made of that twin leaves it out."""
    setattr(fn, _ONLY, True)
    return fn


def is_rehearsals(value: Any) -> bool:
    """True for a hook or forward a rehearsal installed (:func:`rehearsal_only`)."""
    return getattr(value, _ONLY, False) is True


@dataclass
class Twin:
    """A model's meta twin (see the module doc)."""

    #: the twin of the model
    root: nn.Module
    #: id(twin module) -> the model's module
    modules: dict[int, nn.Module]

    def original(self, module: nn.Module) -> nn.Module:
        """The model's module that ``module`` (of the twin) stands for."""
        return self.modules[id(module)]


_PLAIN = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size})
#: a module's own containers, each copied (an empty one: made new, as _Remap would)
_CONTAINERS = frozenset({dict, OrderedDict, set})


class _Remap:
    """Maps what the model's objects refer to onto the twin (see the module doc)."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.twins: dict[int, Any] = {}
        self.modules: dict[int, nn.Module] = {}  # twin id -> original
        self.tensors: dict[int, torch.Tensor] = {}  # twin tensor id -> original
        for module in modules:
            cls = type(module)
            twin = cls.__new__(cls)
            self.twins[id(module)] = twin
            self.modules[id(twin)] = module

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        found = self.twins.get(id(tensor))
        if found is None:
            found = self.twins[id(tensor)] = meta_version(tensor)
            self.tensors[id(found)] = tensor
        return found

    def __call__(self, value: Any) -> Any:
        if type(value) in _PLAIN:  # (most of a module's attributes: a flag, a size, a name)
            return value
        if isinstance(value, torch.Tensor):  # (a meta one too: the run may change it in place)
            return self.tensor(value)
        if isinstance(value, nn.Module):
            return self.twins.get(id(value), value)
        if isinstance(value, LazyState):
            state = value.copy()
            state.placeholders = {k: self(p) for k, p in value.placeholders.items()}
            return state
        if isinstance(value, dict):
            new = type(value).__new__(type(value))
            if value:  # (most of a module's dicts, its hooks', are empty)
                new.update((k, self(v)) for k, v in value.items())
            self.twins[id(value)] = new  # (a hook handle pointing at it follows: handle())
            return new
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, tuple):
            items = [self(v) for v in value]
            if hasattr(value, "_fields"):  # a named tuple
                return type(value)(*items)
            return type(value)(items) if type(value) is not tuple else tuple(items)
        if isinstance(value, (set, frozenset)):
            return type(value)(self(v) for v in value)
        if isinstance(value, types.MethodType):
            owner = self.twins.get(id(value.__self__))
            return types.MethodType(value.__func__, owner) if owner is not None else value
        if isinstance(value, types.FunctionType) and value.__closure__:
            return self._function(value)
        if isinstance(value, functools.partial):
            func, args, kwargs = self(value.func), self(value.args), self(value.keywords)
            return functools.partial(func, *args, **kwargs)
        return value

    def handle(self, value: RemovableHandle) -> RemovableHandle:
        """A handle of the same hook in the twin's dicts (a lazy layer's build hook, which
        its build removes: from the twin, not from the model)."""
        new = RemovableHandle.__new__(RemovableHandle)
        new.id = value.id
        hooks = value.hooks_dict_ref()
        new.hooks_dict_ref = weakref.ref(self.twins.get(id(hooks), hooks))
        extra = [ref() for ref in value.extra_dict_ref]
        new.extra_dict_ref = tuple(weakref.ref(self.twins.get(id(d), d)) for d in extra if d)
        return new

    def _function(self, fn: types.FunctionType) -> types.FunctionType:
        """``fn`` itself, or a copy whose closure holds the twins of the model's objects."""
        cells = fn.__closure__ or ()
        contents = []
        for cell in cells:
            try:
                contents.append(cell.cell_contents)
            except ValueError:  # an empty cell (a name not bound yet)
                return fn
        remapped = [self(c) if isinstance(c, (nn.Module, torch.Tensor)) else c for c in contents]
        if all(a is b for a, b in zip(remapped, contents, strict=True)):
            return fn
        closure = tuple(types.CellType(c) for c in remapped)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
        new.__dict__.update(fn.__dict__)
        new.__kwdefaults__ = fn.__kwdefaults__
        return new


def meta_twin(model: nn.Module) -> Twin:
    """A twin of ``model``'s module tree holding meta tensors (see the module doc). The model
    is only read."""
    modules = list(model.modules())
    remap = _Remap(modules)
    handles: list[tuple[dict[str, Any], str, RemovableHandle]] = []
    for module in modules:
        _fill(remap, module, remap.twins[id(module)].__dict__, handles)
    for attrs, key, value in handles:
        attrs[key] = remap.handle(value)
    return Twin(remap.twins[id(model)], remap.modules)


def _fill(
    remap: _Remap,
    module: nn.Module,
    attrs: dict[str, Any],
    handles: list[tuple[dict[str, Any], str, RemovableHandle]],
) -> None:
    """Fill ``attrs``, the dict of ``module``'s twin (its handles: into ``handles``, remapped
    once every dict of the modules made with it has its twin)."""
    twins = remap.twins
    for key, value in module.__dict__.items():
        kind = type(value)
        if kind in _PLAIN:  # (a flag, a size, a name: as _Remap keeps them)
            attrs[key] = value
        elif kind in _CONTAINERS and not value:  # (most hook dicts): a new empty one
            attrs[key] = twins[id(value)] = kind()
        elif isinstance(value, RemovableHandle):
            handles.append((attrs, key, value))
        else:
            attrs[key] = remap(value)
    for key in _HOOKS:  # (a running rehearsal's recording hooks: not this twin's)
        hooks: dict[int, Any] = attrs.get(key) or {}
        for ident in [i for i, h in hooks.items() if is_rehearsals(h)]:
            del hooks[ident]
