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
import threading
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from .._errors import (
    AmbiguousInputWarning,
)
from .._module.callers import user_stacklevel
from .._module.lifecycle import own_modes
from .._module.placeholder import is_lazy
from .._module.snapshot import OtherRandom, RandomState, Snapshot
from .._module.state import BUILD_LOCK, context
from .._module.tensors import (
    is_placeholder,
    map_tensors,
    meta_like,
    own_slots,
)
from .batch import TRIES, batch_name, check_batch_free, keras_batch, substituted
from .collector import paused
from .learnt import Rehearsal, TensorInfo
from .meta_device import MetaDevice
from .run import Run
from .spec import as_meta
from .stand_ins import StandIns, placeholders_on_meta

__all__ = ["apart", "first_paths", "rehearse", "warn_notes"]


def rehearse(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    literal: bool = False,
    training: bool | None = None,
    count_flops: bool = False,
    learnt: dict[nn.Module, dict[str, Any]] | None = None,
) -> Rehearsal:
    """Run ``model`` itself on meta versions of the examples; return what was learnt.

    The run changes nothing that stays: the model, the state its modules reach and every
    random generator are put back after it (see the module doc), success or failure. A
    failure raises :class:`~lazynn.InferenceError` naming the innermost module running when
    it happened, its type and the input shapes it received. ``literal``: the examples are a
    real call's arguments (only tensors become meta). ``training`` runs every module in that
    mode (None: as each is). ``count_flops`` counts each call's FLOPs with
    ``torch.utils.flop_counter.FlopCounterMode``. ``learnt`` takes the sizes each lazy layer
    read before the run ended, even when it failed. A batch the examples leave free (a name
    as a Spec's first dimension, Keras's ``(None, 16)``) is run at ``TRIES[0]`` and
    ``TRIES[1]`` (``batch.py``): the first run is returned, and a model whose tensors' sizes
    differ between the two is refused.
    """
    if literal:  # a real call's arguments: only tensors become meta (a tuple stays a tuple)
        meta_args = map_tensors(meta_like, tuple(args))
        meta_kwargs = map_tensors(meta_like, dict(kwargs))
    else:
        args = tuple(keras_batch(a) for a in args)  # (each example: the tuple is no shape)
        kwargs = keras_batch(dict(kwargs))
        batch = batch_name(args, kwargs, "lazynn.build")
        if batch is not None:  # (run at two sizes: sizes that follow it are refused)
            runs = [
                rehearse(
                    model,
                    substituted(args, n),
                    substituted(kwargs, n),
                    training=training,
                    count_flops=count_flops,
                    learnt=learnt if n == TRIES[0] else None,
                )
                for n in TRIES[:2]
            ]
            check_batch_free(runs[0], runs[1], batch)
            return runs[0]
        # (each example by itself: the examples' tuple is not a shape, 16 is not (16,))
        meta_args = tuple(as_meta(a) for a in args)
        meta_kwargs = as_meta(dict(kwargs))
    # (apart: inside a rehearsed forward, FLOPs not that forward's)
    # (the build lock, where the model has lazy modules: the run builds them on meta, and
    # no build nor first call of them may change the model meanwhile; else the model's own,
    # so that two rehearsals of it do not run at once; inference_mode(False): a rehearsal
    # inside the mode builds as outside it)
    lock = BUILD_LOCK if is_lazy(model) else _lock_of(model)
    with apart(), paused(), lock, torch.inference_mode(False):
        modules = first_paths(model)
        snapshot = Snapshot(model, reach=True)
        try:
            assert snapshot.reach is not None
            tensors = snapshot.reach.tensors
            return _rehearse(
                modules,
                tensors,
                meta_args,
                meta_kwargs,
                training=training,
                count_flops=count_flops,
                learnt=learnt,
            )
        finally:
            snapshot.restore()


#: a lock for each model a rehearsal runs that has nothing lazy (its rehearsals, one at once)
_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def _lock_of(model: nn.Module) -> threading.RLock:
    with _LOCKS_LOCK:
        found = _LOCKS.get(model)
        if found is None:
            found = _LOCKS[model] = threading.RLock()
        return found


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
    *,
    training: bool | None,
    count_flops: bool,
    learnt: dict[nn.Module, dict[str, Any]] | None,
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
    run = Run(modules, count_flops, seen)
    with placeholders_on_meta(modules, seen) as held:
        # The model's figures as they are (a forward that replaces a buffer does not change
        # them); those of its lazy layers' tensors, once the run has built them
        figures = {p: _tensor_infos(m) for p, m in modules.items() if p not in held}
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
            run.end()
            if outer is not None:  # inside another rehearsal's forward: its notes are its
                outer.notes.update(run.rehearsing.notes)
            if learnt is not None:
                for module in modules.values():
                    sizes = run.rehearsing.sizes.get(id(module))
                    if sizes is not None and module is not run.failed:  # (not the layer
                        learnt[module] = dict(sizes)  # that failed: its input)
            if device.drew or torch.initial_seed() != seed:  # (it drew, or it reseeded)
                drawn.restore()
            others.restore()  # (Python's random, numpy's: LayerDrop's, if it moved them)
        for path, ids in held.items():
            figures[path] = _tensor_infos(modules[path], ids)
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
