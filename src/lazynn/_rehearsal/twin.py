"""The rehearsal's stand-in for a model: a twin of its module tree holding meta tensors.

A meta rehearsal (``lazynn.build``, ``lazynn.summary``) needs to run the model's forward on
meta tensors, and lazy layers build themselves as it runs. It never touches the user's model:
it runs a twin, made by :func:`meta_twin` and thrown away after. So another thread may read
or run the model meanwhile, nothing needs restoring, and no random generator is rewound.

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
  copy, so that what the rehearsal changes (a lazy layer's build, a hook it adds, a list the
  forward appends to) stays in the twin.

The modules below a block the memo will likely skip (``later``: a block like an earlier one,
``memo.repeats``) are left hollow (``hollow.py``): made, the whole block's at once, when
anything touches one (a forward peeking into the block, a call the memo cannot answer).

Objects of other types are shared (a config, a tokenizer): a forward that keeps modules or
tensors of the model in such an object reaches the real ones. What a rehearsal installed on
its own twin (its recording hooks, the memoizing forwards of ``_memo``: :func:`rehearsal_only`)
is left out of a twin made of that twin: a rehearsal inside the forward (a ``lazynn.build``
or ``summary`` of a submodule) runs on a twin of its own, which the running one does not see.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2))
>>> twin = meta_twin(model)
>>> twin.root[0].weight.device, model[0].weight.device
(device(type='meta'), device(type='cpu'))
>>> twin.original(twin.root[0]) is model[0]
True
"""

from __future__ import annotations

import contextlib
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

from .._module.placeholder import relocate
from .._module.state import BUILD_LOCK, LazyState
from .._module.tensors import is_placeholder
from .hollow import Stale, hand_over, hollow, is_hollow, to_class

__all__ = ["Twin", "is_rehearsals", "meta_twin", "meta_version", "rehearsal_only"]


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


@dataclass
class Twin:
    """A model's meta twin (see the module doc)."""

    #: the twin of the model
    root: nn.Module
    #: id(twin module) -> the model's module
    modules: dict[int, nn.Module]
    #: id(twin tensor) -> the model's tensor (a placeholder built in the twin is the same
    #: object after its build: fills are in place)
    tensors: dict[int, torch.Tensor]
    #: the blocks whose modules below wait for a touch (``hollow.py``), and the modules made
    deferred: _Deferred

    @property
    def made(self) -> list[nn.Module]:
        """The modules the twin made, in the model's order (then those made on a touch)."""
        return self.deferred.made

    def twin(self, module: nn.Module) -> nn.Module:
        """The twin of the model's ``module``."""
        found: nn.Module = self.deferred.remap.twins[id(module)]
        return found

    def kind(self, module: nn.Module) -> type:
        """The class of ``module`` of the twin (a hollow one's: its original's)."""
        return type(self.modules[id(module)]) if is_hollow(module) else type(module)

    def original(self, module: nn.Module) -> nn.Module:
        """The model's module that ``module`` (of the twin) stands for."""
        return self.modules[id(module)]

    def release(self) -> None:
        """Take the rehearsal's own forwards off the twin's modules, once it is done with them
        (its hooks and memoized forwards are taken off by the rehearsal). Each is bound to its
        module, a reference cycle: a twin left so is freed only by the cycle collector, in a
        collection that walks everything made since the last one (for a ResNet-50, as long as
        its rehearsal). Released, it is freed as it is dropped; a module the forward or a
        user's hook kept stays a working meta module. Modules still hollow are made apart if
        ever touched (a block a hook kept, touched after the run)."""
        self.deferred.release()
        for module in self.made:
            bound = getattr(module.__dict__.get("forward"), "__func__", None)
            if bound is _batch_norm_shapes:
                del module.__dict__["forward"]


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


def meta_twin(
    model: nn.Module,
    shapes_only: bool = False,
    later: Iterable[nn.Module] = (),
    modules: list[nn.Module] | None = None,
    owned: bool = True,
    unchanged: Callable[[nn.Module], bool] = lambda block: True,
) -> Twin:
    """A twin of ``model``'s module tree holding meta tensors (see the module doc). The model
    is only read. ``shapes_only``: for a run under ``no_grad``, the twin's BatchNorms check
    their input and return its shape without running their kernel (see
    :func:`_batch_norm_shapes`). ``later``: blocks of the model whose twins the run will
    likely not enter (the memo's repeats): the modules below them are made on their first
    touch (``hollow.py``), each block's at once. ``modules``: ``list(model.modules())``, if
    the caller has it. ``owned``: the caller holds the build lock until the twin is dropped
    (``build``); if not, a block is made only if ``unchanged(block)`` says it is as it was
    (another thread may have built it since), else the touch raises ``hollow.Stale``."""
    modules = list(model.modules()) if modules is None else modules
    remap = _Remap(modules)
    twins = remap.twins
    deferred = _Deferred(remap, shapes_only, owned, unchanged)
    inside: set[int] = set()
    for block in later:
        if id(block) in inside:  # (below a block already left hollow)
            continue
        below = [m for m in block.modules() if m is not block]
        left: list[nn.Module] = []
        for module in below:
            if not hollow(twins[id(module)], deferred, id(block)):
                for twin in left:  # (a class with __slots__: the block is made now)
                    to_class(twin, type(remap.modules[id(twin)]))
                break
            left.append(twins[id(module)])
        else:
            deferred.blocks[id(block)] = (block, below)
            inside.update(id(m) for m in below)
    handles: list[tuple[dict[str, Any], str, RemovableHandle]] = []
    for module in modules:
        if id(module) not in inside:
            _fill(remap, module, twins[id(module)].__dict__, handles)
    for attrs, key, value in handles:
        attrs[key] = remap.handle(value)
    deferred.made = [twins[id(m)] for m in modules if id(m) not in inside]
    if shapes_only:
        _shapes_only(deferred.made)
    return Twin(twins[id(model)], remap.modules, remap.tensors, deferred)


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
        elif not (key == "forward" and is_rehearsals(value)):
            attrs[key] = remap(value)
    for key in _HOOKS:  # (a running rehearsal's recording hooks: not this twin's)
        hooks: dict[int, Any] = attrs.get(key) or {}
        for ident in [i for i, h in hooks.items() if is_rehearsals(h)]:
            del hooks[ident]


class _Deferred:
    """The blocks whose modules below are hollow, and how to make them (``hollow.Maker``)."""

    def __init__(
        self,
        remap: _Remap,
        shapes_only: bool,
        owned: bool,
        unchanged: Callable[[nn.Module], bool],
    ) -> None:
        self.remap, self.shapes_only = remap, shapes_only
        #: whether the rehearsal's thread holds the build lock until the run ends
        self.owned = owned
        #: whether a block of the model is as it was when the twin was made
        self.unchanged = unchanged
        #: id(the model's block) -> (it, the model's modules below it, left hollow in the twin)
        self.blocks: dict[int, tuple[nn.Module, list[nn.Module]]] = {}
        #: the twin's modules made so far (Twin.made)
        self.made: list[nn.Module] = []
        #: called with the modules of each block made later (the rehearsal hooks them)
        self.listeners: list[Callable[[list[nn.Module]], None]] = []

    def make(self, key: int) -> None:
        # Read while no build changes the model, as the rest of the twin was: the rehearsal's
        # thread holds the build lock all along (build), or the block is checked unchanged
        # under it (summary). (Not taken then: a forward may run blocks on other threads.)
        with contextlib.nullcontext() if self.owned else BUILD_LOCK:
            found = self.blocks.get(key)
            if found is None:
                return
            block, below = found
            if not self.owned and not self.unchanged(block):
                raise Stale
            del self.blocks[key]
            made = [self.remap.twins[id(m)] for m in below]
            _make_hollow(self.remap, below, made)
        if self.shapes_only:
            _shapes_only(made)
        self.made.extend(made)
        for listener in list(self.listeners):
            listener(made)

    def release(self) -> None:
        """The run is over: each block still hollow is made apart, if ever touched (its
        hollow modules would otherwise hold this maker, and it them, in reference cycles)."""
        self.listeners.clear()
        twins = self.remap.twins
        for _, below in self.blocks.values():
            apart = _Apart(below, [twins[id(m)] for m in below])
            for module in below:
                hand_over(twins[id(module)], apart)
        self.blocks.clear()


class _Apart:
    """Makes a skipped block's hollow modules touched after the run (a block a hook kept):
    a twin of their own, whose tensors tied outside the block are tied no more (the run is
    over). It holds the hollow modules weakly, they hold it: no reference cycle."""

    def __init__(self, below: list[nn.Module], hollows: list[nn.Module]) -> None:
        self.below: list[nn.Module] | None = below
        self.refs = [weakref.ref(m) for m in hollows]

    def make(self, key: int) -> None:
        below, self.below = self.below, None
        if below is None:
            return
        remap = _Remap(())
        made = []
        for module, ref in zip(below, self.refs, strict=True):
            twin = ref()
            if twin is None:  # (let go of: made new, for a hollow one that holds it)
                twin = type(module).__new__(type(module))
            remap.twins[id(module)] = twin
            remap.modules[id(twin)] = module
            made.append(twin)
        _make_hollow(remap, below, made)


def _make_hollow(remap: _Remap, below: list[nn.Module], twins: list[nn.Module]) -> None:
    """Fill ``twins`` (hollow, or new and empty) as the twins of the model's modules
    ``below``, through ``remap``."""
    handles: list[tuple[dict[str, Any], str, RemovableHandle]] = []
    for module, twin in zip(below, twins, strict=True):
        attrs = to_class(twin, type(module)) if is_hollow(twin) else twin.__dict__
        _fill(remap, module, attrs, handles)
    for attrs, name, value in handles:
        attrs[name] = remap.handle(value)


def _batch_norm_shapes(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A BatchNorm's forward in a rehearsal: its checks of the input, and an output of the
    input's shape and dtype, without its kernel (on meta, torch's Python decomposition: most
    of a ResNet's rehearsal). It counts no FLOPs (FlopCounterMode counts none for it)."""
    norm: Any = module
    norm._check_input_dim(x)  # (BatchNorm1d/2d/3d's own: the rank)
    # What _BatchNorm.forward passes to F.batch_norm, whose checks these are: batch
    # statistics where it trains or keeps no running ones; the tensors it has, of C elements.
    training = norm.training or (norm.running_mean is None and norm.running_var is None)
    stats = norm.running_mean if not norm.training or norm.track_running_stats else None
    channels = x.shape[1]
    for name, tensor in (("running_mean", stats), ("weight", norm.weight), ("bias", norm.bias)):
        if tensor is not None and tensor.numel() != channels:
            raise RuntimeError(f"{name} should contain {channels} elements not {tensor.numel()}")
    if training and x.numel() // max(channels, 1) == 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {x.size()}"
        )
    return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)


def _shapes_only(modules: Iterable[nn.Module]) -> None:
    """Give the twin's BatchNorms (torch.nn's forward, none of their own) the shape-only
    forward of :func:`_batch_norm_shapes` (one function: identical blocks stay identical)."""
    for module in modules:
        if (
            isinstance(module, nn.modules.batchnorm._BatchNorm)
            and type(module).forward is nn.modules.batchnorm._BatchNorm.forward
            and "forward" not in module.__dict__
            and hasattr(module, "_check_input_dim")
        ):
            module.__dict__["forward"] = types.MethodType(_batch_norm_shapes, module)
