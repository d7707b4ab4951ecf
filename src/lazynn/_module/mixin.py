"""LazyModuleMixin: the lifecycle of a lazy module (see docs/design.md).

constructed (placeholders) -> moved (``.to``, ``.half()``, ``to_empty``: placeholders follow)
-> built (first call, ``initialize_parameters``, or ``load_state_dict`` of a built checkpoint)
-> plain torch.nn (hooks removed, class swapped to ``cls_to_become``).

This is the protocol layer, API-compatible with ``torch.nn.modules.lazy.LazyModuleMixin``:
a subclass declares placeholders in ``__init__``, materializes them in
``initialize_parameters(*inputs)`` and names ``cls_to_become``. The mixin adds what torch's
lacks: one materialization under concurrent first calls, a failed build that leaves the
module exactly as it was, independent copies, and errors that name the module's path.

It subclasses torch's mixin only so that the ecosystem recognizes lazynn modules (dynamo
keys its lazy-module protocol on ``isinstance(m, torch.nn.modules.lazy.LazyModuleMixin)``,
an ``_initialize_hook`` attribute and ``_infer_parameters``); every method of torch's mixin
is overridden here, and tests/ecosystem/test_torch_internals.py checks that this stays so.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin as _TorchLazyModuleMixin
from torch.utils.hooks import RemovableHandle

from .._errors import UnbuiltError, message, module_path
from . import registries  # noqa: F401  (registers the placeholders with torch)
from .callers import (
    calling,
    find_tool,
    in_checkpoint,
    torch_only,
    under_dynamo,
    untraced,
    user_stacklevel,
)
from .lifecycle import (
    attach,
    finish,
    fx_proxy,
    initialize,
    is_unbuilt,
    rehearsing,
)
from .refusals import (
    refuse_under_export,
    refuse_under_functorch,
    replication_refusal,
    scripting_refusal,
    warn_compiled_queue,
)
from .snapshot import RandomState, atomic, continue_builds, end_builds, weak
from .state import (
    BUILD_LOCK,
    QUEUE_KEY,
    STATE_KEY,
    WAITING,
    LazyState,
    context,
    find_state,
    record_construction,
)
from .tensors import is_placeholder, own_slots, own_tensors

__all__ = ["LazyModuleMixin"]

_Lazy = TypeVar("_Lazy", bound="LazyModuleMixin")

# Type checkers see the mixin as the nn.Module it is always mixed into.
if TYPE_CHECKING:
    _ModuleForTyping = nn.Module
else:
    _ModuleForTyping = object


def _call(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return module(*args, **kwargs)


class LazyModuleMixin(_TorchLazyModuleMixin, _ModuleForTyping):
    """Mixin for modules whose parameter shapes the first input decides.

    A subclass creates :class:`~lazynn.UninitializedParameter` /
    :class:`~lazynn.UninitializedBuffer` placeholders in ``__init__``, materializes them in
    :meth:`initialize_parameters` (called with the first call's inputs), and names the class
    to become in ``cls_to_become``. See ``docs/custom-layers.md`` for a complete example.

    >>> import torch, lazynn
    >>> layer = lazynn.LazyLinear(3)
    >>> isinstance(layer, lazynn.LazyModuleMixin), layer.has_uninitialized_params()
    (True, True)
    >>> _ = layer(torch.ones(2, 5))
    >>> type(layer).__name__, layer.in_features
    ('Linear', 5)
    """

    cls_to_become: type[nn.Module] | None = None
    #: whether torch.compile can build it as it traces (dynamo's lazy-module protocol)
    _lazynn_compiles_unbuilt: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Skip torch's mixin __init__ (it registers torch's hooks); ours attaches lazynn's.
        super(_TorchLazyModuleMixin, self).__init__(*args, **kwargs)
        attach(self)
        record_construction(self)

    # --- quantization ------------------------------------------------------------------------
    @property
    def qconfig(self) -> Any:
        """As the attribute torch's quantization sets; read by quantization on an unbuilt
        module, refused: ``quantize_dynamic`` would skip it silently (an unbuilt layer is not
        of the exact class it swaps)."""
        found = find_tool()
        if found is not None and found.name == "quantization":
            raise UnbuiltError(
                message(
                    module_path(self),
                    "a built model for quantization",
                    "an unbuilt lazy layer",
                    found.fix,
                )
            )
        try:
            return self.__dict__["qconfig"]
        except KeyError:
            raise AttributeError("qconfig") from None

    @qconfig.setter
    def qconfig(self, value: Any) -> None:
        self.__dict__["qconfig"] = value

    # --- the protocol ----------------------------------------------------------------------
    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        """Materialize every placeholder from the example inputs (a subclass defines it)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement initialize_parameters(*inputs)"
        )

    def has_uninitialized_params(self) -> bool:
        """Whether this module (not counting lazy submodules) still holds placeholders."""
        return any(is_placeholder(t) for t in self._own_tensors())

    def _own_tensors(self) -> Iterator[torch.Tensor]:
        """This module's tensors and those of its submodules that are not lazy modules."""
        stack: list[nn.Module] = [self]
        while stack:
            module = stack.pop()
            yield from own_tensors(module)
            stack.extend(
                m
                for m in module._modules.values()
                if m is not None and not isinstance(m, _TorchLazyModuleMixin)
            )

    def _infer_parameters(
        self, module: nn.Module, args: Any, kwargs: dict[str, Any] | None = None
    ) -> None:
        """Build ``module`` from example inputs, once, atomically; then detach the machinery.

        Called by the forward pre-hook, by ``initialize_parameters`` of lazynn layers and by
        dynamo (torch.compile).
        """
        refuse_under_functorch(module)
        refuse_under_export(module)
        with BUILD_LOCK:
            if not is_unbuilt(module):  # built meanwhile, by another thread
                return
            here = context()
            # (a first call of this module has snapshotted it already, and puts it back; a
            # rehearsal's model is a twin or a draft, thrown away if it fails, on meta)
            own = id(module) not in here.covered and here.rehearsal is None
            # (in torch.utils.checkpoint the builds draw apart from the forward, as the
            # recomputation builds nothing: continue_builds; a build after them in the same
            # model's call, outside a checkpoint, goes on with their stream: end_builds)
            checkpointed = in_checkpoint() if here.rehearsal is None else None
            forward = RandomState() if checkpointed is not None else None
            here.builds += 1
            try:
                with atomic(module) if own else contextlib.nullcontext():
                    if checkpointed is not None and forward is not None:
                        continue_builds(here, checkpointed, forward)
                    elif here.rehearsal is None:
                        end_builds(here, calling)
                    initialize(module, args, kwargs)
            finally:
                here.builds -= 1
            if checkpointed is not None and forward is not None:
                here.build_stream = (weak(checkpointed), forward, RandomState())
                forward.restore()
            finish(module)
            if here.built_here is not None:
                here.built_here.add(id(module))
            if WAITING and under_dynamo():
                warn_compiled_queue(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """As ``nn.Module``'s; a first call is atomic: if its forward fails, it is undone.

        A lazynn layer's first call constructs the layer for real and runs its forward, which
        is the input's check: a forward that refuses the input (a kernel larger than it, a
        batch of one for BatchNorm in training) raises an :class:`~lazynn.InferenceError`,
        and the build is rolled back, random numbers included, so a retry works. The check,
        the snapshot, the build, the forward and any rollback all run under the build lock,
        so a concurrent first call waits and then finds the module built. Only unbuilt
        modules pass through here: the build swaps the class, and with it this method.
        """
        proxy = fx_proxy(args, kwargs) if is_unbuilt(self) else None
        if proxy is not None:  # (a built module that kept its class: no scan of its inputs)
            # torch.fx.symbolic_trace: a leaf, as fx makes torch's lazy modules (the graph's
            # first run builds it)
            tracer = proxy.tracer
            return tracer.create_proxy("call_module", tracer.path_of_module(self), args, kwargs)  # type: ignore[attr-defined]
        compiling = torch.compiler.is_compiling()
        if compiling and is_unbuilt(self) and not self._lazynn_compiles_unbuilt:
            # (a layer dynamo cannot build as it traces: after the graph break its refusal
            # made, its first call runs uncompiled, and builds it)
            return untraced(_call)(self, args, kwargs)
        if compiling or not is_unbuilt(self) or rehearsing():
            # (dynamo may call this on the module it has just built, whose class is swapped:
            # no super() here.)
            return nn.Module.__call__(self, *args, **kwargs)
        with BUILD_LOCK:
            if is_unbuilt(self):
                # (super() only under the lock: another thread may swap the class outside it)
                first_call = untraced(LazyModuleMixin._lazynn_first_call)
                return first_call(self, super().__call__, args, kwargs)
        return nn.Module.__call__(self, *args, **kwargs)  # built meanwhile

    def _lazynn_first_call(
        self, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``call(*args, **kwargs)`` (the module's call, which builds it); undone if it fails
        after building this module. Runs under the build lock."""
        failed = self._lazynn_forward_failed  # (bound now: the build swaps the class)
        kind, before = type(self), find_state(self)  # (a build deletes what it knew too)
        here = context()
        outer, built = here.built_here, set[int]()
        outer_warnings, held = here.held_warnings, list[str | Warning]()
        here.built_here, here.held_warnings = built, held
        here.covered.add(id(self))
        try:
            with atomic(self, others=not torch_only(self)):
                try:
                    result = call(*args, **kwargs)
                except BaseException as error:
                    # (the forward's refusal is worded while the module is still built)
                    refusal = failed(args, error, kind, before) if id(self) in built else None
                    if refusal is None:
                        raise  # the build itself failed, or the error is raised as it is
                    raise refusal from error
        finally:
            here.covered.discard(id(self))
            if outer is not None:
                outer |= built
            here.built_here, here.held_warnings = outer, outer_warnings
        if outer_warnings is not None:
            outer_warnings += held
        else:
            for text in held:
                warnings.warn(text, stacklevel=user_stacklevel())
        return result

    def _lazynn_forward_failed(
        self,
        args: tuple[Any, ...],
        error: BaseException,
        kind: type[nn.Module],
        before: LazyState | None,
    ) -> BaseException | None:
        """The error to raise when the forward of this call, which built the module, raised
        ``error`` (still built, for its repr; ``kind``: its lazy class, ``before``: what it
        knew before the build); None: raise ``error`` itself."""
        return None

    # --- checkpoints -------------------------------------------------------------------------
    def _lazynn_build_from_state(
        self, state_dict: dict[str, Any], prefix: str, assign: bool = False
    ) -> None:
        """Build from a checkpoint's shapes. Default, as torch: materialize each placeholder
        with its entry's shape; the class swap waits for the first call."""
        for _, name, tensor in own_slots(self):
            value = state_dict.get(prefix + name)
            if (
                is_placeholder(tensor)
                and isinstance(value, torch.Tensor)
                and not is_placeholder(value)
            ):
                tensor.materialize(value.shape)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        meta = args[0] if args and isinstance(args[0], dict) else {}
        eager = self.__dict__.get("cls_to_become") or type(self).cls_to_become
        if is_unbuilt(self) and eager is not None and isinstance(self, eager):
            # Built inside nn.Module's own _load_from_state_dict (as its first pre-hook): after
            # the eager class's _load_from_state_dict has run, which may rename the keys of
            # older checkpoints (torchvision's MLPBlock), and before the values are copied.
            def build(state: Any, at: str, *_: Any) -> None:
                self._lazynn_load_build(state, at, meta)

            hooks = self._load_state_dict_pre_hooks
            handle = self._register_load_state_dict_pre_hook(build)  # type: ignore[no-untyped-call]
            hooks.move_to_end(handle.id, last=False)  # type: ignore[attr-defined]
            try:
                super()._load_from_state_dict(state_dict, prefix, *args)
            finally:
                handle.remove()
            return
        if is_unbuilt(self):
            self._lazynn_load_build(state_dict, prefix, meta)
        if isinstance(self, LazyModuleMixin):
            super()._load_from_state_dict(state_dict, prefix, *args)
        else:  # built just now, and the class swapped: load as the eager class does
            type(self)._load_from_state_dict(self, state_dict, prefix, *args)

    def _lazynn_load_build(self, state_dict: Any, prefix: str, meta: dict[str, Any]) -> None:
        """Build from a checkpoint being loaded, once (another thread may build it first)."""
        with BUILD_LOCK:
            if not is_unbuilt(self):
                return
            # load_state_dict(assign=True) passes it in the module's metadata
            assign = bool(meta.get("assign_to_params_buffers", False))
            here = context()
            outer = here.loading_for_queue
            # (its own on_build queue runs before the values are copied: built as an eager
            # construction, not uninitialized)
            here.loading_for_queue = outer or QUEUE_KEY in self.__dict__
            try:
                self._lazynn_build_from_state(state_dict, prefix, assign)
            finally:
                here.loading_for_queue = outer

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        # Through the eager class; a placeholder's detach() is a placeholder.
        super(_TorchLazyModuleMixin, self)._save_to_state_dict(destination, prefix, keep_vars)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """As ``nn.Module``'s; the unbuilt entries (this layer's and its submodules') are
        labelled, so that loading them into a built model says which checkpoint entry is
        unbuilt and how to fix it."""
        result = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        live = {id(t) for t in (*self.parameters(), *self.buffers())}
        for key, entry in result.items():
            if key.startswith(prefix) and is_placeholder(entry) and id(entry) not in live:
                entry._lazynn_checkpoint = f"'{key}' (saved from an unbuilt {type(self).__name__})"
        return result

    def _lazy_load_hook(self, *args: Any, **kwargs: Any) -> None:
        """Unused: lazynn loads through ``_load_from_state_dict`` (kept for torch parity)."""

    # --- copies and replication --------------------------------------------------------------
    def __copy__(self: _Lazy) -> _Lazy:
        """A shallow copy that builds independently: own placeholders, own hooks."""
        cls = type(self)
        new = cls.__new__(cls)
        new.__dict__.update(self.__dict__)
        for key, value in self.__dict__.items():
            if isinstance(value, (dict, set)):
                new.__dict__[key] = copy.copy(value)
        state = find_state(self)
        if state is not None:
            new.__dict__[STATE_KEY] = state.copy()
        tensor_dicts: tuple[dict[str, Any], ...] = (new._parameters, new._buffers)
        for tensors in tensor_dicts:
            for name, tensor in tensors.items():
                if is_placeholder(tensor):
                    tensors[name] = copy.deepcopy(tensor)
        if is_unbuilt(self):
            # Its real buffers too (num_batches_tracked), which a build resets and a forward
            # counts in place (a built layer's copy shares them, as torch's does)
            for name in getattr(cls, "known_buffers", ()):
                known = new._buffers.get(name)
                if known is not None and not is_placeholder(known):
                    new._buffers[name] = known.detach().clone()
            # The copied hook dicts hold our hook under the original handle's id; point a
            # handle with that id at the copy's dicts (RemovableHandle is torch's public type,
            # the `_forward_pre_hooks*` dicts are nn.Module's own storage for it).
            handle = RemovableHandle(
                new._forward_pre_hooks, extra_dict=new._forward_pre_hooks_with_kwargs
            )
            handle.id = self._initialize_hook.id
            new.__dict__["_initialize_hook"] = handle
        return new

    def __prepare_scriptable__(self) -> LazyModuleMixin:
        # torch.jit.script calls this on every submodule before it inspects any of them, so
        # a nested unbuilt layer gets this message rather than one about its `?` sizes.
        if is_unbuilt(self):
            raise scripting_refusal(self)
        return self

    def _replicate_for_data_parallel(self) -> Any:
        if not is_unbuilt(self):
            # built, and kept its class (cls_to_become = None): replicate as nn.Module does
            return nn.Module._replicate_for_data_parallel(self)
        raise replication_refusal(self)
