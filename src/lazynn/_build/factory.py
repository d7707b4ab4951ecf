"""The factory form: ``lazynn.build(Net, example)`` constructs the model itself, twice.

The model's own construction is its init program: init loops in ``__init__``, tensors a parent
creates around its layers, buffers computed from sizes, ties. To give exactly what the eager
program gives, lazynn runs that program, with every size known:

1. **draft** (:func:`draft`): ``Net()`` on meta, under :class:`~lazynn._module.state.Drafting`. Each
   lazy layer lays out placeholders that stand for meta tensors of its probe sizes, so the
   model's own code runs on them, drawing nothing and allocating nothing; lazy layers are
   numbered in construction order. A lazy layer's weight tied into an eager module
   (``wte.weight = lm_head.weight``) takes the shape of the tensor it replaced.
2. **rehearse**: the draft runs on meta examples (``_rehearse``), and each lazy layer learns
   its sizes; the draft is then dropped.
3. **construct** (:func:`construct`): ``Net()`` again, for real, under
   :class:`~lazynn._module.state.Constructing`: the k-th lazy layer constructed becomes its eager
   class with the k-th sizes, so ``Net.__init__`` runs exactly as the eager program does
   (``nn.Linear(in_features, 10)`` where the code says ``LazyLinear(10)``). A second run that
   constructs other layers is refused, naming the layer.

Under one seed the result equals the eager model bit for bit, and the random generator ends
where eager construction leaves it. ``device="meta"`` runs step 3 on meta and records the
factory; ``lazynn.materialize`` then runs it once more on the target (``_materialize``).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from .._module.deferred import PROBE
from .._errors import InferenceError, LazynnError, message
from .._layer.base import LazyLayer
from .._module.lifecycle import build_lazy_module, finish, is_lazy_module
from .queue import run_ready
from .._rehearsal.rehearse import rehearse, warn_notes
from .._module.snapshot import OtherRandom, atomic
from .._program.program import attach
from .._program.record import Recorder
from .._module.state import (
    BUILD_LOCK,
    Constructing,
    Drafting,
    Entry,
    context,
    find_state,
)
from .._module.tensors import is_placeholder, own_slots

__all__ = ["build_factory", "construct", "draft", "is_factory", "learn", "realize"]


@dataclass(frozen=True)
class FactoryRecipe:
    """What the factory's first run and the rehearsal learnt: how the second run constructs
    the model (:func:`realize`)."""

    factory: Any
    entries: tuple[Entry, ...]
    #: the other lazy modules (torch's, custom mixins) by path -> the meta inputs of their
    #: first call in the rehearsal (they build themselves from them)
    others: dict[str, tuple[tuple[Any, ...], dict[str, Any]]]
    #: the dtype the model is converted to after its construction, or None
    dtype: torch.dtype | None = None
    #: why a lazy layer's reading of its input may not be the one meant (``Rehearsal.notes``)
    notes: tuple[str, ...] = ()


def is_factory(obj: object) -> bool:
    """Whether ``obj`` is a model's factory (a class, ``functools.partial``, a lambda), not a
    model: callable, and not an ``nn.Module`` instance."""
    return callable(obj) and not isinstance(obj, nn.Module)


def _made(factory: Callable[[], Any], result: object, where: str) -> nn.Module:
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
def _program(program: Drafting | Constructing) -> Iterator[None]:
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
    factory: Callable[[], Any], where: str = "lazynn.build(factory)"
) -> tuple[nn.Module, Drafting]:
    """The factory's first run, on meta (see the module doc): the model, every lazy layer
    unbuilt, and what the run recorded. Draws no random number (any generator is put back).
    ``where`` names the caller in errors."""
    drafting = Drafting()
    others = OtherRandom()
    try:
        # (recorded: a value the code reads is computed for real, no generator moves)
        with _program(drafting), _watching_ties(drafting), torch.device("meta"), Recorder():
            model = _made(factory, factory(), where)
    finally:
        others.restore()  # (numpy's or Python's draws of the code: the real run makes them)
    for module in model.modules():
        for _, _, tensor in own_slots(module):
            tensor.__dict__.pop(PROBE, None)
    for tensor, _ in drafting.ties.values():
        tensor.__dict__.pop(PROBE, None)
    return model, drafting


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


def learn(
    factory: Callable[[], Any],
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    dtype: torch.dtype | None = None,
) -> FactoryRecipe:
    """Steps 1 and 2: each lazy layer's entry (class, arguments, sizes), and the meta inputs
    of the other lazy modules (torch's, custom mixins), by path."""
    with BUILD_LOCK:
        model, drafting = draft(factory)
        _prebuild_ties(model, drafting)
        rehearsal = rehearse(model, examples, kw_examples)
    if rehearsal.unreached:
        raise InferenceError(
            message(
                "build",
                "example inputs whose forward calls every lazy layer",
                "a forward that never called " + ", ".join(f"'{p}'" for p in rehearsal.unreached),
                "pass inputs (or a training/eval mode) that reach these layers",
                outcome="nothing was built",
            )
        )
    entries = list(drafting.entries)
    for path, module in model.named_modules():
        state = find_state(module)
        if state is None or state.index < 0 or module not in rehearsal.sizes:
            continue
        sizes = rehearsal.sizes[module]
        known = entries[state.index]
        if known.sizes is not None and known.sizes != sizes:
            raise InferenceError(
                message(
                    f"{type(module).__name__} at '{path}'",
                    f"the sizes of the copies of one lazy layer to agree ({known.sizes} at "
                    f"'{known.path}')",
                    f"{sizes}",
                    "construct a lazy layer for each place that takes inputs of other sizes",
                )
            )
        entries[state.index] = Entry(known.cls, known.kwargs, dict(sizes), path)
    others = {
        path: rehearsal.inputs[m]
        for path, m in model.named_modules()
        if m in rehearsal.inputs and is_lazy_module(m)
    }
    return FactoryRecipe(factory, tuple(entries), others, dtype, tuple(rehearsal.notes.values()))


def construct(factory: Callable[[], Any], entries: list[Entry]) -> nn.Module:
    """Step 3: the factory run for real, each lazy layer its eager class with its sizes."""
    constructing = Constructing(entries)
    with _program(constructing):
        model = _made(factory, factory(), "lazynn.build(factory)")
    built = sum(1 for e in entries[: constructing.position] if e.sizes is not None)
    expected = sum(1 for e in entries if e.sizes is not None)
    if built != expected:
        raise LazynnError(
            message(
                "lazynn.build(factory)",
                f"the {expected} lazy layers of the factory's first run",
                f"{built} the second time",
                "make the factory construct the same model each time it is called (it runs "
                "twice: once on meta to learn the sizes, once for real)",
                outcome="nothing was built",
            )
        )
    return model


def realize(recipe: FactoryRecipe) -> nn.Module:
    """The model of ``recipe`` (step 3), on the current default device: constructed, its
    other lazy modules built, converted to the recipe's dtype. On meta, the construction is
    recorded, and each tensor keeps its init program (``lazynn.materialize`` runs them)."""
    on_meta = torch.get_default_device().type == "meta"
    with Recorder() if on_meta else contextlib.nullcontext() as recorder:
        model = construct(recipe.factory, list(recipe.entries))
        with torch.inference_mode(False):
            for path, (args, kwargs) in recipe.others.items():
                module = model.get_submodule(path)
                if is_lazy_module(module):  # torch's lazy layers, custom mixins: their own
                    build_lazy_module(module, args, kwargs)
        if recipe.dtype is not None:
            model.to(recipe.dtype)
    if recorder is not None:
        attach(model, recorder)
    return model


def build_factory(
    factory: Callable[[], Any],
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    device: torch.device | None,
    dtype: torch.dtype | None,
) -> nn.Module:
    """``lazynn.build(factory, *examples, device=, dtype=)`` (see the module doc)."""
    recipe = learn(factory, examples, kw_examples, dtype)
    if recipe.others:
        warnings.warn(
            "lazynn.build(factory): "
            + ", ".join(f"'{p}'" for p in recipe.others)
            + " is torch's own lazy layer (or a LazyModuleMixin of your own): it builds after "
            "the model's construction, so its numbers, and those drawn after it, are not the "
            "eager model's; use lazynn's layers (lazynn.LazyLinear..., lazynn.lazy(cls)) for "
            "an exact eager twin",
            stacklevel=3,
        )
    with atomic():  # (the model is new: a failure drops it; the generators go back)
        with torch.device(device) if device is not None else contextlib.nullcontext():
            model = realize(recipe)
        run_ready(model)  # work queued with lazynn.on_build for the layers built just now
    warn_notes(recipe.notes)
    return model
