"""The meta rehearsal: run a model's own forward on meta tensors and record what happens.

The rehearsal runs the model itself, so the user's Python (its forward, hooks, the functions
they call) sees what an eager forward sees: the same module objects (identity, ``id()``,
``type()``), the lists, dicts and objects they share, global and module hooks, every call in
order, and what it writes to shared state is read later in the same forward. Only tensors
differ, on the rehearsal's thread: the examples are meta tensors, the model's real tensors
are seen as meta stand-ins (``stand_ins.py``: their values are never written, and other
threads read them as they are), and each placeholder is a meta placeholder for the run. Lazy
layers build themselves on meta as they are called (their own code, so the sizes are
exactly what a real first call would infer), and hooks record each module's input and output
shapes. No memory is allocated for parameters or activations, and no arithmetic runs.

Everything the run changes in the model, and in the state its modules reach (a snapshot that
reaches to any depth: ``Snapshot(reach=True)``), is put back after it, whatever happened;
and every random generator. The build lock is held throughout: no build changes the model
meanwhile, and another thread's first call of a lazy layer waits for the rehearsal. What a
draw on a real device moved (``torch.rand(n, device="cpu")``) is put back
(``meta_device.py``), so the build's allocation draws what eager construction draws.

Used by ``lazynn.build`` (sizes, then allocation) and ``lazynn.summary`` (the table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._errors import (
    AmbiguousInputWarning,
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
from .._module.callers import user_stacklevel
from .._module.lifecycle import is_lazy_module, own_modes
from .._module.snapshot import OtherRandom, RandomState, Snapshot
from .._module.state import BUILD_LOCK, Rehearsing, context, find_state
from .._module.tensors import (
    is_placeholder,
    map_tensors,
    meta_like,
    own_slots,
    own_tensors,
    shapes,
)
from .collector import paused
from .counter import FlopCounter
from .failures import failure_of
from .learnt import Call, Rehearsal, TensorInfo
from .meta_device import MetaDevice
from .spec import as_meta
from .stand_ins import StandIns, placeholders_on_meta

__all__ = ["apart", "first_paths", "rehearse", "warn_notes"]


class _Run:
    """One run of the model on meta inputs, hooks on every module recording what happens (see
    :func:`rehearse`): each module's calls, the first call's inputs of the lazy modules that
    are not lazynn's, the sizes lazynn's read, the failures by module. Calls are recorded on
    the rehearsal's thread, and on a thread its forward runs modules on (a worker given meta
    inputs, which runs them under the run's device mode); another thread's calls of the same
    modules are its own."""

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
        #: per thread: the calls running (for the post hook), and a worker's device mode
        self._local = threading.local()

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

    def _ours(self, a: tuple[Any, ...], k: dict[str, Any]) -> bool:
        """Whether a call belongs to this run: on its thread while no rehearsal nested in its
        forward runs (a summary of a submodule records its own), or on a worker thread the
        forward runs modules on with meta inputs (which then runs under the device mode)."""
        if threading.get_ident() == self.thread:
            return context().rehearsal is self.rehearsing
        if getattr(self._local, "device", None) is not None:
            return True
        metas: list[bool] = []
        map_tensors(lambda t: metas.append(t.is_meta), (a, k))
        if not any(metas):
            return False  # (another thread's own call, on real inputs)
        device = MetaDevice(stand_ins=self.stand_ins)
        device.__enter__()
        self._local.device = device
        return True

    def pre(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        if not self._ours(a, k):
            return
        path = self.paths.get(id(module), "?")
        self._stack().append((path, module, a, k, sys.exc_info()[1], self.meter()))
        if path not in self.calls:
            self.calls[path] = Call(path, shapes((a, k)), count=0)
            if path in self.lazy:
                self.inputs[module] = (a, k)
        self.calls[path].count += 1

    def post(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any], out: Any) -> None:
        stack = self._stack()
        if not stack or stack[-1][1] is not module:
            return  # (a pre-hook before this one raised, or not this run's call)
        path, _, entry_a, entry_k, before, start = stack.pop()
        if not stack and threading.get_ident() != self.thread:  # (a worker's call is over)
            self._local.device.__exit__(None, None, None)
            self._local.device = None
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
        found = ((self.paths.get(i), n) for i, n in self.rehearsing.notes.items())
        return {p: f"{self.lazy[p].__name__} at '{p}' {n}" for p, n in found if p is not None}


def _what_was_read(error: UnbuiltError) -> str:
    """The refused read: ``the 'weight' of LazyLinear: expected a built tensor for Tensor.t``
    (not the refusal's own fix, which would name the build that is failing)."""
    parts = error.parts
    if parts is None:
        return first_line(error)
    return f"{parts.where}: expected {parts.expected}"


def rehearse(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    literal: bool = False,
    training: bool | None = None,
    count_flops: bool = False,
    learned: dict[nn.Module, dict[str, Any]] | None = None,
) -> Rehearsal:
    """Run ``model`` itself on meta versions of the examples; return what was learnt.

    The run changes nothing that stays: the model, the state its modules reach and every
    random generator are put back after it (see the module doc), success or failure. A
    failure raises :class:`~lazynn.InferenceError` naming the innermost module running when
    it happened, its type and the input shapes it received. ``literal``: the examples are a
    real call's arguments (only tensors become meta). ``training`` runs every module in that
    mode (None: as each is). ``count_flops`` counts each call's FLOPs with
    ``torch.utils.flop_counter.FlopCounterMode``. ``learned`` takes the sizes each lazy layer
    read before the run ended, even when it failed.
    """
    if literal:  # a real call's arguments: only tensors become meta (a tuple stays a tuple)
        meta_args = map_tensors(meta_like, tuple(args))
        meta_kwargs = map_tensors(meta_like, dict(kwargs))
    else:
        meta_args = as_meta(tuple(args))
        meta_kwargs = as_meta(dict(kwargs))
    # (apart: inside a rehearsed forward, FLOPs not that forward's; the build lock: no build
    # changes the model meanwhile, and its first calls wait; inference_mode(False): a
    # rehearsal inside the mode builds as outside it)
    with apart(), paused(), BUILD_LOCK, torch.inference_mode(False):
        modules = first_paths(model)
        snapshot = Snapshot(model, reach=True)
        try:
            assert snapshot.reach is not None
            tensors = snapshot.reach.tensors
            return _rehearse(
                modules, tensors, meta_args, meta_kwargs, training, count_flops, learned
            )
        finally:
            snapshot.restore()


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """lazynn's own work inside the forward a rehearsal runs (a ``lazynn.summary`` or
    ``build`` of a submodule, whose rehearsals count their own FLOPs): what the running
    rehearsal's counter counts meanwhile is not the forward's, and is taken off its count.
    Nested, it is taken off once."""
    outer = context().rehearsal
    if outer is None or outer.counted is None or outer.aside:
        yield
        return
    outer.aside, start = True, outer.counted()
    try:
        yield
    finally:
        outer.apart += outer.counted() - start
        outer.aside = False


def _rehearse(
    modules: dict[str, nn.Module],
    tensors: list[torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    training: bool | None,
    count_flops: bool,
    learned: dict[nn.Module, dict[str, Any]] | None,
) -> Rehearsal:
    """The run of :func:`rehearse`, on the model's ``modules`` (by first path), which the
    caller puts back after it; ``tensors``: the real tensors they reach."""
    here = context()
    outer = here.rehearsal  # (a rehearsal whose forward runs this one: its stand-ins)
    if outer is not None and outer.stand_ins is not None:
        seen = outer.stand_ins
        seen.add(tensors)
    else:
        seen = StandIns(tensors)
    run = _Run(modules, count_flops, seen)
    # The model's figures as they are (a forward that replaces a buffer does not change
    # them); those of its lazy layers' tensors, once the run has built them
    figures = {p: _tensor_infos(m) for p, m in modules.items()}
    waiting = placeholders_on_meta(modules)
    for module in modules.values():
        if training is not None:
            module.training = training
    run.hook(modules.values())
    here.rehearsal = run.rehearsing
    drawn, others = RandomState(), OtherRandom()
    device = MetaDevice(fast=True, counter=run.counter, stand_ins=seen)
    seed = torch.initial_seed()
    try:
        # (the meta device: what the forward creates without a device is meta, and draws
        # nothing; lazynn's own work on a layer steps out of it: lifecycle.own_work)
        with torch.no_grad(), device, own_modes(device):
            output = run(modules[""], args, kwargs)
    finally:
        here.rehearsal = outer
        if outer is not None:  # inside another rehearsal's forward: its notes are that one's
            outer.notes.update(run.rehearsing.notes)
        if learned is not None:
            for module in modules.values():
                sizes = run.rehearsing.sizes.get(id(module))
                if sizes is not None and module is not run.failed:  # (not the layer that
                    learned[module] = dict(sizes)  # failed: its input)
        if device.drew or torch.initial_seed() != seed:  # (it drew, or it reseeded)
            drawn.restore()
        others.restore()  # (Python's random, numpy's: LayerDrop's draws, if it moved them)
        for handle in run.handles:
            handle.remove()
    for path, held in waiting.items():
        figures[path] = _tensor_infos(modules[path], held)
    return Rehearsal(
        calls=run.calls,
        types={p: type(m).__name__ for p, m in modules.items()},
        tensors=figures,
        sizes=run.sizes,
        inputs=run.inputs,
        unreached=[p for p in modules if p in run.lazy and p not in run.calls],
        output=output,
        notes=run.notes(),
    )


def first_paths(model: nn.Module) -> dict[str, nn.Module]:
    """Each module of ``model`` by its first path (a module under two names: its first, as
    the summary's rows), in one walk."""
    seen: set[int] = set()
    found: dict[str, nn.Module] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        if id(module) not in seen:
            seen.add(id(module))
            found[path] = module
    return found


def warn_notes(notes: Iterable[str]) -> None:
    """Warn each of a rehearsal's notes (``Rehearsal.notes``) as an AmbiguousInputWarning at
    the user's line: the model was built as torch reads its inputs; they say how else they
    may have been meant. Called once the build has succeeded (either form of ``build``)."""
    for note in notes:
        warnings.warn(AmbiguousInputWarning(note), stacklevel=user_stacklevel())


def _tensor_infos(module: nn.Module, held: dict[str, int] | None = None) -> list[TensorInfo]:
    """The own tensors of ``module`` (placeholders left out), each with the ``id()`` of the
    tensor that was in its slot before the run (``held``), or its own: ties counted once."""
    infos = []
    for _, name, tensor in own_slots(module):
        if is_placeholder(tensor):  # a lazy layer the forward never called
            continue
        infos.append(
            TensorInfo(
                name=name,
                shape=tuple(tensor.shape),
                dtype=tensor.dtype,
                is_parameter=name in module._parameters,
                requires_grad=bool(tensor.requires_grad),
                persistent=name not in module._non_persistent_buffers_set,
                ident=held.get(name, id(tensor)) if held is not None else id(tensor),
            )
        )
    return infos
