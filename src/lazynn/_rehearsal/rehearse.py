"""The meta rehearsal: run a model's forward on meta tensors and record what happens.

The model is only read: its twin (``_twin``: the same classes and code, every tensor a meta
tensor, every placeholder a meta placeholder) runs on meta example inputs. Lazy layers build
themselves on meta (their own code, so the sizes are exactly what a real first call would
infer), and hooks record each module's input and output shapes. No memory is allocated for
parameters or activations, no arithmetic runs, and the twin is dropped after: the model is
as it was, whatever happened, and other threads may use it meanwhile. What the forward
draws on meta draws nothing; a draw on a real device (``torch.rand(n, device="cpu")``) moves
the generator, which the rehearsal then puts back (``_meta_device``), so the build's
allocation draws what eager construction draws.

Used by ``lazynn.build`` (sizes, then allocation) and ``lazynn.summary`` (the table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
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
from .._module.snapshot import OtherRandom, RandomState
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
from .hollow import Stale, is_hollow
from .learnt import Call, Rehearsal, TensorInfo
from .memo import Below, Memo, fingerprint, repeats, skipped
from .meta_device import MetaDevice
from .spec import as_meta
from .twin import Twin, meta_twin, rehearsal_only

__all__ = ["apart", "rehearse", "warn_notes"]


class _Record:
    """The calls of a rehearsal, as memoized blocks see them (``_memo.Recorder``): every call
    in order (``trace``), each module's first call and totals (``calls``), the FLOPs (the
    counter's, the skipped blocks', less those of lazynn's own work: :func:`apart`)."""

    def __init__(
        self, calls: dict[str, Call], counter: FlopCounterMode | None, rehearsing: Rehearsing
    ) -> None:
        self.calls, self.counter, self.rehearsing = calls, counter, rehearsing
        self.trace: list[Call] = []
        self.skipped_flops = 0
        if counter is not None:
            rehearsing.counted = lambda: int(counter.get_total_flops())

    def meter(self) -> int:
        if self.counter is None:
            return 0
        counted = int(self.counter.get_total_flops())
        return counted + self.skipped_flops - self.rehearsing.apart

    def mark(self) -> int:
        return len(self.trace)

    def below(self, block: str, since: int) -> Below:
        prefix = f"{block}." if block else ""
        out: Below = {}
        for event in self.trace[since:]:
            if event.path.startswith(prefix) and event.path != block:
                sub = event.path[len(prefix) :]
                count, flops, first_in, first_out = out.get(
                    sub, (0, 0, event.inputs, event.outputs)
                )
                out[sub] = (count + event.count, flops + event.flops, first_in, first_out)
        return out

    def skipped(self, block: str, flops: int, below: Below) -> None:
        self.skipped_flops += flops
        for sub, (count, sub_flops, first_in, first_out) in below.items():
            path = f"{block}.{sub}" if block else sub
            event = Call(path, first_in, first_out, count, sub_flops)
            self.trace.append(event)  # (an enclosing block's run counts it too)
            if path not in self.calls:
                self.calls[path] = Call(path, first_in, first_out, 0, 0)
            self.calls[path].count += count
            self.calls[path].flops += sub_flops


class _Run:
    """One run of a model (the twin) on meta inputs, hooks on every module recording what
    happens (see :func:`rehearse`): each module's calls, the first call's inputs of the lazy
    modules that are not lazynn's, the sizes lazynn's read, the failures by module."""

    def __init__(self, model: dict[str, nn.Module], twin: Twin | None, count_flops: bool) -> None:
        #: each module of the run (the twin's) by its first path, as the model's (``model``)
        self.modules: dict[str, nn.Module] = (
            model if twin is None else {p: twin.twin(m) for p, m in model.items()}
        )
        self.paths: dict[int, str] = {id(m): p for p, m in self.modules.items()}
        # (read on the model's modules: the twin's below a skipped block are left hollow)
        #: lazy modules by path, and their class before the run (they build as it runs)
        self.lazy = {p: type(m) for p, m in model.items() if is_lazy_module(m)}
        #: lazy layers by path, and what they knew before the run (their arguments)
        self.before = {p: s for p, m in model.items() if (s := find_state(m)) is not None}
        self.handles: list[RemovableHandle] = []
        self.calls: dict[str, Call] = {}
        self.sizes: dict[nn.Module, dict[str, Any]] = {}
        self.inputs: dict[nn.Module, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.failures: list[tuple[BaseException, tuple[str, nn.Module, Any, Any]]] = []
        #: the innermost module whose forward raised the run's error, if it raised
        self.failed: nn.Module | None = None
        self.counter = FlopCounter(display=False) if count_flops else None
        self.rehearsing = Rehearsing()  # what each lazy layer reads, recorded by the layer
        self.record = _Record(self.calls, self.counter, self.rehearsing)
        self._stack: list[tuple[str, nn.Module, Any, Any, BaseException | None, int, Call]] = []

    def hook(self, modules: Iterable[nn.Module]) -> None:
        """Attach the recording hooks to ``modules`` (handles: ``self.handles``)."""
        for module in modules:
            self.handles.append(
                module.register_forward_pre_hook(self.pre, prepend=True, with_kwargs=True)
            )
            self.handles.append(
                module.register_forward_hook(self.post, with_kwargs=True, always_call=True)
            )

    @rehearsal_only
    def pre(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        path = self.paths.get(id(module), "?")
        event = Call(path, shapes((a, k)))
        self.record.trace.append(event)
        self._stack.append((path, module, a, k, sys.exc_info()[1], self.record.meter(), event))
        if path not in self.calls:
            self.calls[path] = Call(path, event.inputs, count=0)
            if path in self.lazy:
                self.inputs[module] = (a, k)
        self.calls[path].count += 1

    @rehearsal_only
    def post(self, module: nn.Module, a: tuple[Any, ...], k: dict[str, Any], out: Any) -> None:
        if not self._stack or self._stack[-1][1] is not module:
            return  # (a pre-hook before this one raised: the call never started)
        path, _, entry_a, entry_k, before, start, event = self._stack.pop()
        raised = sys.exc_info()[1]
        if raised is not None and raised is not before:  # this module's forward raised
            self.failures.append((raised, (path, module, entry_a, entry_k)))
            return
        call = self.calls[path]
        event.flops, event.outputs = self.record.meter() - start, shapes(out)
        call.flops += event.flops
        if not call.outputs:
            call.outputs = event.outputs
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
    memoize: bool = True,
    literal: bool = False,
    training: bool | None = None,
    count_flops: bool = False,
    own: bool = False,
    learned: dict[nn.Module, dict[str, Any]] | None = None,
) -> Rehearsal:
    """Run ``model`` on meta versions of the examples; return what was learnt.

    The model is only read: a meta twin of it runs (``_twin``), and is thrown away after, so
    the model is as it was, success or failure, and other threads may use it meanwhile (a
    build, which changes it, waits for the build lock). ``own``: the model is the caller's to
    change (a factory's first run): it runs itself. A failure raises
    :class:`~lazynn.InferenceError` naming the innermost module running when it happened,
    its type and the input shapes it received. ``memoize`` lets identical repeated blocks
    reuse one block's result (see ``_memo``). ``training`` runs every module in that mode
    (None: as each is). ``count_flops`` counts each call's FLOPs with
    ``torch.utils.flop_counter.FlopCounterMode`` (a skipped block counts its twin's).
    ``learned`` takes the sizes each lazy layer read before the run ended, even when it
    failed (the model's layers as keys).
    """
    with apart(), paused():  # (apart: inside a rehearsed forward, FLOPs not that forward's)
        try:
            return _rehearse(
                model, args, kwargs, memoize, literal, training, count_flops, own, learned
            )
        except Stale:  # (another thread built some of the model while it ran: hollow.py)
            return _rehearse(
                model, args, kwargs, memoize, literal, training, count_flops, own, learned, False
            )


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
    model: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    memoize: bool = True,
    literal: bool = False,
    training: bool | None = None,
    count_flops: bool = False,
    own: bool = False,
    learned: dict[nn.Module, dict[str, Any]] | None = None,
    defer: bool = True,
) -> Rehearsal:
    if literal:  # a real call's arguments: only tensors become meta (a tuple stays a tuple)
        meta_args = map_tensors(meta_like, tuple(args))
        meta_kwargs = map_tensors(meta_like, dict(kwargs))
    else:
        meta_args = as_meta(tuple(args))
        meta_kwargs = as_meta(dict(kwargs))
    # (a block made later is checked unchanged, unless this thread holds the build lock all
    # along: a build's rehearsal, where no other thread can build the model. RLock._is_owned:
    # private to threading, the one way to ask; guarded by a test in tests/rehearsal/test_memo)
    owned = BUILD_LOCK._is_owned()  # type: ignore[attr-defined]
    # (read while no build changes it; its placeholders made as outside inference_mode)
    with BUILD_LOCK, torch.inference_mode(False):
        mine = _first_paths(model)
        ids = {id(m): p for p, m in mine.items()}
        blocks = repeats(mine.values(), ids) if memoize else []
        # the twins of blocks like an earlier one are made when touched: the memo skips them
        later = skipped(blocks) if defer else []
        listed = list(mine.values())  # (as model.modules(): each once, first found first)
        prints = dict(blocks)
        twin = (
            None
            if own
            else meta_twin(
                model, True, later, listed, owned, lambda b: fingerprint(b, ids) == prints[b]
            )
        )
    root = model if twin is None else twin.root
    run = _Run(mine, twin, count_flops)
    memo = Memo(run.record) if memoize else None
    waiting = {}  # (blocks below a hollow one: memoized once made)
    for block, print_ in blocks:
        runs = block if twin is None else twin.twin(block)
        if memo is not None and not is_hollow(runs):
            memo.install(runs, print_, ids[id(block)])
        else:
            waiting[id(runs)] = (print_, ids[id(block)])

    def prepare(modules: list[nn.Module]) -> None:
        """Ready the run's modules (later: those made on a touch): mode, memo, hooks."""
        for module in modules:
            if training is not None:
                module.training = training
            if memo is not None and id(module) in waiting:
                memo.install(module, *waiting.pop(id(module)))
        run.hook(modules)

    prepare([m for m in run.modules.values() if not is_hollow(m)])
    if twin is not None:
        twin.deferred.listeners.append(prepare)
    here = context()
    outer, here.rehearsal = here.rehearsal, run.rehearsing
    drawn, others = RandomState(), OtherRandom()
    device = MetaDevice(fast=True, counter=run.counter)  # (the module doc)
    seed = torch.initial_seed()
    try:
        # (inference_mode(False): a rehearsal inside the mode builds as outside it; the meta
        # device: what the forward creates without a device is meta, and draws nothing)
        # (lazynn's own work on a layer steps out of it: lifecycle.own_work)
        with torch.inference_mode(False), torch.no_grad(), device, own_modes(device):
            output = run(root, meta_args, meta_kwargs)
    finally:
        here.rehearsal = outer
        by_id = {id(m): m for m in run.modules.values()}
        if outer is not None:  # inside another rehearsal's forward: its notes are that one's
            for key, note in run.rehearsing.notes.items():
                if key in by_id:
                    outer.notes[id(_theirs(by_id[key], twin))] = note
        if learned is not None:
            for key, sizes in run.rehearsing.sizes.items():
                if key in by_id and by_id[key] is not run.failed:  # (not the layer that
                    learned[_theirs(by_id[key], twin)] = dict(sizes)  # failed: its input)
        if device.drew or torch.initial_seed() != seed:  # (it drew, or it reseeded)
            drawn.restore()
        others.restore()  # (Python's random, numpy's: LayerDrop's draws, if it moved them)
        # Nothing of the run stays on the modules: on the caller's model (built in place),
        # nor on the twin, whose modules the run's hooks and memoized forwards would hold in
        # reference cycles (Twin.release: freed as they are dropped)
        if twin is not None:
            twin.deferred.listeners.clear()
        for handle in run.handles:
            handle.remove()
        if memo is not None:
            memo.undo()
    stand_in = memo.propagate(mine, run.modules, run.sizes, run.inputs) if memo else {}
    ran = {p: run.modules[stand_in.get(p, p)] for p in run.modules}
    learnt = Rehearsal(
        calls=run.calls,
        types={p: (twin.kind(m) if twin else type(m)).__name__ for p, m in ran.items()},
        tensors={p: _tensor_infos(ran[p], mine[p], twin) for p in run.modules},
        sizes={_theirs(m, twin): v for m, v in run.sizes.items()},
        inputs={_theirs(m, twin): v for m, v in run.inputs.items()},
        unreached=[p for p in run.modules if p in run.lazy and p not in run.calls],
        output=output,
        notes=run.notes(),
    )
    if twin is not None:  # (freed as it is dropped, not by a cycle collection)
        twin.release()
    return learnt


def _first_paths(model: nn.Module) -> dict[str, nn.Module]:
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


def _theirs(module: nn.Module, twin: Twin | None) -> nn.Module:
    """The model's module that a module of the run stands for."""
    return module if twin is None else twin.original(module)


def _tensor_infos(ran: nn.Module, owner: nn.Module, twin: Twin | None) -> list[TensorInfo]:
    """The own tensors of the module that ran (in the twin, or in its place: memo) as the
    build will make them, named by ``owner``'s tensors (the model's: ties counted once)."""
    infos = []
    for _, name, tensor in own_slots(ran):
        if is_placeholder(tensor):  # a lazy layer the forward never called
            continue
        original = owner._parameters.get(name, owner._buffers.get(name))
        infos.append(
            TensorInfo(
                name=name,
                shape=tuple(tensor.shape),
                dtype=tensor.dtype,
                is_parameter=name in ran._parameters,
                requires_grad=bool(tensor.requires_grad),
                persistent=name not in ran._non_persistent_buffers_set,
                ident=id(original) if original is not None else id(tensor),
            )
        )
    return infos
