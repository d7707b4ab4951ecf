"""The factory form's first run: ``Net()`` on meta, every lazy layer laid out with stand-in
sizes (its probes), so the model's own ``__init__`` runs, drawing and allocating nothing.

A rehearsal of that run on the examples teaches each lazy layer its sizes. Code that reads a
lazy layer's size in ``__init__`` (``nn.Linear(self.fc1.in_features, 8)``) reads the stand-in
in a first run, so the run is made again with the sizes learnt so far standing in
(:func:`drafted`) when its rehearsal failed after some layer had learnt its sizes;
``lazynn.build`` then checks its real run against the draft (``factory.py``).

>>> import torch, lazynn
>>> from torch import nn
>>> from lazynn._rehearsal.rehearse import rehearse
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc1 = lazynn.LazyLinear(4)
...         self.fc2 = nn.Linear(self.fc1.in_features, 8)  # a size the input decides
...     def forward(self, x):
...         return self.fc1(x).sum() + self.fc2(x)
>>> def attempt(model, learnt):
...     return rehearse(model, (torch.randn(2, 5),), {}, learnt=learnt)
>>> found = drafted(Net, "example", attempt)
>>> found.model.fc2.weight.shape, found.sizes
(torch.Size([8, 5]), {0: {'in_features': 5}})
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.nn.utils import parametrize

from .._errors import (
    Fix,
    InferenceError,
    LazynnError,
    UnbuiltError,
    first_line,
    message,
    with_note,
)
from .._layer.base import LazyLayer
from .._module.kept import PROBE
from .._module.lifecycle import finish, is_lazy_module, own_modes
from .._module.snapshot import OtherRandom
from .._module.state import Constructing, Drafting, Entry, context, find_state
from .._module.tensors import is_placeholder, own_slots
from .._program.record import Recorder
from .._rehearsal.meta_device import MetaDevice
from .transformed import NeedsTensors, laid_read, needing, refuse_unread, transformed_layers

__all__ = [
    "MAX_DRAFTS",
    "Drafted",
    "Layout",
    "difference",
    "draft",
    "drafted",
    "generators_of",
    "layout",
    "made",
    "running",
]

#: the eager modules of a factory's run: (path, class, ((tensor name, shape), ...))
Layout = tuple[tuple[str, type, tuple[tuple[str, tuple[int, ...]], ...]], ...]
T = TypeVar("T")
#: torch's words when a transformation (weight_norm) is given an unbuilt weight
_UNINITIALIZED = "can't have uninitialized parameters"
#: how many runs of a factory may each learn more sizes before it is given up
MAX_DRAFTS = 8


def made(result: object, where: str) -> nn.Module:
    """What a factory's call returned, which must be a model."""
    if not isinstance(result, nn.Module):
        raise LazynnError(
            message(
                where,
                "a factory that returns an nn.Module when called with no arguments",
                f"a call that returned {type(result).__name__}",
                "pass the model class (lazynn.build(Net, example)), functools.partial(Net, "
                "config), or a lambda that returns the model",
            )
        )
    return result


@contextlib.contextmanager
def running(program: Drafting | Constructing) -> Iterator[None]:
    """The lazy layers constructed in this block follow ``program`` (this thread only)."""
    here = context()
    outer, here.program = here.program, program
    try:
        yield
    finally:
        here.program = outer


@contextlib.contextmanager
def _watching_ties(drafting: Drafting) -> Iterator[None]:
    """Note each placeholder of this draft assigned over an eager tensor (``wte.weight =
    lm_head.weight``): the shape it replaced is the shape it will have. torch's public
    registration hooks (global while they are registered: other threads' calls pass through)."""
    owner = threading.get_ident()

    def noted(module: nn.Module, name: str, tensor: Any) -> None:
        if threading.get_ident() != owner or not is_placeholder(tensor):
            return
        old = module._parameters.get(name, module._buffers.get(name))
        if isinstance(old, torch.Tensor) and not is_placeholder(old):
            drafting.ties[id(tensor)] = (tensor, old.shape)

    handles = [
        torch_module.register_module_parameter_registration_hook(noted),
        torch_module.register_module_buffer_registration_hook(noted),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def draft(
    factory: Callable[[], Any],
    where: str = "lazynn.build(factory)",
    known: dict[int, dict[str, Any]] | None = None,
    eager: tuple[set[int], set[tuple[str, int]]] | None = None,
) -> tuple[nn.Module, Drafting]:
    """The factory's first run, on meta (see the module doc): the model, every lazy layer
    unbuilt (those whose sizes ``known`` gives, by number, laid out with them), and what the
    run recorded. Moves no generator. ``where`` names the caller in errors.

    A step of ``__init__`` that needs a lazy layer's tensors (``weight_norm``, a
    parametrization: eager code applies it to a built layer) makes the run again, that layer
    laid out as its eager class, with every lazy layer the same line constructs (``eager``:
    numbers and lines, :attr:`Drafting.eager`, :attr:`Drafting.eager_sites`)."""
    numbers, sites = (set(eager[0]), set(eager[1])) if eager is not None else (set(), set())
    while True:
        drafting = Drafting(
            known=dict(known or {}), where=where, eager=set(numbers), eager_sites=set(sites)
        )
        try:
            return _draft(factory, drafting)
        except NeedsTensors as needed:
            numbers.update(needed.indices)
            sites.update(drafting.sites[i] for i in needed.indices if i in drafting.sites)


def _draft(factory: Callable[[], Any], drafting: Drafting) -> tuple[nn.Module, Drafting]:
    """One run of :func:`draft`, or :class:`NeedsTensors`."""
    where = drafting.where
    others = OtherRandom()
    try:
        # (recorded: a value the code reads is computed for real, no generator moves)
        # (the meta device and the recorder: lazynn's, which a layer's layout steps out of)
        device, recorder = MetaDevice(), Recorder(generators=generators_of(factory))
        with (
            running(drafting),
            _watching_ties(drafting),
            device,
            recorder,
            own_modes(device, recorder.function_mode),
        ):
            model = made(factory(), where)
    except Exception as error:
        # A step that needs a lazy layer's tensors (torch's weight_norm refuses a
        # placeholder; an orthogonal parametrization computes on its values): the run again,
        # that layer laid out as its eager class. Not lazynn's own refusals (a step on a
        # stand-in that needs the sizes the input decides stays refused, naming it).
        index = None if isinstance(error, LazynnError) else needing(error, drafting)
        if index is not None:
            raise NeedsTensors({index}) from error
        if not isinstance(error, ValueError) or _UNINITIALIZED not in str(error):
            raise
        index = needing(error, drafting, laid=True)
        named = drafting.entries[index].cls.__name__ if index is not None else "a lazy layer"
        raise UnbuiltError(
            message(
                where,
                "a construction whose steps on a lazy layer wait for its sizes",
                f"a step that needs the values of {named}'s unbuilt weight (torch's "
                "nn.utils.weight_norm, say), which the factory's first run cannot give: the "
                "layer is not one it can lay out as its eager class before its first call (a "
                "rank-agnostic layer, whose class its input chooses, or one made outside the "
                "factory)",
                "apply it at the build, where the eager code applies it: "
                "lazynn.on_build(layer, torch.nn.utils.weight_norm) (in both forms; in the "
                "factory form it runs at once, the layer being built)",
                detail=first_line(error),
                key=Fix.ON_BUILD,
            )
        ) from error
    finally:
        others.restore()  # (numpy's or Python's draws of the code: the real run makes them)
    parametrized = transformed_layers(model, drafting)
    if parametrized:
        raise NeedsTensors(parametrized)
    paths = {id(m): p for p, m in model.named_modules()}
    for index, (layer, sizes) in drafting.built.items():
        entry = drafting.entries[index]
        if entry.sizes is None and not is_lazy_module(layer):  # (built by __init__ itself)
            drafting.entries[index] = Entry(
                entry.cls, entry.kwargs, sizes, paths.get(id(layer), "")
            )
    for module in model.modules():
        for _, _, tensor in own_slots(module):
            tensor.__dict__.pop(PROBE, None)
    for tensor, _ in drafting.ties.values():
        tensor.__dict__.pop(PROBE, None)
    return model, drafting


def generators_of(factory: Callable[[], Any]) -> list[torch.Generator]:
    """The generators a factory was given (``functools.partial(Net, generator=g)``, a lambda's
    closure or the globals it names, default arguments): its code may set one before it
    draws from it, which a recording of its run then puts back."""
    found: dict[int, torch.Generator] = {}
    pending: list[Any] = [factory]
    seen: set[int] = set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Generator):
            found[id(value)] = value
        elif isinstance(value, functools.partial):
            pending.extend((value.func, *value.args, *value.keywords.values()))
        elif isinstance(value, types.FunctionType):
            for cell in value.__closure__ or ():
                with contextlib.suppress(ValueError):  # (an empty cell)
                    pending.append(cell.cell_contents)
            pending.extend(value.__defaults__ or ())
            pending.extend((value.__kwdefaults__ or {}).values())
            named = value.__code__.co_names
            pending.extend(v for n, v in value.__globals__.items() if n in named)
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return list(found.values())


def _prebuild_ties(model: nn.Module, drafting: Drafting) -> None:
    """Build on meta, before the rehearsal, each lazy layer whose placeholder was tied into an
    eager module (that module may run first); the sizes come from the shape it replaced, and
    its entry takes them."""
    if not drafting.ties:
        return
    for path, layer in model.named_modules():
        state = find_state(layer)
        if not isinstance(layer, LazyLayer) or state is None:
            continue
        found = {
            slot: drafting.ties[id(p)][1]
            for slot, p in state.placeholders.items()
            if id(p) in drafting.ties
        }
        if found:
            where = f"{type(layer).__name__} at '{path}'" if path else type(layer).__name__
            solved = layer._lazynn_solve_sizes(found, where, "")
            layer._lazynn_build(solved)
            finish(layer)
            known = drafting.entries[state.index]
            drafting.entries[state.index] = Entry(known.cls, known.kwargs, solved, path)


def layout(model: nn.Module) -> Layout:
    """The eager modules of a factory's run by path (not what lazy layers hold): class, and
    own tensors' names and shapes (a placeholder tied into one is left out)."""
    found = []
    skip: list[str] = []
    for path, module in model.named_modules():
        if any(path == s or path.startswith(s + ".") for s in skip):
            continue
        if is_lazy_module(module):
            skip.append(path)
            continue
        shapes = tuple(
            (name, tuple(t.shape)) for _, name, t in own_slots(module) if not is_placeholder(t)
        )
        found.append((path, _kind(module), shapes))
    return tuple(found)


def _kind(module: nn.Module) -> type:
    """A module's class, as its construction chose it: a parametrized module's class is made
    anew by each ``register_parametrization`` (``ParametrizedLinear``), its base is the one."""
    kind = type(module)
    if parametrize.is_parametrized(module) and kind.__bases__:
        base = kind.__bases__[0]
        if kind.__name__ == f"Parametrized{base.__name__}":
            return base
    return kind


def difference(other: Layout, first: Layout) -> tuple[str, str, str] | None:
    """Where a run's eager modules (``other``) are not those of ``first``: the path, what
    ``first`` made there, what ``other`` made; or None."""
    made_there = {path: (kind, dict(shapes)) for path, kind, shapes in other}
    for path, kind, shapes in first:
        if path not in made_there:
            return path, f"{kind.__name__} {dict(shapes)}", "nothing"
        their_kind, theirs = made_there[path]
        wanted = dict(shapes)
        if their_kind is not kind or any(theirs.get(n) != s for n, s in wanted.items()):
            return path, f"{kind.__name__} {wanted}", f"{their_kind.__name__} {theirs}"
    return None


@dataclass
class Drafted(Generic[T]):
    """A first run whose rehearsal went through (:func:`drafted`)."""

    #: what the rehearsal returned
    result: T
    model: nn.Module
    drafting: Drafting
    #: layer number -> the sizes the rehearsal learnt
    sizes: dict[int, dict[str, Any]]

    @property
    def settled(self) -> bool:
        """Whether every layer was laid out with the sizes it learnt (the run is the one the
        sizes make: nothing read a stand-in)."""
        return all(self.drafting.known.get(i) == s for i, s in self.sizes.items())


def drafted(
    factory: Callable[[], Any],
    where: str,
    attempt: Callable[[nn.Module, dict[nn.Module, dict[str, Any]]], T],
    known: dict[int, dict[str, Any]] | None = None,
) -> Drafted[T]:
    """``attempt(model, learnt)`` (a rehearsal, which puts the sizes each lazy layer read
    into ``learnt``) on the factory's first run (laid out with ``known``), ties prebuilt. A
    rehearsal that fails after a layer learnt its sizes is made again on a run with those
    sizes, until one goes through or learns nothing new (its error is the first run's)."""
    known = dict(known or {})
    first: Exception | None = None
    eager: tuple[set[int], set[tuple[str, int]]] = (set(), set())
    for _ in range(MAX_DRAFTS):
        model, drafting = draft(factory, where, known, eager)
        eager = drafting.eager, drafting.eager_sites
        _prebuild_ties(model, drafting)
        learnt: dict[nn.Module, dict[str, Any]] = {}
        try:
            result = attempt(model, learnt)
        except InferenceError as error:
            if first is None:
                note = _stand_in_note(error, model, learnt)
                first = error if note is None else with_note(error, note)
            read = {**_numbered(learnt), **laid_read(drafting, learnt)}
            new = {i: s for i, s in read.items() if known.get(i) != s}
            if not new:
                if first is error:
                    raise
                raise first from error.__cause__  # (the first run's: the retries learnt nothing)
            known.update(new)
            continue
        read = laid_read(drafting, learnt)
        new = {i: s for i, s in read.items() if known.get(i) != s}
        if new:  # (laid out eager with stand-ins: the next run with the sizes they read)
            known.update(new)
            continue
        refuse_unread(model, drafting, read)
        return Drafted(result, model, drafting, {**_numbered(learnt), **read})
    assert first is not None
    raise first


def _numbered(learnt: dict[nn.Module, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The sizes learnt, by the number of the layer the run constructed."""
    return {
        state.index: dict(sizes)
        for layer, sizes in learnt.items()
        if (state := find_state(layer)) is not None and state.index >= 0
    }


def _stand_in_note(
    error: InferenceError, model: nn.Module, learnt: dict[nn.Module, dict[str, Any]]
) -> str | None:
    """Why an eager module of a factory's first run may have failed: a dimension equal to the
    stand-in size of a lazy layer the forward had not called yet (``nn.Linear(
    self.fc1.in_features, 8)`` read it in ``__init__``, before any size was known); or None."""
    found = re.search(r" at '([^']+)'", error.parts.where if error.parts else "")
    modules = dict(model.named_modules())
    failed = modules.get(found.group(1)) if found else None
    if found is None or failed is None or is_lazy_module(failed):
        return None
    dims = {d for _, _, t in own_slots(failed) if not is_placeholder(t) for d in t.shape}
    suspects = []
    for path, layer in modules.items():
        state = find_state(layer)
        if not isinstance(layer, LazyLayer) or state is None or state.index < 0:
            continue
        if layer in learnt:
            continue
        stand_ins = {
            name: spec.probe_value(state.kwargs) for name, spec in layer._lazynn_specs().items()
        }
        if any(v in dims for v in stand_ins.values() if isinstance(v, int)):
            named = ", ".join(f"{n}={v}" for n, v in stand_ins.items())
            suspects.append(f"'{path}' ({named})")
    if not suspects:
        return None
    return (
        f"'{found.group(1)}' has a dimension equal to a stand-in size of "
        + ", ".join(suspects)
        + ", which the forward had not called yet: code in __init__ that sizes a layer from "
        "a lazy layer's size (nn.Linear(self.fc1.in_features, 8)) reads the stand-in until "
        "the forward has called that lazy layer; call it before the layers sized from it, or "
        "write the size"
    )
