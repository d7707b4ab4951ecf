"""Repeated blocks in a meta rehearsal: run one, reuse its result for its identical twins.

A transformer has 32 or 80 identical blocks, a ResNet stage a few: on meta, a block's output
depends only on its structure (classes, constructor attributes, tensor shapes and dtypes) and
its inputs' shapes, so once one block has run, each identical block called with identical
input shapes can return fresh meta tensors of the recorded shapes without running. The lazy
layers inside a skipped block get the sizes of their counterparts in the block that ran.

Only blocks that are safe to skip are memoized: children of ``nn.Sequential`` /
``nn.ModuleList`` / ``nn.ModuleDict`` with submodules of their own, with no user hooks
anywhere below them, every attribute hashable (or a function), called with tensors and plain
values only, returning tensors (in tuples, lists, dicts) only. Anything else runs normally.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

import torch
from torch import nn

from .._layer.construct import MODULE_KEYS
from .._layer.infer import UNKNOWN
from .._module.lifecycle import pre_hook
from .._module.state import STATE_KEY, LazyState
from .._module.tensors import is_placeholder, map_tensors
from .twin import is_rehearsals, rehearsal_only

__all__ = ["Below", "Memo", "Recorder", "fingerprint", "repeats", "skipped"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

#: what one run of a block did below it: relative path -> (calls, FLOPs, the first call's
#: input and output shapes)
Below = dict[str, tuple[int, int, Any, Any]]


class Recorder(Protocol):
    """What the rehearsal records, as a memoized block sees it."""

    def meter(self) -> int:
        """The FLOPs counted so far (skipped blocks' included)."""

    def mark(self) -> int:
        """A position in the record of calls."""

    def below(self, block: str, since: int) -> Below:
        """What the calls under ``block`` since ``mark()`` gave ``since`` did."""

    def skipped(self, block: str, flops: int, below: Below) -> None:
        """``block`` was skipped: count ``flops`` and the calls ``below`` as if it had run."""


class _Unhashable(Exception):
    pass


def _value_key(value: Any) -> Hashable:
    if value is UNKNOWN:
        return "?"
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype)):
        return (type(value), value)
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_value_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((_value_key(k), _value_key(v)) for k, v in value.items()))
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))  # a plain tensor attribute: only itself is identical
    if callable(value) and not isinstance(value, nn.Module):
        if _holds_the_model(value):  # (each block's twin has its own copy: not alike)
            raise _Unhashable
        return ("callable", id(value))
    raise _Unhashable


def _holds_the_model(fn: Any) -> bool:
    """Whether ``fn`` holds a module or tensor, as the twin remaps them (``twin._Remap``): a
    method bound to one, a closure or ``functools.partial`` holding one. Blocks sharing such
    a function reach one module through it (a router, a gate): each call must be seen."""
    if isinstance(fn, types.MethodType):
        return isinstance(fn.__self__, (nn.Module, torch.Tensor))
    if isinstance(fn, functools.partial):
        held = (fn.func, *fn.args, *fn.keywords.values())
        return any(isinstance(v, (nn.Module, torch.Tensor)) or _holds_the_model(v) for v in held)
    cells = getattr(fn, "__closure__", None) or ()
    for cell in cells:
        try:
            if isinstance(cell.cell_contents, (nn.Module, torch.Tensor)):
                return True
        except ValueError:  # (an empty cell)
            continue
    return False


def _signature(value: Any) -> Hashable:
    """The shape-level identity of forward arguments (raises _Unhashable if not plain)."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_signature(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in value.items()))
    raise _Unhashable


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return False


def _fresh(value: Any) -> Any:
    """New meta tensors like those in ``value`` (same structure, shapes and strides)."""
    return map_tensors(
        lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device), value
    )


def repeats(
    modules: Iterable[nn.Module], paths: dict[int, str]
) -> list[tuple[nn.Module, Hashable]]:
    """The blocks of a model (``modules``: its modules, each once, in its order) safe to
    memoize (see the module doc), each with its fingerprint (equal for blocks that run
    alike), in the model's order; ``paths``: each module's first path, by id. The model is
    only read."""
    prints = _Fingerprints(paths)
    found = []
    for parent in modules:
        if not isinstance(parent, _CONTAINERS):
            continue
        for block in parent._modules.values():
            if block is None or not block._modules:
                continue
            fingerprint = prints(block)
            if fingerprint is not None:
                found.append((block, fingerprint))
    return found


def fingerprint(module: nn.Module, paths: dict[int, str]) -> Hashable | None:
    """``module``'s fingerprint as :func:`repeats` computes it, now (``paths``: as there)."""
    return _Fingerprints(paths)(module)


def skipped(blocks: list[tuple[nn.Module, Hashable]]) -> list[nn.Module]:
    """Of :func:`repeats`' blocks, those an earlier block is like: the memo will likely skip
    them (run with inputs of the shapes the earlier one had)."""
    seen: set[Hashable] = set()
    found = []
    for block, print_ in blocks:
        if print_ in seen:
            found.append(block)
        seen.add(print_)
    return found


class _Fingerprints:
    """Each module's fingerprint (None: not safe to skip), each computed once."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.paths = paths
        self._prints: dict[int, Hashable | None] = {}

    def __call__(self, module: nn.Module) -> Hashable | None:
        key = id(module)
        if key not in self._prints:
            self._prints[key] = self._compute(module)
        return self._prints[key]

    def _compute(self, module: nn.Module) -> Hashable | None:
        # (a running rehearsal's own hooks and forwards, where the model is another
        # rehearsal's twin, are not the model's: its twin has none)
        if (
            module._backward_hooks
            or module._backward_pre_hooks
            or any(not is_rehearsals(h) for h in module._forward_hooks.values())
            or any(
                h is not pre_hook and not is_rehearsals(h)
                for h in module._forward_pre_hooks.values()
            )
        ):
            return None  # a user's hook would not run for a skipped twin
        attrs = []
        declared = None
        try:
            for k, v in module.__dict__.items():
                if k in _OWN_KEYS:
                    continue
                kind = type(v)
                attrs.append((k, (kind, v) if kind in _PLAIN else _value_key(v)))
            # a forward set on the instance (``block.forward = MethodType(f, block)``): blocks
            # run alike only with the same function
            own = module.__dict__.get("forward")
            if own is not None and not is_rehearsals(own):
                attrs.append(("forward", ("callable", id(getattr(own, "__func__", own)))))
            # a lazy layer's constructor arguments (its other state is its own: placeholders,
            # construction number)
            state = module.__dict__.get(STATE_KEY)
            if isinstance(state, LazyState):
                declared = _value_key(state.kwargs)
        except _Unhashable:
            return None
        # (a placeholder's dtype and requires_grad read as a tensor's: not through its
        # __torch_function__; torch._C.DisableTorchFunctionSubclass, as _module.tensors.raw)
        tensors: list[tuple[str, Any]] = []
        stores = (module._parameters, module._buffers)
        if any(stores):
            with torch._C.DisableTorchFunctionSubclass():
                for store in stores:
                    for name, t in store.items():
                        if t is None:
                            tensors.append((name, None))
                        elif is_placeholder(t):
                            tensors.append((name, ("lazy", t.dtype, t.requires_grad)))
                        else:
                            tensors.append((name, (tuple(t.shape), t.dtype, t.requires_grad)))
        children = []
        here = self.paths.get(id(module), "?")
        prefix = f"{here}." if here else ""
        for name, child in module._modules.items():
            if child is not None and self.paths.get(id(child)) != prefix + name:
                return None  # a module shared with another place: each call must be seen
            sub = self(child) if child is not None else ("none",)
            if sub is None:
                return None
            children.append((name, sub))
        return (
            type(module),
            module.training,
            tuple(attrs),
            declared,
            tuple(tensors),
            tuple(children),
        )


#: a module's keys the fingerprint leaves out (torch.nn's own, lazynn's state, the forward)
_OWN_KEYS = MODULE_KEYS | {"_initialize_hook", "forward", STATE_KEY}
#: attribute types keyed as they are
_PLAIN = frozenset({bool, int, float, str, bytes, type(None), torch.dtype})


class Memo:
    """Installs memoizing ``forward``s on the repeated blocks of a model's twin (in
    ``__dict__``: thrown away after) and records which block stood in for which."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        #: what the rehearsal counts (calls, FLOPs): a skipped block counts as its twin's run
        self.recorder = recorder
        self.results: dict[Hashable, tuple[str, Any, int, Below]] = {}
        #: (path of a skipped block, path of the identical block that ran), in call order
        self.aliases: list[tuple[str, str]] = []
        #: (block, its own forward before, or None), to undo the installation
        self._installed: list[tuple[nn.Module, Any]] = []

    def install(self, block: nn.Module, fingerprint: Hashable, path: str) -> None:
        """Memoize ``block`` (of the twin, at ``path``) under ``fingerprint`` (:func:`repeats`)."""
        self._installed.append((block, block.__dict__.get("forward")))
        block.__dict__["forward"] = self._forward(block, fingerprint, path)

    def undo(self) -> None:
        """Take the memoizing forwards off (a model that outlives the rehearsal)."""
        for block, own in self._installed:
            if own is None:
                block.__dict__.pop("forward", None)
            else:
                block.__dict__["forward"] = own

    def propagate(
        self,
        model: dict[str, nn.Module],
        modules: dict[str, nn.Module],
        sizes: dict[nn.Module, dict[str, Any]],
        inputs: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> dict[str, str]:
        """Give the lazy modules inside skipped blocks the sizes and inputs their twins learnt
        (their calls were counted as each block was skipped: ``Recorder.skipped``); returns,
        for each module's path in a skipped block, the path of the module that really ran in
        its place. ``model``: the model's modules by path, whose tree the run's
        (``modules``) is."""
        stand_in: dict[str, str] = {}
        for path, twin in self.aliases:  # call order: aliases inside a twin come first
            for sub, _ in model[path].named_modules():
                if not sub:
                    continue
                mine, theirs = f"{path}.{sub}" if path else sub, f"{twin}.{sub}" if twin else sub
                source = stand_in.get(theirs, theirs)
                if mine != theirs:  # (a block skipped against its own earlier call stands alone)
                    stand_in[mine] = source
                if modules[theirs] in sizes:
                    sizes[modules[mine]] = sizes[modules[theirs]]
                if modules[theirs] in inputs:
                    inputs[modules[mine]] = inputs[modules[theirs]]
        return stand_in

    def _forward(self, block: nn.Module, fingerprint: Hashable, path: str) -> Callable[..., Any]:
        # the forward the block runs: its instance's own, if set, else its class's
        own = block.__dict__.get("forward")
        original = own if own is not None else functools.partial(type(block).forward, block)

        def forward(*args: Any, **kwargs: Any) -> Any:
            try:
                key: Hashable | None = (fingerprint, _signature(args), _signature(kwargs))
            except _Unhashable:
                key = None
            recorder = self.recorder
            if key is not None and key in self.results:
                twin, output, cost, below = self.results[key]
                self.aliases.append((path, twin))
                if recorder is not None:
                    recorder.skipped(path, cost, below)
                return _fresh(output)
            start, since = (recorder.meter(), recorder.mark()) if recorder is not None else (0, 0)
            output = original(*args, **kwargs)
            if key is not None and _plain(output):
                cost = recorder.meter() - start if recorder is not None else 0
                below = recorder.below(path, since) if recorder is not None else {}
                self.results[key] = (path, output, cost, below)
            return output

        return rehearsal_only(forward)  # (a twin made of this one runs the block's own)
