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

import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from ._errors import InferenceError, LazynnError, message, module_path
from ._mixin import _BUILD_LOCK, in_build, is_unbuilt, rehearsing
from ._placeholder import is_placeholder
from ._snapshot import Snapshot

__all__ = ["OnBuildHandle", "on_build", "run_ready"]

M = TypeVar("M", bound=nn.Module)

#: where a module keeps its queue (in its __dict__, so that a copy carries it; not a
#: "_lazynn_" name, which a lazy layer's build clears)
_KEY = "_on_build_queue"
_TRIED = "_on_build_tried"
_ORDER = itertools.count()
#: Per thread: whether a queue is running (a queued function may call the model or build).
_RUNNING = threading.local()


@dataclass(eq=False)
class _Entry:
    fn: Callable[[Any], object]
    order: int


class OnBuildHandle:
    """Returned by :func:`on_build`: ``pending`` tells whether the function still waits,
    ``remove()`` drops it if it has not run."""

    def __init__(self, module: nn.Module | None, entry: _Entry | None) -> None:
        self._module = weakref.ref(module) if module is not None else None
        self._entry = entry

    def _queue(self) -> list[_Entry]:
        module = self._module() if self._module is not None else None
        return module.__dict__.get(_KEY, []) if module is not None else []

    @property
    def pending(self) -> bool:
        """Whether the function is still waiting for the build."""
        return self._entry is not None and self._entry in self._queue()

    def remove(self) -> None:
        with _BUILD_LOCK:
            module = self._module() if self._module is not None else None
            if module is not None and self._entry in self._queue():
                _take(module, [self._entry])


def ready(module: nn.Module) -> bool:
    """Whether every parameter and buffer in ``module`` holds real, allocated values."""
    for m in module.modules():
        if is_unbuilt(m) or (
            isinstance(m, nn.modules.lazy.LazyModuleMixin) and hasattr(m, "_initialize_hook")
        ):
            return False
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None and (is_placeholder(t) or t.is_meta or nn.parameter.is_lazy(t)):
                return False
    return True


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
    if not callable(fn):
        raise LazynnError(
            message(
                f"lazynn.on_build({module_path(module)})",
                "a function taking the module",
                f"{type(fn).__name__} {fn!r}",
                "pass a callable, e.g. lambda m: m.apply(init_fn)",
            )
        )
    with _BUILD_LOCK:
        if ready(module) and not _due(module):
            fn(module)
            return OnBuildHandle(None, None)
        entry = _Entry(fn, next(_ORDER))
        queue = module.__dict__.setdefault(_KEY, [])
        if not queue:
            # prepend: the build sees the call's own arguments, before other pre-hooks run
            module.register_forward_pre_hook(_before_forward, prepend=True, with_kwargs=True)
            module.register_load_state_dict_post_hook(_after_load)  # type: ignore[no-untyped-call]
        queue.append(entry)
        return OnBuildHandle(module, entry)


def _due(scope: nn.Module) -> list[tuple[nn.Module, _Entry]]:
    """The queued functions of ``scope`` and its submodules, in the order they were queued."""
    found = [(m, e) for m in scope.modules() for e in m.__dict__.get(_KEY, [])]
    return sorted(found, key=lambda pair: pair[1].order)


def _take(module: nn.Module, entries: list[_Entry]) -> None:
    """Unqueue ``entries``; with the queue empty, take the module's hooks off too."""
    queue = module.__dict__.get(_KEY, [])
    remaining = [e for e in queue if e not in entries]
    if remaining:
        module.__dict__[_KEY] = remaining
        return
    module.__dict__.pop(_KEY, None)
    module.__dict__.pop(_TRIED, None)
    # (nn.Module's hook dicts: the handles would point at another module's dicts after a
    # deepcopy, so the hooks are found by function.)
    for key in [k for k, h in module._forward_pre_hooks.items() if h is _before_forward]:
        del module._forward_pre_hooks[key]
        module._forward_pre_hooks_with_kwargs.pop(key, None)
    for key in [k for k, h in module._load_state_dict_post_hooks.items() if h is _after_load]:
        del module._load_state_dict_post_hooks[key]


def _before_forward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if (
        rehearsing()
        or in_build()
        or getattr(_RUNNING, "active", False)
        or torch.compiler.is_compiling()
        or not module.__dict__.get(_KEY)
    ):
        return
    with _BUILD_LOCK:
        if not ready(module):
            # Once per kind of call: a call like one tried before reaches no other layer.
            kind = _kind((args, kwargs))
            tried = module.__dict__.setdefault(_TRIED, set())
            if kind in tried:
                return
            from ._build import _build

            try:
                _build(module, args, kwargs, partial=True)  # runs the queue when it can
            except InferenceError as error:
                if not _needs_values(error):
                    raise
                # The forward needs values (it cannot run on meta): build layer by layer,
                # as a plain first call; the queue runs before the next forward.
            if not ready(module):
                module.__dict__.setdefault(_TRIED, set()).add(kind)
        run_ready(module)


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


def _needs_values(error: InferenceError) -> bool:
    return "needs values" in str(error)


def _after_load(module: nn.Module, incompatible: Any) -> None:
    if not rehearsing():
        run_ready(module)


def run_ready(scope: nn.Module) -> None:
    """Run the queued functions of ``scope`` and its submodules whose module is ready.

    Atomic: if one fails, the due modules' tensors and structure are put back as they were
    and the failed function and those after it stay queued.
    """
    if getattr(_RUNNING, "active", False):
        return  # a queued function called the model, or built: the queue is running
    with _BUILD_LOCK:
        due = [(m, e) for m, e in _due(scope) if ready(m)]
        if not due:
            return
        modules = list({id(m): m for m, _ in due}.values())
        snapshots = [Snapshot(m) for m in modules]
        backup = {
            id(t): (t, t.detach().clone())
            for m in modules
            for sub in m.modules()
            for t in (*sub._parameters.values(), *sub._buffers.values())
            if t is not None and not is_placeholder(t) and not t.is_meta
        }
        for module in modules:  # taken off first: a queued function may call the model
            _take(module, [e for m, e in due if m is module])
        _RUNNING.active = True
        try:
            for module, entry in due:
                entry.fn(module)
        except BaseException:
            for snapshot in snapshots:
                snapshot.restore()  # structure, and the queues as they were
            with torch.no_grad():
                for tensor, value in backup.values():
                    if tensor.shape == value.shape and tensor.dtype == value.dtype:
                        tensor.copy_(value)
                    else:
                        tensor.data = value
            raise
        finally:
            _RUNNING.active = False
