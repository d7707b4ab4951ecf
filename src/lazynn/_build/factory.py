"""The factory form: ``lazynn.build(Net, example)`` constructs the model itself.

The model's own construction is its init program: init loops in ``__init__``, tensors a parent
creates around its layers, buffers computed from sizes, ties. To give exactly what the eager
program gives, lazynn runs that program, with every size known:

1. **draft** (``draft.py``): ``Net()`` on meta, each lazy layer laid out with stand-in sizes,
   drawing and allocating nothing; lazy layers are numbered in construction order.
2. **learn** (:func:`learn`): the draft runs on meta examples, and each lazy layer learns its
   sizes: its :class:`~lazynn._module.state.Entry` (class, arguments, sizes).
3. **construct** (:func:`construct`): ``Net()`` again, for real, under
   :class:`~lazynn._module.state.Constructing`: the k-th lazy layer constructed becomes its eager
   class with the k-th sizes, so ``Net.__init__`` runs exactly as the eager program does
   (``nn.Linear(in_features, 10)`` where the code says ``LazyLinear(10)``).

Where the real run's eager modules are not the draft's, the draft read a stand-in size
(``nn.Linear(self.fc1.in_features, 8)``, then fed into a later lazy layer): the sizes are
learnt again on a draft laid out with them, and the model constructed again if they changed
(:func:`build_factory`); a factory that makes other modules on each call is refused, naming
the module, as is one that constructs other lazy layers.

Under one seed the result equals the eager model bit for bit, and every generator ends where
eager construction leaves it. ``device="meta"`` runs step 3 on meta, recording each tensor's
init program; ``lazynn.materialize`` runs them on the target.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._errors import InferenceError, LazynnError, message, with_note
from .._layer.base import LazyLayer
from .._layer.layout import laid_out_eager
from .._module.callers import user_stacklevel
from .._module.kept import run as run_inits
from .._module.lifecycle import build_lazy_module, finish, is_lazy_module
from .._module.snapshot import EveryRandom, OtherRandom, atomic
from .._module.state import BUILD_LOCK, Constructing, Entry, find_state
from .._program.program import attach
from .._program.record import Recorder
from .._rehearsal.learnt import Rehearsal
from .._rehearsal.rehearse import rehearse, warn_notes
from .draft import MAX_DRAFTS, Layout, difference, drafted, generators_of, layout, made, running
from .progress import Progress
from .queue import run_ready

__all__ = [
    "FactoryRecipe",
    "build_factory",
    "construct",
    "is_factory",
    "learn",
    "on_meta",
    "realize",
]


@dataclass(frozen=True)
class FactoryRecipe:
    """What the factory's first run and the rehearsal learnt: how the second run constructs
    the model (:func:`realize`)."""

    factory: Any
    entries: tuple[Entry, ...]
    #: the other lazy modules (torch's, custom mixins) by path -> the meta inputs of their
    #: first call in the rehearsal (they build themselves from them)
    others: dict[str, tuple[tuple[Any, ...], dict[str, Any]]]
    #: lazynn's lazy layers made outside the factory (passed in to it) by path -> their sizes
    outside: dict[str, dict[str, Any]]
    #: the dtype the model is converted to after its construction, or None
    dtype: torch.dtype | None = None
    #: path -> why a lazy layer's reading of its input may not be the one meant
    #: (``Rehearsal.notes``)
    notes: dict[str, str] = field(default_factory=dict)
    #: the draft's eager modules by path: their class and own tensors' shapes (the real run
    #: must construct the same)
    layout: Layout = ()
    #: whether the draft was laid out with the sizes it learnt (no stand-in was read)
    settled: bool = False
    #: the class name of each lazy module of the draft, by path
    lazy_types: dict[str, str] = field(default_factory=dict)
    #: how many elements the model's parameters and buffers hold, each tensor once (a
    #: progress bar's total)
    numel: int = 0

    def sizes(self) -> dict[int, dict[str, Any]]:
        """The sizes learnt, by layer number."""
        return {i: dict(e.sizes) for i, e in enumerate(self.entries) if e.sizes is not None}


def is_factory(obj: object) -> bool:
    """Whether ``obj`` is a model's factory (a class, ``functools.partial``, a lambda), not a
    model: callable, and not an ``nn.Module`` instance."""
    return callable(obj) and not isinstance(obj, nn.Module)


def learn(
    factory: Callable[[], Any],
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    dtype: torch.dtype | None = None,
    known: dict[int, dict[str, Any]] | None = None,
    where: str = "lazynn.build(factory)",
    reach: bool = True,
) -> FactoryRecipe:
    """Steps 1 and 2 (the draft laid out with the sizes ``known`` by layer number): each lazy
    layer's entry (class, arguments, sizes), and the meta inputs of the other lazy modules
    (torch's, custom mixins), by path. ``reach``: refuse examples that leave a lazy layer
    uncalled (a summary shows it unreached instead). ``where`` names the caller in errors."""

    def attempt(model: nn.Module, learnt: dict[nn.Module, dict[str, Any]]) -> Rehearsal:
        if not examples and not kw_examples:
            lazy = [p for p, m in model.named_modules() if is_lazy_module(m)]
            if not lazy:
                # (nothing to infer, no example: no forward, which may not run on meta at
                # all: a FlexAttention model's, say)
                return Rehearsal({}, {}, {}, {}, {}, [], None)
            raise InferenceError(
                message(
                    where,
                    "example inputs for a model with lazy layers (its forward, run on meta, "
                    "gives them their sizes)",
                    "none, for lazy layers "
                    + ", ".join(f"'{p}'" for p in lazy[:4])
                    + (" ..." if len(lazy) > 4 else ""),
                    "give one example per argument of the model's forward, a tensor or a "
                    "shape: lazynn.build(Net, (4, 16))",
                    outcome="nothing was built",
                )
            )
        if any(is_lazy_module(m) or laid_out_eager(m) for m in model.modules()):
            return rehearse(model, examples, kw_examples, learnt=learnt)
        try:
            return rehearse(model, examples, kw_examples, learnt=learnt)
        except InferenceError as error:  # (a forward nothing needed: say so)
            note = (
                "nothing in this model is lazy, so no forward is needed: "
                f"{where.removesuffix('(factory)')}(factory) without an example builds it "
                "without running the forward on meta"
            )
            raise with_note(error, note) from error

    with BUILD_LOCK:
        found = drafted(factory, where, attempt, known)
    rehearsal, model = found.result, found.model
    modules = dict(model.named_modules())
    # (a copy of a lazy layer the forward called, deepcopy in __init__: an EMA's, has its sizes)
    sized = {s.index for m in rehearsal.sizes if (s := find_state(m)) is not None}
    unreached = [
        path
        for path in rehearsal.unreached
        if (state := find_state(modules[path])) is None or state.index not in sized
    ]
    if reach and unreached:
        raise InferenceError(
            message(
                "build",
                "example inputs whose forward calls every lazy layer",
                "a forward that never called " + ", ".join(f"'{p}'" for p in unreached),
                "pass inputs (or a training/eval mode) that reach these layers",
                outcome="nothing was built",
            )
        )
    entries = list(found.drafting.entries)
    if reach:
        _refuse_dropped(model, entries)
    for path, module in model.named_modules():
        state = find_state(module)
        if state is None or state.index < 0 or module not in rehearsal.sizes:
            continue
        sizes = rehearsal.sizes[module]
        entry = entries[state.index]
        if entry.sizes is not None and entry.sizes != sizes:
            raise InferenceError(
                message(
                    f"{type(module).__name__} at '{path}'",
                    f"the sizes of the copies of one lazy layer to agree ({entry.sizes} at "
                    f"'{entry.path}')",
                    f"{sizes}",
                    "construct a lazy layer for each place that takes inputs of other sizes",
                )
            )
        entries[state.index] = Entry(entry.cls, entry.kwargs, dict(sizes), path)
    others = {
        path: rehearsal.inputs[m]
        for path, m in model.named_modules()
        if m in rehearsal.inputs and is_lazy_module(m) and not isinstance(m, LazyLayer)
    }
    outside = {
        path: dict(rehearsal.sizes[m])
        for path, m in model.named_modules()
        if isinstance(m, LazyLayer) and m in rehearsal.sizes and not _constructed(m)
    }
    notes = dict(rehearsal.notes)
    lazy_types = {p: type(m).__name__ for p, m in model.named_modules() if is_lazy_module(m)}
    drafted_layout = layout(model)
    in_model = {i.ident: i.numel for infos in rehearsal.tensors.values() for i in infos}
    numel = sum(in_model.values()) or sum(  # (no forward ran: nothing lazy, all laid out)
        math.prod(shape) for _, _, tensors in drafted_layout for _, shape in tensors
    )
    return FactoryRecipe(
        factory,
        tuple(entries),
        others,
        outside,
        dtype,
        notes,
        drafted_layout,
        found.settled,
        lazy_types,
        numel,
    )


def _refuse_dropped(model: nn.Module, entries: list[Entry]) -> None:
    """Refuse a lazy layer the factory constructs and leaves out of the model (a backbone's
    classifier that a feature extractor drops): eager code draws its numbers when it
    constructs it, and nothing can size it here, so every number after it would differ."""
    present = {s.index for m in model.modules() if (s := find_state(m)) is not None}
    # (a layer built before the rehearsal, from the shape of a tie, has its sizes)
    dropped = [i for i, e in enumerate(entries) if i not in present and e.sizes is None]
    if not dropped:
        return
    first = entries[dropped[0]]
    arguments = ", ".join(
        f"{k}={v!r}"
        for k, v in first.kwargs.items()
        if not (k in ("device", "dtype") and v is None)
    )
    eager = getattr(first.cls, "cls_to_become", first.cls)
    raise LazynnError(
        message(
            "lazynn.build(factory)",
            "every lazy layer the factory constructs in the model it returns (eager code "
            "draws the numbers of each layer it constructs, even one it then drops)",
            f"{first.cls.__name__}({arguments}), lazy layer number {dropped[0] + 1} of its "
            f"construction, left out of the model"
            + (f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else ""),
            f"construct it with its sizes written ({eager.__name__}(...): the eager class), "
            "or do not construct it",
            outcome="nothing was built",
        )
    )


def _constructed(module: nn.Module) -> bool:
    """Whether ``module`` is a lazy layer the factory's run constructed (numbered), not one
    made outside it (passed in: ``partial(Classifier, backbone=lazy_backbone)``)."""
    state = find_state(module)
    return isinstance(module, LazyLayer) and state is not None and state.index >= 0


def construct(factory: Callable[[], Any], entries: list[Entry]) -> nn.Module:
    """Step 3: the factory run for real, each lazy layer its eager class with its sizes."""
    constructing = Constructing(entries)
    with running(constructing):
        model = made(factory(), "lazynn.build(factory)")
    built = sum(1 for e in entries[: constructing.position] if e.sizes is not None)
    expected = sum(1 for e in entries if e.sizes is not None)
    if built != expected:
        raise LazynnError(
            message(
                "lazynn.build(factory)",
                f"the {expected} lazy layers of the factory's run on meta",
                f"{built} in its real run",
                "make the factory construct the same model each time it is called (it runs "
                "more than once: on meta to learn the sizes, then for real)",
                outcome="nothing was built",
            )
        )
    return model


def realize(recipe: FactoryRecipe) -> tuple[nn.Module, Layout]:
    """The model of ``recipe`` (step 3), on the current default device: constructed, its
    other lazy modules built, converted to the recipe's dtype; and the eager modules its
    construction made. On meta, the construction is recorded, and each tensor keeps its init
    program (``lazynn.materialize`` runs them)."""
    on_meta = torch.get_default_device().type == "meta"
    given = generators_of(recipe.factory)
    with Recorder(generators=given) if on_meta else contextlib.nullcontext() as recorder:
        model = construct(recipe.factory, list(recipe.entries))
        made = layout(model)
        with torch.inference_mode(False):
            for path, (args, kwargs) in recipe.others.items():
                module = model.get_submodule(path)
                if is_lazy_module(module):  # torch's lazy layers, custom mixins: their own
                    build_lazy_module(module, args, kwargs)
            for path, sizes in recipe.outside.items():
                layer = model.get_submodule(path)
                if isinstance(layer, LazyLayer) and is_lazy_module(layer):
                    run_inits(layer._lazynn_build(sizes, device=torch.get_default_device()))
                    finish(layer)
        if recipe.dtype is not None:
            model.to(recipe.dtype)
    if recorder is not None:
        attach(model, recorder)
    return model, made


class _Relearnt(Exception):
    """The real run made other eager modules than the draft, and a draft laid out with the
    learnt sizes learnt others: the construction is dropped and made again with them."""

    def __init__(self, recipe: FactoryRecipe) -> None:
        super().__init__("the factory's sizes were learnt again")
        self.recipe = recipe


def _checked(
    made: Layout,
    recipe: FactoryRecipe,
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    start: EveryRandom,
) -> None:
    """Refuse, or learn again (:class:`_Relearnt`), a real run that made other eager modules
    than the draft (see the module doc). The draft laid out with the sizes learnt starts
    where the real run started (``start``: the generators then), so that what its code draws
    (a number of blocks) is what the real run drew."""
    if recipe.settled or difference(made, recipe.layout) is None:
        return
    now = EveryRandom()
    start.restore()
    try:
        again = learn(
            recipe.factory, examples, kw_examples, recipe.dtype, recipe.sizes(), reach=False
        )
    finally:
        now.restore()
    found = difference(made, again.layout)
    if found is None:
        if again.sizes() != recipe.sizes():
            raise _Relearnt(again)
        return
    path, first, second = found
    raise LazynnError(
        message(
            f"lazynn.build(factory) at '{path}'" if path else "lazynn.build(factory)",
            f"the same model from every call of the factory (one call made {first})",
            f"{second} from another",
            "make the factory construct the same model each time it is called (it runs "
            "more than once: on meta to learn the sizes, then for real)",
            outcome="nothing was built",
        )
    )


def _realized(
    factory: Callable[[], Any],
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    device: torch.device | None,
    dtype: torch.dtype | None,
    where: str = "lazynn.build(factory)",
    reach: bool = True,
    progress: bool | None = None,
) -> tuple[nn.Module, FactoryRecipe]:
    """Steps 1 to 3 (see the module doc): the model on ``device``, and its recipe; a
    progress bar of step 3's allocations (none on meta, which allocates nothing)."""
    recipe = learn(factory, examples, kw_examples, dtype, where=where, reach=reach)
    on_meta = (device or torch.get_default_device()).type == "meta"
    bar = Progress(recipe.numel, "lazynn.build", False if on_meta else progress)
    try:
        for _ in range(MAX_DRAFTS):
            start = EveryRandom()
            try:
                with atomic():  # (the model is new: a failure drops it; the generators go back)
                    placed = (
                        torch.device(device) if device is not None else contextlib.nullcontext()
                    )
                    with placed, bar.registrations():
                        model, made = realize(recipe)
                    _checked(made, recipe, examples, kw_examples, start)
                    run_ready(model)  # work queued with lazynn.on_build for the layers built now
            except _Relearnt as relearnt:
                recipe = relearnt.recipe
                bar = Progress(recipe.numel, "lazynn.build", bar.enabled)
                continue
            break
    finally:
        bar.close()
    return model, recipe


def build_factory(
    factory: Callable[[], Any],
    examples: tuple[Any, ...],
    kw_examples: dict[str, Any],
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: bool | None = None,
) -> nn.Module:
    """``lazynn.build(factory, *examples, device=, dtype=, progress=)`` (see the module
    doc)."""
    model, recipe = _realized(factory, examples, kw_examples, device, dtype, progress=progress)
    if recipe.others or recipe.outside:
        warnings.warn(
            "lazynn.build(factory): "
            + ", ".join(f"'{p}'" for p in (*recipe.others, *recipe.outside))
            + " is torch's own lazy layer, a LazyModuleMixin of your own, or a lazy layer "
            "made outside the factory (passed in to it): it builds after the model's "
            "construction, so its numbers, and those drawn after it, are not the eager "
            "model's; for an exact eager twin use lazynn's layers (lazynn.LazyLinear..., "
            "lazynn.lazy(cls)), constructed inside the factory",
            stacklevel=user_stacklevel(),
        )
    warn_notes(recipe.notes.values())
    return model


def on_meta(
    factory: Callable[[], Any], examples: tuple[Any, ...], kw_examples: dict[str, Any], where: str
) -> tuple[nn.Module, dict[str, str], dict[str, str]]:
    """The model ``lazynn.build(factory, *examples, device="meta")`` makes (a lazy layer the
    examples do not reach left unbuilt), the class name of each lazy module it had, and why a
    lazy layer's reading of its input may not be the one meant, by path: what a summary
    describes (the build's own warnings are ``lazynn.build``'s). Moves no generator."""
    others = OtherRandom()  # (torch's generators: on meta, the construction is recorded)
    try:
        model, recipe = _realized(
            factory, examples, kw_examples, torch.device("meta"), None, where, reach=False
        )
    finally:
        others.restore()  # (numpy's or Python's draws of the code, if it made any)
    return model, recipe.lazy_types, recipe.notes
