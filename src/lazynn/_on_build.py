"""lazynn.on_build: work on a module that waits until its lazy layers are built.

What users do to a model right after constructing it (custom initialization, parametrizations
such as ``weight_norm``, pruning, an EMA copy) needs the parameters' shapes or values, which
an unbuilt model does not have. ``on_build(module, fn)`` queues ``fn(module)`` until every
lazy layer in ``module`` is built and allocated (not on meta), then runs it, once:

* at the end of :func:`lazynn.build` or :func:`lazynn.materialize`, or after a
  ``load_state_dict`` that builds the module;
* or on the module's first call: a forward pre-hook builds the whole module first with
  :func:`lazynn.build` from that call's inputs (nothing runs on unbuilt layers), runs the
  queue, then the forward runs on the finished module.

Queued functions run in the order they were queued. Because the build replays construction
draws in construction order, ``on_build(model, lambda m: m.apply(init))`` gives the numbers
of an eager ``model.apply(init)`` under the same seed. If a queued function fails, the
module is put back as it was before the build (its tensors are backed up while the queue
runs) and the function stays queued.

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

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

from ._errors import LazynnError, message, module_path
from ._mixin import _BUILD_LOCK, in_build, is_unbuilt, rehearsing
from ._placeholder import is_placeholder
from ._snapshot import Snapshot

__all__ = ["OnBuildHandle", "on_build", "run_ready"]

M = TypeVar("M", bound=nn.Module)


@dataclass(eq=False)
class _Entry:
    module: weakref.ref[nn.Module]
    fn: Callable[[Any], object]
    hooks: list[Any] = field(default_factory=list)


#: queued work, in the order it was queued (process-wide, under the build lock)
_QUEUE: list[_Entry] = []


class OnBuildHandle:
    """Returned by :func:`on_build`; ``remove()`` drops the queued function if it has not run."""

    def __init__(self, entry: _Entry | None) -> None:
        self._entry = entry

    @property
    def pending(self) -> bool:
        """Whether the function is still waiting for the build."""
        return self._entry is not None and self._entry in _QUEUE

    def remove(self) -> None:
        with _BUILD_LOCK:
            if self._entry is not None and self._entry in _QUEUE:
                _drop(self._entry)


def _drop(entry: _Entry) -> None:
    _QUEUE.remove(entry)
    for hook in entry.hooks:
        hook.remove()


def ready(module: nn.Module) -> bool:
    """Whether every parameter and buffer in ``module`` holds real, allocated values."""
    for m in module.modules():
        if is_unbuilt(m) or isinstance(m, nn.modules.lazy.LazyModuleMixin):
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
        if ready(module) and not _pending_in(module):
            fn(module)
            return OnBuildHandle(None)
        entry = _Entry(weakref.ref(module), fn)
        entry.hooks.append(module.register_forward_pre_hook(_before_forward, with_kwargs=True))
        entry.hooks.append(module.register_load_state_dict_post_hook(_after_load))  # type: ignore[no-untyped-call]
        _QUEUE.append(entry)
        return OnBuildHandle(entry)


def _pending_in(scope: nn.Module) -> list[_Entry]:
    inside = {id(m) for m in scope.modules()}
    return [e for e in _QUEUE if (m := e.module()) is not None and id(m) in inside]


def _before_forward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if rehearsing() or in_build() or torch.compiler.is_compiling():
        return
    with _BUILD_LOCK:
        if not _pending_in(module):
            return
        if not ready(module):
            from ._build import _build

            _build(module, args, kwargs, partial=True)  # runs the queue when it can
        run_ready(module)


def _after_load(module: nn.Module, incompatible: Any) -> None:
    if not rehearsing():
        run_ready(module)


def run_ready(scope: nn.Module) -> None:
    """Run the queued functions of ``scope`` and its submodules whose module is ready.

    Atomic: if one fails, every tensor and module in ``scope`` is put back as it was and the
    failed function and those after it stay queued.
    """
    with _BUILD_LOCK:
        for dead in [e for e in _QUEUE if e.module() is None]:
            _drop(dead)
        due = [e for e in _pending_in(scope) if ready(e.module())]  # type: ignore[arg-type]
        if not due:
            return
        snapshot = Snapshot(scope)
        backup = {
            id(t): (t, t.detach().clone())
            for m in scope.modules()
            for t in (*m._parameters.values(), *m._buffers.values())
            if t is not None
        }
        done = []
        try:
            for entry in due:
                module = entry.module()
                assert module is not None
                entry.fn(module)
                done.append(entry)
        except BaseException:
            snapshot.restore()
            with torch.no_grad():
                for tensor, value in backup.values():
                    if tensor.shape == value.shape and tensor.dtype == value.dtype:
                        tensor.copy_(value)
                    else:
                        tensor.data = value
            raise
        for entry in done:
            _drop(entry)
