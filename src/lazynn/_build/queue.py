"""The ``on_build`` queue: work kept in a module until its lazy layers are built.

The queue lives in the module's ``__dict__`` (:data:`KEY`, a frozen :class:`Queue`; a
``deepcopy`` carries it, nothing global holds the module), ordered by a process-wide counter.
:func:`run_ready` runs what is due, atomically; ``build``, ``materialize`` and the hooks of
``lazynn.on_build`` (``on_build.py``) call it. This module holds no hook of its own and imports
no builder, so every builder can import it.

>>> import torch
>>> ready(torch.nn.Linear(2, 2))
True
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from .._errors import LazynnError, first_line, message
from .._module.lifecycle import is_lazy_module, is_unbuilt
from .._module.snapshot import atomic
from .._module.state import BUILD_LOCK, QUEUE_KEY, WAITING, constructed, context, next_order
from .._module.tensors import is_placeholder, own_tensors

__all__ = [
    "KEY",
    "Entry",
    "Queue",
    "add",
    "built_on_meta",
    "due",
    "entries",
    "has_queue",
    "mark_tried",
    "note_loaded",
    "queue_hook",
    "ready",
    "run_on_meta",
    "run_ready",
    "take",
    "tried",
]

#: where a module keeps its queue (in its __dict__, so that a copy carries it)
KEY = QUEUE_KEY


@dataclass(eq=False, frozen=True)
class Entry:
    """A queued function, and its place in the process-wide order."""

    fn: Callable[[Any], object]
    order: int
    #: how many lazy layers the program had constructed when it queued it (``build`` runs
    #: it after constructing those, before the next, when its module is ready by then)
    after: int = 0
    #: the CPU generator's state when it was queued: the instance form's build runs it before
    #: the eager layer constructed from that state on (``reinit_plan.Plan.starts``)
    rng: torch.Tensor | None = None


@dataclass(frozen=True)
class Queue:
    """A module's queue: replaced, never changed in place (so a Snapshot of the module's
    ``__dict__`` restores it)."""

    entries: tuple[Entry, ...] = ()
    #: kinds of first call whose whole-module build was tried and reached not every layer
    tried: frozenset[Any] = frozenset()
    #: whether its functions are running (taken off, hooks kept: another thread's forward
    #: waits for them at the hook)
    running: bool = False
    #: the state_dict keys (below the module) a checkpoint loaded while functions waited:
    #: loaded values win, so the tensors there take them back after the functions run
    loaded: frozenset[str] = frozenset()


def queue_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a hook as the queue's: :func:`take` removes marked hooks with the last entry."""
    fn._lazynn_queue_hook = True  # type: ignore[attr-defined]
    return fn


def _queue(module: nn.Module) -> Queue | None:
    return module.__dict__.get(KEY)


def has_queue(module: nn.Module) -> bool:
    """Whether the module has a queue: functions waiting, or running."""
    return _queue(module) is not None


def entries(module: nn.Module) -> tuple[Entry, ...]:
    """The module's queued entries."""
    queue = _queue(module)
    return queue.entries if queue is not None else ()


def add(module: nn.Module, fn: Callable[[Any], object]) -> tuple[Entry, bool]:
    """Queue ``fn`` on ``module``: (its entry, whether it is the first, so hooks are due)."""
    entry = Entry(fn, next_order(), constructed(), torch.get_rng_state())
    queue = _queue(module)
    first = queue is None  # (a running queue keeps its hooks)
    queue = queue or Queue()
    module.__dict__[KEY] = replace(queue, entries=(*queue.entries, entry))
    WAITING.add(module)
    return entry, first


def note_loaded(module: nn.Module, keys: Collection[str]) -> None:
    """Remember that a checkpoint loaded ``keys`` (below ``module``) while its functions
    still wait: when they run, those tensors take their loaded values back after them (the
    eager program ran them before the load)."""
    queue = _queue(module)
    if queue is not None and queue.entries:
        module.__dict__[KEY] = replace(queue, loaded=queue.loaded | frozenset(keys))


def _loaded_values(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each tensor of ``module`` a checkpoint loaded while its queue waited, with a copy of
    its value now."""
    queue = _queue(module)
    if queue is None or not queue.loaded:
        return []
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return [
        (tensors[key], tensors[key].detach().clone())
        for key in sorted(queue.loaded)
        if key in tensors and not is_placeholder(tensors[key]) and not tensors[key].is_meta
    ]


def tried(module: nn.Module, kind: Any) -> bool:
    """Whether a whole-module build from a call of this kind was tried already."""
    queue = _queue(module)
    return queue is not None and kind in queue.tried


def mark_tried(module: nn.Module, kind: Any) -> None:
    """Remember that a whole-module build from a call of this kind was tried."""
    queue = _queue(module)
    if queue is not None:
        module.__dict__[KEY] = replace(queue, tried=queue.tried | {kind})


def built_on_meta(module: nn.Module) -> bool:
    """Whether every lazy layer in ``module`` is built, and some of its tensors are on meta
    (queued work on it waits for ``materialize``)."""
    tensors = [t for m in module.modules() for t in own_tensors(m)]
    if any(is_unbuilt(m) or is_lazy_module(m) for m in module.modules()):
        return False
    if any(is_placeholder(t) or nn.parameter.is_lazy(t) for t in tensors):
        return False
    return any(t.is_meta for t in tensors)


def ready(module: nn.Module) -> bool:
    """Whether every parameter and buffer in ``module`` holds real, allocated values."""
    for m in module.modules():
        if is_unbuilt(m) or is_lazy_module(m):
            return False
        for t in own_tensors(m):
            if is_placeholder(t) or t.is_meta or nn.parameter.is_lazy(t):
                return False
    return True


def due(scope: nn.Module) -> list[tuple[nn.Module, Entry]]:
    """The queued functions of ``scope`` and its submodules, in the order they were queued."""
    found = [(m, e) for m in scope.modules() for e in entries(m)]
    return sorted(found, key=lambda pair: pair[1].order)


def take(module: nn.Module, gone: list[Entry]) -> None:
    """Unqueue ``gone``; with the queue empty, take the module's queue hooks off too."""
    queue = _queue(module)
    remaining = tuple(e for e in (queue.entries if queue else ()) if e not in gone)
    if queue is not None and (remaining or queue.running):
        module.__dict__[KEY] = replace(queue, entries=remaining)
        return
    _drop(module)


def _drop(module: nn.Module) -> None:
    """The queue is done: take it off the module, and its hooks."""
    module.__dict__.pop(KEY, None)
    WAITING.discard(module)
    if module.__dict__.get("_initialize_hook") is True:  # (dynamo's protocol, on_build.py)
        del module.__dict__["_initialize_hook"]
        module.__dict__.pop("_infer_parameters", None)
    # (nn.Module's hook dicts: the handles would point at another module's dicts after a
    # deepcopy, so the hooks are found by their mark.)
    for key in [k for k, h in module._forward_pre_hooks.items() if _marked(h)]:
        del module._forward_pre_hooks[key]
        module._forward_pre_hooks_with_kwargs.pop(key, None)
    for key in [k for k, h in module._load_state_dict_pre_hooks.items() if _marked(h)]:
        del module._load_state_dict_pre_hooks[key]  # (torch's wrapper copies the mark)


def _marked(hook: Any) -> bool:
    return bool(getattr(hook, "_lazynn_queue_hook", False))


def run_ready(
    scope: nn.Module, only: Collection[Entry] | None = None, on_meta: bool = False
) -> None:
    """Run the queued functions of ``scope`` and its submodules whose module is ready (of
    those, ``only`` these if given; ``on_meta``: a module built on meta is ready too, in a
    build on meta, whose recorder takes the functions' steps).

    Atomic: if one fails, the due modules' tensors and structure are put back as they were
    and the failed function and those after it stay queued. The functions are taken off their
    queues before they run: one may call the model (its queue is not run again), or build
    another model, whose own queue then runs as usual.
    """
    with BUILD_LOCK:
        found = [
            (m, e)
            for m, e in due(scope)
            if (only is None or e in only) and (ready(m) or (on_meta and built_on_meta(m)))
        ]
        if not found:
            return
        modules = list({id(m): m for m, _ in found}.values())
        # (a failure puts back the modules, their tensors' values and the queues as they were)
        with atomic(*modules, values=True):
            for module in modules:  # taken off first: a queued function may call the model
                queue = _queue(module)
                assert queue is not None
                gone = [e for m, e in found if m is module]
                left = tuple(e for e in queue.entries if e not in gone)
                module.__dict__[KEY] = replace(queue, entries=left, running=True)
            loaded = [pair for m in modules for pair in _loaded_values(m)]
            scopes = context().queue_scopes
            scopes.extend(modules)
            try:
                for module, entry in found:
                    entry.fn(module)
            finally:
                del scopes[len(scopes) - len(modules) :]
            with torch.no_grad():
                for tensor, value in loaded:  # (loaded values win, as after eager code)
                    if tensor.shape == value.shape:
                        tensor.copy_(value)
        for module in modules:  # done: a queue emptied takes its hooks off
            queue = _queue(module)
            if queue is not None and queue.entries:
                module.__dict__[KEY] = replace(queue, running=False)
            elif queue is not None:
                _drop(module)


def run_on_meta(model: nn.Module, module: nn.Module, entry: Entry) -> None:
    """Queued work in a build on meta: run on the meta tensors, its steps more of the
    recording (each tensor's init program: ``materialize`` replays it, a rank of a sharded
    model only its shards), as a construction recorded on meta runs it (values it reads are
    computed for real). Work that fails there is refused, naming it; the build is undone."""
    try:
        with torch.enable_grad():
            run_ready(model, only=[entry], on_meta=True)
    except LazynnError:
        raise
    except Exception as error:
        raise _queued_error(model, module, entry, error) from error


def _queued_error(
    model: nn.Module, module: nn.Module, entry: Entry, error: Exception
) -> LazynnError:
    path = next((p for p, m in model.named_modules() if m is module), "")
    where = f"{type(module).__name__} at '{path}'" if path else type(module).__name__
    return LazynnError(
        message(
            where,
            "work queued with lazynn.on_build that runs on the meta tensors of a build on "
            "meta (its steps become the tensors' init programs, which materialize replays, "
            "a rank of a sharded model only its shards)",
            f"{getattr(entry.fn, '__qualname__', repr(entry.fn))}, which failed there",
            "build on the device (lazynn.build(model, example)) for work that needs real "
            "values, or run it after lazynn.materialize(model)",
            detail=first_line(error),
        )
    )
