"""What every lazy module is asked, whatever its kind (lazynn's, torch's, a custom
``LazyModuleMixin``): is it unbuilt, is a rehearsal or a build running on this thread, and
the steps of its life that are not methods: the build hook attached at construction and
removed at the end (:func:`attach`, :func:`finish`), and a build by torch's lazy-module
protocol (:func:`build_lazy_module`, which the hook and dynamo call).

>>> import torch, lazynn
>>> layer = lazynn.LazyLinear(2)
>>> is_unbuilt(layer), is_lazy_module(torch.nn.LazyLinear(2))
(True, True)
>>> build_lazy_module(layer, (torch.ones(1, 3),))
>>> is_unbuilt(layer), type(layer).__name__
(False, 'Linear')
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Protocol, cast

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin as _TorchLazyModuleMixin

# Private (no public way to step out of a function mode for a while): the mode stack's top,
# popping and pushing (torch.overrides' own helpers). Guarded by tests/ecosystem/
# test_torch_internals.py.
from torch.overrides import _get_current_function_mode, _pop_mode, _push_mode

from .._errors import UnbuiltError, message, module_path
from .callers import untraced
from .state import STATE_KEY, context
from .tensors import is_placeholder

__all__ = [
    "attach",
    "build_lazy_module",
    "finish",
    "fx_proxy",
    "in_build",
    "initialize",
    "is_lazy_module",
    "is_unbuilt",
    "outside_inference_mode",
    "own_modes",
    "own_work",
    "pre_hook",
    "rehearsing",
    "warn_built",
]


def rehearsing() -> bool:
    """Whether this thread is inside a meta rehearsal (see ``_rehearsal/rehearse.py``): a
    failure there costs nothing (the model is restored), so layers skip their own meta check."""
    return context().rehearsal is not None


@contextlib.contextmanager
def own_modes(*modes: object) -> Iterator[None]:
    """``modes``, function modes lazynn has entered on this thread (see :func:`own_work`)."""
    ours = context().own_modes
    ours.extend(modes)
    try:
        yield
    finally:
        del ours[len(ours) - len(modes) :]


def own_work() -> contextlib.AbstractContextManager[None]:
    """lazynn's own work on a layer (reading its input's sizes, checking them, making or
    filling its placeholders), out of the function modes lazynn entered (:func:`own_modes`:
    a rehearsal's meta device, a draft's meta device and recorder): a mode sees every tensor
    attribute read (``t.shape``), about 5,000 of them in a ResNet-50's rehearsal, each a
    Python call. The modes are left from the top of the stack down while they are lazynn's
    (one a user or the forward entered above them stays, and sees the work, as before). Only
    for work that runs no user code and names the device of every tensor it makes: the eager
    class's construction (which fires torch's registration hooks), a user's class, a
    placeholder's own ``materialize()`` stay under the modes."""
    ours = context().own_modes
    return _left(ours) if ours else contextlib.nullcontext()


@contextlib.contextmanager
def _left(ours: list[object]) -> Iterator[None]:
    left: list[object] = []
    try:
        while torch._C._len_torch_function_stack():
            top = _get_current_function_mode()
            if not any(top is mode for mode in ours):
                break
            left.append(_pop_mode())
        yield
    finally:
        for mode in reversed(left):
            _push_mode(mode)


def warn_built(text: str | Warning, stacklevel: int = 2) -> None:
    """Warn about a build (a text: a UserWarning; or a warning of its own category); inside
    a first call, once its forward has succeeded."""
    held = context().held_warnings
    if held is not None:
        held.append(text)
    else:
        warnings.warn(text, stacklevel=stacklevel + 1)


def in_build() -> bool:
    """Whether this thread is inside ``_infer_parameters`` (so inside a build)."""
    return context().builds > 0


def pre_hook(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> None:
    """The forward pre-hook of an unbuilt module: build it from the call's inputs, as Python
    also where dynamo compiles the frame running the hook (a nested RNN's, after its graph
    break): lazynn's machinery is never traced.

    (``kwargs`` may be missing: when an earlier pre-hook of the same call built the module,
    for ``lazynn.on_build``, this hook is already removed, and ``nn.Module._call_impl``, which
    listed it before, calls it as a hook without keyword arguments.)
    """
    if is_unbuilt(module):
        untraced(build_lazy_module)(module, args, kwargs)


def is_unbuilt(module: nn.Module) -> bool:
    """True while a lazynn module waits for its first input (its pre-hook is attached)."""
    return "_initialize_hook" in module.__dict__ and isinstance(module, _TorchLazyModuleMixin)


def is_lazy_module(module: nn.Module) -> bool:
    """True for an unbuilt lazy module of any kind (lazynn's, torch's, a custom mixin)."""
    return isinstance(module, _TorchLazyModuleMixin) and hasattr(module, "_initialize_hook")


def attach(module: nn.Module) -> None:
    """Attach the build hook: after the pre-hooks registered before it (a subclass's
    ``__init__``), before those registered later, as torch's lazy modules do."""
    # `_initialize_hook` is the attribute dynamo and torch.compile look for (see module doc).
    module._initialize_hook = nn.Module.register_forward_pre_hook(  # type: ignore[assignment]
        module, pre_hook, with_kwargs=True
    )


def finish(module: nn.Module) -> None:
    """Detach the lazy machinery: after this the module is plain torch.nn, no overhead."""
    handle = module.__dict__.pop("_initialize_hook", None)
    if handle is not None:
        handle.remove()
    module.__dict__.pop(STATE_KEY, None)
    # An instance may have chosen its class (rank-agnostic layers): take it, leave no trace.
    target = module.__dict__.pop("cls_to_become", None) or getattr(module, "cls_to_become", None)
    if target is not None:
        module.__class__ = target


class _Lazy(Protocol):
    """A lazy module of any kind (lazynn's, torch's, a custom ``LazyModuleMixin``), as torch's
    lazy-module protocol (which dynamo also calls) sees it."""

    def _infer_parameters(self, module: nn.Module, args: Any, kwargs: Any = None) -> None: ...

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None: ...

    def has_uninitialized_params(self) -> bool: ...


def build_lazy_module(module: nn.Module, args: Any, kwargs: Any = None) -> None:
    """Build a lazy module of any kind from a call's inputs, by its own protocol."""
    cast(_Lazy, module)._infer_parameters(module, args, kwargs)


def initialize(module: nn.Module, args: Any, kwargs: dict[str, Any] | None) -> None:
    """``module.initialize_parameters(*args, **kwargs)``, which must fill every placeholder."""
    lazy = cast(_Lazy, module)
    # (parameters as a construction outside torch.inference_mode makes them)
    with outside_inference_mode():
        lazy.initialize_parameters(*args, **(kwargs or {}))
    if lazy.has_uninitialized_params():
        left = [n for n, t in module.named_parameters() if is_placeholder(t)]
        left += [n for n, t in module.named_buffers() if is_placeholder(t)]
        raise UnbuiltError(
            message(
                module_path(module),
                "initialize_parameters() to materialize every placeholder",
                f"{left} still unbuilt",
                "materialize each of them in initialize_parameters()",
            )
        )


def outside_inference_mode() -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode(False)`` where the mode is on; elsewhere a context that does
    nothing (cheaper: a first call enters it twice per layer)."""
    if torch.is_inference_mode_enabled():
        return torch.inference_mode(False)
    return contextlib.nullcontext()


def fx_proxy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.fx.Proxy | None:
    """The first ``torch.fx.Proxy`` among a call's arguments (fx is tracing), or None."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.fx.Proxy):
            return value
    return None
