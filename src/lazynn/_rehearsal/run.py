"""One run of a model in a rehearsal: hooks on every module record what happens.

Each module's calls (input and output shapes, how many, their FLOPs), the first call's inputs
of the lazy modules that are not lazynn's, the sizes lazynn's read, and the failures by module,
so that an error names the innermost module whose forward raised (``failures.py``). The run is
the rehearsal's thread's, and its workers': a thread its forward runs modules on with meta
inputs joins it (its device mode and FLOP counter, for the call). Another thread's call of a
module of the model is its own, on its real tensors; of a layer that was lazy when the run
began (and may be built on meta for the run), it waits for the build lock, as a first call
does, and meets the layer as the build or the rehearsal left it.

Its hooks are lazynn's own: a snapshot taken inside the forward does not take the run
(``reach.UNREACHED``), and a copy or a pickle of a module the forward makes holds hooks that
record nothing (``_Ended``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Iterable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from .._errors import (
    Fix,
    InferenceError,
    LazynnError,
    UnbuiltError,
    first_line,
    message,
    with_note,
)
from .._layer.arguments import left_in_note
from .._layer.base import LazyLayer
from .._module.lifecycle import build_lazy_module, is_lazy_module
from .._module.state import BUILD_LOCK, Rehearsing, context, find_state
from .._module.tensors import (
    map_tensors,
    own_tensors,
    shapes,
)
from .counter import FlopCounter
from .failures import failure_of
from .learnt import Call
from .meta_device import MetaDevice
from .stand_ins import StandIns

__all__ = ["Run"]


class Run:
    """One run of the model on meta inputs, hooks on every module recording what happens (see
    :func:`rehearse`): each module's calls, the first call's inputs of the lazy modules that
    are not lazynn's, the sizes lazynn's read, the failures by module. Calls are recorded on
    the rehearsal's thread, and on a thread its forward runs modules on: a worker that calls
    one with meta inputs joins the run, its call under the run's device mode and FLOP counter
    until that call ends (a global hook ends it, even after the run; no one waits). Another
    thread's call of a module of the model is its own: not recorded; of a layer lazy when the
    run began, it waits for the build lock (:meth:`_first_call_elsewhere`)."""

    # (a rehearsal inside the forward does not take this run, its hooks' owner, into its
    # snapshot: what this run records stays)
    _lazynn_unreached = True  # (reach.UNREACHED)

    def __init__(
        self, modules: dict[str, nn.Module], count_flops: bool, stand_ins: StandIns
    ) -> None:
        #: each module of the model by its first path
        self.modules = modules
        self.paths: dict[int, str] = {id(m): p for p, m in modules.items()}
        #: lazy modules by path, and their class before the run (they build as it runs)
        self.lazy = {p: type(m) for p, m in modules.items() if is_lazy_module(m)}
        #: lazy layers by path, and what they knew before the run (their arguments)
        self.before = {p: s for p, m in modules.items() if (s := find_state(m)) is not None}
        self.handles: list[RemovableHandle] = []
        self.calls: dict[str, Call] = {}
        self.sizes: dict[nn.Module, dict[str, Any]] = {}
        self.inputs: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.failures: list[tuple[BaseException, tuple[str, nn.Module, Any, Any]]] = []
        #: the innermost module whose forward raised the run's error, if it raised
        self.failed: nn.Module | None = None
        self.counter = FlopCounter(display=False) if count_flops else None
        self.rehearsing = Rehearsing()  # what each lazy layer reads, recorded by the layer
        self.rehearsing.stand_ins = stand_ins
        self.stand_ins = stand_ins
        counter = self.counter
        if counter is not None:
            self.rehearsing.counted = lambda: int(counter.get_total_flops())
        self.thread = threading.get_ident()
        #: the run's thread's context (whose rehearsal is the innermost one running there)
        self.home = context()
        #: whether the run is over
        self.over = False
        #: per thread: the calls running (for the post hook); a worker's modes, and the
        #: modules it entered under them
        self._local = threading.local()
        #: how many workers are inside a call of the run; the global hook that ends their
        #: calls (removed by the last of them once the run is over)
        self._workers = 0
        self._lock = threading.Lock()
        self._ends: RemovableHandle | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Ended:
        return _ENDED  # (a copy of a module the forward makes: its hooks record nothing)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ended, ())  # (a module the forward pickles: likewise)

    def meter(self) -> int:
        """The FLOPs counted so far, less lazynn's own work's (:func:`apart`)."""
        if self.counter is None:
            return 0
        return int(self.counter.get_total_flops()) - self.rehearsing.apart

    def hook(self, modules: Iterable[nn.Module]) -> None:
        """Attach the recording hooks to ``modules`` (handles: ``self.handles``)."""
        for module in modules:
            self.handles.append(
                module.register_forward_pre_hook(self.pre, prepend=True, with_kwargs=True)
            )
            self.handles.append(
                module.register_forward_hook(self.post, with_kwargs=True, always_call=True)
            )

    def _stack(self) -> list[tuple[str, nn.Module, Any, Any, BaseException | None, int]]:
        stack: list[tuple[str, nn.Module, Any, Any, BaseException | None, int]] | None
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _ours(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> bool:
        """Whether a call belongs to this run: on its thread while no rehearsal nested in its
        forward runs (a summary of a submodule records its own), or on a worker thread the
        forward runs modules on with meta inputs (which then runs under the run's modes,
        see the class doc)."""
        if threading.get_ident() == self.thread:
            return context().rehearsal is self.rehearsing
        if self.over or self.home.rehearsal is not self.rehearsing:
            return False  # (over; or a worker of a rehearsal nested in the forward: its own)
        if getattr(self._local, "modes", None) is not None:
            return True
        metas: list[bool] = []
        map_tensors(lambda t: metas.append(t.is_meta), (a, k))
        if not any(metas):
            return False  # (another thread's own call, on real inputs)
        modes: list[Any] = [MetaDevice(stand_ins=self.stand_ins)]
        if self.counter is not None and self.counter.mode is not None:
            modes.append(type(self.counter.mode)(self.counter))  # (its FLOPs are the run's)
        for mode in modes:
            mode.__enter__()
        self._local.modes, self._local.entered = modes, []
        with self._lock:
            self._workers += 1
            if self._ends is None:
                self._ends = nn.modules.module.register_module_forward_hook(
                    self._worker_ended, always_call=True
                )
        return True

    def _worker_ended(self, module: nn.Module, a: Any, out: Any) -> None:
        """A global forward hook: a worker's module call is over; the last of its calls
        under the run's modes takes them off its thread."""
        entered = getattr(self._local, "entered", None)
        if not entered or entered[-1] is not module:
            return
        entered.pop()
        if entered:
            return
        for mode in reversed(self._local.modes):
            mode.__exit__(None, None, None)
        self._local.modes = self._local.entered = None
        with self._lock:
            self._workers -= 1
            if self.over and not self._workers and self._ends is not None:
                self._ends.remove()
                self._ends = None

    def end(self) -> None:
        """The run is over: its hooks off the model (a worker still inside a call of it keeps
        the run's modes until that call ends: see :meth:`_worker_ended`)."""
        self.over = True
        for handle in self.handles:
            handle.remove()
        with self._lock:
            if not self._workers and self._ends is not None:
                self._ends.remove()
                self._ends = None

    def pre(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        if not self._ours(module, a, k):
            self._first_call_elsewhere(module, a, k)
            return
        path = self.paths.get(id(module), "?")
        self._stack().append((path, module, a, k, sys.exc_info()[1], self.meter()))
        entered = getattr(self._local, "entered", None)
        if entered is not None:  # (a worker's: its modes end with its outermost call)
            entered.append(module)
        if path not in self.calls:
            self.calls[path] = Call(path, shapes((a, k)), count=0)
            if path in self.lazy:
                self.inputs[module] = (a, k)
        self.calls[path].count += 1

    def _first_call_elsewhere(
        self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]
    ) -> None:
        """Another thread's call of a layer that was lazy when the run began: the run may have
        built it on meta (its class the eager one, its own build hook gone from the call's
        hooks), so the call waits for the build lock the rehearsal holds, as a first call
        waits, then meets the layer as the build left it, or, still lazy (a summary's
        rehearsal puts it back), builds it from its own input, as its first call."""
        if self.paths.get(id(module)) not in self.lazy:
            return
        with BUILD_LOCK:
            if is_lazy_module(module):
                build_lazy_module(module, a, k)

    def post(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any], out: Any) -> None:
        stack = self._stack()
        if not stack or stack[-1][1] is not module:
            return  # (a pre-hook before this one raised, or not this run's call)
        path, _, entry_a, entry_k, before, start = stack.pop()
        raised = sys.exc_info()[1]
        if raised is not None and raised is not before:  # this module's forward raised
            self.failures.append((raised, (path, module, entry_a, entry_k)))
            return
        call = self.calls[path]
        call.flops += self.meter() - start
        if not call.outputs:
            call.outputs = shapes(out)
        lazy_cls = self.lazy.get(path)
        if lazy_cls is not None and issubclass(lazy_cls, LazyLayer) and module not in self.sizes:
            # (what it read; or, built by a lazynn.build the forward called, what that gave it)
            read = self.rehearsing.sizes.get(id(module))
            if read is not None:
                self.sizes[module] = read

    def __call__(self, root: nn.Module, args: Any, kwargs: Any) -> Any:
        """Run ``root``; a failure raises naming the innermost module whose forward raised
        (and any layer before it that read its input in a way that may not be meant)."""
        try:
            with self.counter if self.counter is not None else contextlib.nullcontext():
                return root(*args, **kwargs)
        except Warning:
            raise  # a warning turned error (warnings.simplefilter("error")), as torch raises it
        except Exception as error:
            failure = error
            found = next((w for e, w in self.failures if e is error), None)
            self.failed = found[1] if found is not None else None
            if isinstance(error, UnbuiltError) and error.placeholder is not None:
                failure = self._unbuilt_read(error, found)
            elif not isinstance(error, LazynnError):
                where = found
                failure = failure_of(error, where, self.lazy)
                left_in = self._left_in(*found[:2]) if found is not None else None
                failure = failure if left_in is None else with_note(failure, left_in)
            for note in self.notes().values():  # (a forgotten batch dimension, say)
                failure = with_note(failure, note)
            if failure is error:
                raise
            raise failure from error

    def _unbuilt_read(
        self, error: UnbuiltError, where: tuple[str, nn.Module, Any, Any] | None
    ) -> InferenceError:
        """A forward that reads a tensor of a lazy layer it has not called (``x @
        self.proj.weight.t()``): the layer's sizes come from its inputs, which it never had."""
        owner = next(
            (  # (the lazy layer it stands in, even where a parametrization now holds it)
                path
                for path, module in self.modules.items()
                if (state := find_state(module)) is not None
                and any(t is error.placeholder for t in state.placeholders.values())
            ),
            None,
        ) or next(
            (
                path
                for path, module in self.modules.items()
                if any(t is error.placeholder for t in own_tensors(module))
            ),
            None,
        )
        reader = where[0] if where is not None else ""
        label = f"'{reader}'" if reader else "the model's forward"
        layer = f"'{owner}'" if owner else "a lazy layer"
        parts = error.parts
        if parts is not None and parts.key is Fix.ON_BUILD:  # (a parametrization, in the model)
            return InferenceError(
                dataclasses.replace(
                    parts, where=f"{self.lazy.get(owner or '', nn.Module).__name__} at {layer}"
                )
            )
        return InferenceError(
            message(
                f"{self.lazy.get(owner or '', nn.Module).__name__} at {layer}",
                "a forward that calls a lazy layer before it reads the layer's tensors (its "
                "sizes come from its inputs)",
                f"{label} reading the tensors of {layer} without calling it",
                f"call {layer} in the forward (it is then built from what it receives), or "
                "construct it with its sizes written (the eager class), or read it after the "
                "build",
                detail=_what_was_read(error),
                outcome="the model is unchanged",
            )
        )

    def _left_in(self, path: str, module: nn.Module) -> str | None:
        """Whether the lazy layer at ``path``, whose forward failed, may have kept an input
        size among its arguments (see ``left_in_note``)."""
        kind, before = self.lazy.get(path), self.before.get(path)
        sizes = self.rehearsing.sizes.get(id(module))
        if kind is None or before is None or sizes is None:
            return None
        return left_in_note(kind, type(module), before.kwargs, sizes)

    def notes(self) -> dict[str, str]:
        """Path -> why a lazy layer's reading of its input may not be the one meant."""
        found = [
            (p, n) for i, n in self.rehearsing.notes.items() if (p := self.paths.get(i)) is not None
        ]
        # (a layer a factory's first run laid out as its eager class reads as a lazy one)
        return {
            p: f"{(self.lazy.get(p) or type(self.modules[p])).__name__} at '{p}' {n}"
            for p, n in found
        }


class _Ended:
    """A run's hooks in a copy or a pickle of a module made while it runs record nothing: a
    copy's are the run's methods bound to this, a pickle's this one's."""

    _lazynn_unreached = True  # (reach.UNREACHED)

    def _ours(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> bool:
        return False

    def _first_call_elsewhere(self, module: nn.Module, a: Any, k: Any) -> None:
        return None

    def _stack(self) -> list[Any]:
        return []

    def pre(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        return None

    def post(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any], out: Any) -> None:
        return None


_ENDED = _Ended()


def _ended() -> _Ended:
    return _ENDED


def _what_was_read(error: UnbuiltError) -> str:
    """The refused read: ``the 'weight' of LazyLinear: expected a built tensor for Tensor.t``
    (not the refusal's own fix, which would name the build that is failing)."""
    parts = error.parts
    if parts is None:
        return first_line(error)
    return f"{parts.where}: expected {parts.expected}"
