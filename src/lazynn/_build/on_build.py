"""lazynn.on_build: work on a module that waits until its lazy layers are built.

What users do to a model right after constructing it (custom initialization, parametrizations
such as ``weight_norm``, pruning, an EMA copy) needs the parameters' shapes or values, which
an unbuilt model does not have. ``on_build(module, fn)`` queues ``fn(module)`` until every
lazy layer in ``module`` is built and allocated (not on meta), then runs it, once:

* at the end of :func:`lazynn.build` or :func:`lazynn.materialize`, or after a
  ``load_state_dict`` that builds the module;
* or before the module's first forward: a forward pre-hook builds the whole module first, as
  :func:`lazynn.build` does, from that call's inputs, runs the queue, then the forward runs on
  the finished module. (Work that changes parameters in place must run before a forward, or
  the backward of that forward fails: so not after a layer-by-layer first call.) If the
  forward cannot run on meta tensors (it needs values), the first call builds layer by
  layer as usual, and the queue runs before the next forward.

Queued functions run in the order they were queued, each once. If one fails, the module's
tensors and structure are put back as they were before the build (its real tensors are backed
up while the queue runs: a transient copy of the module's memory) and the function stays
queued. (After a ``load_state_dict``, "before" is after the load: torch's load is not atomic,
and its post-hooks, where the queue runs, come before its strict-mode key check.) The queue
lives in the module (a ``deepcopy`` carries it).

Numbers: the pre-hook's build initializes in construction order, as ``lazynn.build`` does, so
if nothing drew random numbers between construction and that call, ``on_build(model, lambda
m: m.apply(init))`` gives the numbers of an eager ``model.apply(init)`` under the same seed.
(Without a queue, a first call initializes layer by layer in forward order instead.)

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(4), torch.nn.ReLU(), lazynn.LazyLinear(1))
>>> def init(m):
...     if isinstance(m, torch.nn.Linear):
...         torch.nn.init.zeros_(m.bias)
>>> handle = lazynn.on_build(net, lambda m: m.apply(init))
>>> _ = net(torch.randn(2, 3))
>>> net[0].bias.count_nonzero().item()
0
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin as TorchLazyModuleMixin

from .._errors import LazynnError, NeedsValuesError, message, module_path
from .._layer.checkpoint import WithAliases
from .._module.callers import untraced
from .._module.lifecycle import in_build, is_unbuilt, rehearsing
from .._module.state import BUILD_LOCK, context
from .._program.record import recording
from .arguments import check_module
from .build import build_from
from .queue import (
    Entry,
    add,
    built_on_meta,
    due,
    entries,
    has_queue,
    mark_tried,
    note_loaded,
    queue_hook,
    ready,
    run_ready,
    take,
    tried,
)

__all__ = ["OnBuildHandle", "on_build"]

M = TypeVar("M", bound=nn.Module)


class OnBuildHandle:
    """Returned by :func:`on_build`: ``pending`` tells whether the function still waits,
    ``remove()`` drops it if it has not run.

    >>> import lazynn
    >>> from torch import nn
    >>> layer = lazynn.LazyLinear(4)
    >>> handle = lazynn.on_build(layer, lambda module: nn.init.zeros_(module.bias))
    >>> handle.pending
    True
    >>> handle.remove()
    >>> handle.pending
    False
    """

    def __init__(self, module: nn.Module | None, entry: Entry | None) -> None:
        self._module = weakref.ref(module) if module is not None else None
        self._entry = entry

    def _queue(self) -> tuple[Entry, ...]:
        module = self._module() if self._module is not None else None
        return entries(module) if module is not None else ()

    @property
    def pending(self) -> bool:
        """Whether the function is still waiting for the build."""
        return self._entry is not None and self._entry in self._queue()

    def remove(self) -> None:
        """Drop the function from the queue, if it has not run (else nothing to undo)."""
        with BUILD_LOCK:
            module = self._module() if self._module is not None else None
            if module is not None and self._entry is not None and self._entry in self._queue():
                take(module, [self._entry])


def on_build(module: M, fn: Callable[[M], object]) -> OnBuildHandle:
    """Run ``fn(module)`` once every lazy layer in ``module`` is built and allocated.

    Runs it now if that is already so. See the module documentation for when it runs.

    Args:
        module: any module: a lazy layer, or a model holding some.
        fn: called with ``module``; its return value is ignored (``weight_norm`` and
            friends change the module in place).

    Returns:
        a handle whose ``remove()`` unqueues ``fn``.

    Raises:
        LazynnError: ``fn`` is not callable.

    >>> import torch, lazynn
    >>> fc = lazynn.LazyLinear(3)
    >>> handle = lazynn.on_build(fc, lambda m: m.weight.requires_grad_(False))
    >>> handle.pending
    True
    >>> _ = fc(torch.randn(2, 5))
    >>> handle.pending, fc.weight.requires_grad
    (False, False)
    """
    check_module(module, "lazynn.on_build")
    if not callable(fn):
        raise LazynnError(
            message(
                f"lazynn.on_build({module_path(module)})",
                "a function taking the module",
                f"{type(fn).__name__} {fn!r}",
                "pass a callable, e.g. lambda m: m.apply(init_fn)",
            )
        )
    with BUILD_LOCK:
        recorded = recording() is not None and built_on_meta(module)
        if (ready(module) or recorded) and not due(module):
            # (in a construction on meta, recorded, it runs where written, as the rest of the
            # init program: its steps are recorded, values it reads computed for real)
            fn(module)
            return OnBuildHandle(None, None)
        entry, first = add(module, fn)
        if first:
            # prepend: the build sees the call's own arguments, before other pre-hooks run
            module.register_forward_pre_hook(_before_forward, prepend=True, with_kwargs=True)
            module.register_load_state_dict_pre_hook(_before_load)  # type: ignore[no-untyped-call]
        if first:
            _take_part(module)
        return OnBuildHandle(module, entry)


# --- torch.compile ------------------------------------------------------------------------------
# dynamo traces a compiled model's forward, hooks included, and cannot run a whole-model build
# inside the graph: the queue's pre-hook is a no-op there. torch.compile(model) calls the
# model's ``_infer_parameters(model, args, kwargs)`` eagerly first, though, when the model has
# an ``_initialize_hook`` (dynamo's lazy-module protocol: OptimizedModule._call_lazy_check).
# A module with a queue takes part in it while the queue waits: it builds the whole model and
# runs the queue there, as a plain first call does. (A lazy layer has the protocol already.)


def _take_part(module: nn.Module) -> None:
    """Give ``module`` dynamo's lazy-module protocol while its queue waits."""
    if isinstance(module, TorchLazyModuleMixin):
        return
    module.__dict__["_initialize_hook"] = True  # (dynamo only asks whether it has one)
    module.__dict__["_infer_parameters"] = _compiled_first_call


def _compiled_first_call(module: nn.Module, args: Any, kwargs: Any = None) -> None:
    _build_and_run(module, tuple(args), dict(kwargs or {}))


@queue_hook
def _before_forward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if torch.compiler.is_compiling() or not has_queue(module):
        # (under torch.compile, dynamo builds layer by layer as it traces: a compiled model
        # ran the queue at its first call, before tracing, see above; else the queue waits,
        # and _module/mixin.py warns: refusals.warn_compiled_queue)
        return
    untraced(_build_and_run)(module, args, kwargs)


def _build_and_run(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Build the whole module from a call's arguments, then run the queues in it (before the
    call's forward, which then meets the finished module)."""
    if rehearsing() or in_build() or _running_here(module):
        return
    with BUILD_LOCK:  # (a queue running in another thread: wait for it)
        if not any(entries(m) for m in module.modules()):
            return  # run meanwhile: the forward meets the finished module
        if not ready(module):
            # Once per kind of call: a call like one tried before reaches no other layer.
            kind = _kind((args, kwargs))
            if tried(module, kind):
                return
            # A forward that cannot run on meta tensors (NeedsValuesError) builds layer by
            # layer, as a plain first call; the queue then runs before the next forward.
            with contextlib.suppress(NeedsValuesError):
                build_from(module, args, kwargs, partial=True)  # runs the queue when it can
            if not ready(module):
                mark_tried(module, kind)
        run_ready(module)


def _running_here(module: nn.Module) -> bool:
    """Whether a queued function of ``module``, of a module in it or of one holding it runs on
    this thread (and calls the model: its queue's next functions wait for it to end)."""
    scopes = context().queue_scopes
    if not scopes:
        return False
    inside = {id(m) for m in module.modules()}
    return any(id(s) in inside or any(m is module for m in s.modules()) for s in scopes)


def _kind(value: Any) -> Any:
    """What a call's arguments look like: tensors by shape and dtype, the rest as they are."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_kind(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _kind(v)) for k, v in value.items())))
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, id(value))
    return value


@queue_hook
def _before_load(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: dict[str, Any],
    *rest: Any,
) -> None:
    """A checkpoint loading into the module: build its lazy layers from the checkpoint's
    shapes as eager constructions (their numbers drawn, their kept initializations run), run
    the queue, and only then let torch copy the values in, as the eager program runs
    construct, initialize, ``load_state_dict``: loaded values always win. (An entry that a
    queued parametrization renames, ``weight_norm``'s ``weight_v``, gives its shape.)"""
    if rehearsing() or not entries(module):
        return
    view = WithAliases(state_dict)
    assign = bool((local_metadata or {}).get("assign_to_params_buffers", False))
    here = context()
    with BUILD_LOCK:
        outer, here.loading_for_queue = here.loading_for_queue, True
        try:
            for path, layer in list(module.named_modules()):
                build = getattr(layer, "_lazynn_build_from_state", None)
                if is_unbuilt(layer) and build is not None:
                    build(view, prefix + (f"{path}." if path else ""), assign)
        finally:
            here.loading_for_queue = outer
        run_ready(module)
        note_loaded(module, [k[len(prefix) :] for k in state_dict if k.startswith(prefix)])
