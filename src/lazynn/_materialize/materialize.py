"""materialize(): a model built on meta, allocated once, with an eager model's numbers.

The model is walked in construction order (registration order) into a list of explicit steps
(:func:`plan_steps`), decided before anything changes, then each step runs:

* :class:`Construct`: a lazy layer ``build`` built on meta is constructed as its eager class
  constructs, on the target, and adopts those tensors (exact whatever the constructor does,
  ``nn.Transformer``'s deep copies included);
* :class:`CopyValues`: a copy of such a layer (``nn.TransformerEncoder`` deep-copies its layer)
  gets the values of the layer it copies, as eager copies do;
* :class:`Allocate`: a module's own meta tensors get real, uninitialized memory (tied weights
  stay tied);
* :class:`Initialize`: its initializer runs (``reset_parameters()``; ``nn.MultiheadAttention``
  and ``nn.Transformer``'s private ``_reset_parameters()``, after their submodules, as their
  constructors do), on FSDP2 shards as if unsharded (``_sharded``); a tensor tied to an earlier
  module keeps that module's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from .._build.progress import Progress
from .._build.queue import Entry as QueueEntry
from .._build.queue import due, run_ready
from .._build.writes import Writes
from .._errors import LazynnError, message
from .._layer.construct import new
from .._module.deferred import Init
from .._module.deferred import run as run_inits
from .._module.lifecycle import is_lazy_module
from .._module.snapshot import atomic
from .._module.state import BUILD_LOCK, FACTORY_BUILT, META_BUILT, CopyFrom, Rebuild, quiet
from .._module.tensors import copy_values, own_slots, own_tensors
from .adopt import adopt
from .sharded import ShardedInit, init_mode, sharded_failure

__all__ = ["Allocate", "Construct", "CopyValues", "Initialize", "materialize", "plan_steps"]

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class Construct:
    """Construct ``module`` (a subtree all on meta) as its eager class and adopt its tensors."""

    path: str
    module: nn.Module
    recipe: Rebuild


@dataclass(frozen=True)
class CopyValues:
    """Allocate ``module`` (a subtree) and give it the values of ``source``, which it copies."""

    path: str
    module: nn.Module
    source: nn.Module


@dataclass(frozen=True)
class Allocate:
    """Give ``module``'s own meta tensors real memory."""

    path: str
    module: nn.Module


@dataclass(frozen=True)
class Initialize:
    """Run ``module``'s initializer."""

    path: str
    module: nn.Module
    init: Callable[[], Any]


Step = Construct | CopyValues | Allocate | Initialize


def _meta_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    return (t for t in own_tensors(module) if t.is_meta)


def _meta_numel(modules: Iterator[nn.Module]) -> int:
    return sum(t.numel() for m in modules for t in _meta_tensors(m))


def _initializer(module: nn.Module) -> tuple[Callable[[], Any], bool] | None:
    """(the function that initializes ``module``'s own tensors, whether it runs after its
    submodules are initialized), or None."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        return reset, False
    private = getattr(module, "_reset_parameters", None)
    if callable(private) and type(module).__module__.startswith("torch.nn"):
        # nn.MultiheadAttention and nn.Transformer initialize in a private _reset_parameters
        # that their constructors call after constructing their submodules (it sets
        # out_proj.bias; Transformer's redraws every matrix below it). Private torch API:
        # tests/building/test_build.py materializes both and compares with eager construction.
        return private, True
    return None


def _layout(module: nn.Module) -> list[tuple[str, str, tuple[int, ...], torch.dtype]]:
    return [
        (path, name, tuple(t.shape), t.dtype)
        for path, m in module.named_modules()
        for _, name, t in own_slots(m)
    ]


class _Walk:
    """The walk of :func:`plan_steps` (one concern a method)."""

    def __init__(self, model: nn.Module) -> None:
        self.steps: list[Step] = []
        #: modules with meta tensors and no initializer
        self.blind: list[str] = []
        self.seen: set[int] = set()
        self.owners: dict[int, int] = {}
        for m in model.modules():
            for t in own_tensors(m):
                self.owners[id(t)] = self.owners.get(id(t), 0) + 1

    def whole(self, module: nn.Module, sharded: bool = False) -> bool:
        """Whether every tensor of the subtree is on meta, owned once (no tie out of it), and
        (unless ``sharded``) not a DTensor."""
        return all(
            t.is_meta and self.owners[id(t)] == 1 and (sharded or type(t).__name__ != "DTensor")
            for m in module.modules()
            for t in own_tensors(m)
        )

    def as_built(self, path: str, module: nn.Module) -> Step | None:
        """The step of a layer ``build`` built on meta, when its subtree can take it whole."""
        record = META_BUILT.get(module)
        if isinstance(record, CopyFrom):
            source = record.source
            # a copy takes values already there, or given earlier in this call (sharded
            # alike: copies are sharded alike, so the copy is local)
            ready = not _has_meta(source) or id(source) in self.seen
            if self.whole(module, sharded=True) and ready:
                return CopyValues(path, module, source)
        if isinstance(record, Rebuild) and self.whole(module):
            with quiet():
                shadow = new(record.cls, record.kwargs, "meta", record.dtype)
            if _layout(shadow) == _layout(module):
                return Construct(path, module, record)
        return None

    def walk(self, path: str, module: nn.Module) -> None:
        self.seen.add(id(module))
        whole = self.as_built(path, module)
        if whole is not None:
            self.seen.update(id(m) for m in module.modules())
            self.steps.append(whole)
            return
        found = _initializer(module)
        if any(True for _ in _meta_tensors(module)):
            self.steps.append(Allocate(path, module))
            if found is None:
                self.blind.append(path)
            elif not found[1]:
                self.steps.append(Initialize(path, module, found[0]))
        for name, child in module._modules.items():
            if child is not None and id(child) not in self.seen:
                self.walk(f"{path}.{name}" if path else name, child)
        if found is not None and found[1] and _has_meta(module):
            self.steps.append(Initialize(path, module, found[0]))


def _has_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def plan_steps(model: nn.Module) -> tuple[list[Step], list[str]]:
    """The steps that allocate and initialize ``model`` in the order an eager construction
    initializes, and the paths of modules with meta tensors but no initializer."""
    walk = _Walk(model)
    walk.walk("", model)
    return walk.steps, walk.blind


def _allocate_own(
    module: nn.Module, device: torch.device, allocated: dict[int, torch.Tensor]
) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """Give the module's own meta tensors real memory on ``device``, one per meta tensor (so
    tied weights stay tied); returns the tensors another module owns first, to keep, and the
    (name, tensor) of each one allocated just now."""
    keep, made = [], []
    for store, name, tensor in own_slots(module):
        if not tensor.is_meta:
            keep.append(tensor)
            continue
        if id(tensor) in allocated:
            keep.append(allocated[id(tensor)])
        else:
            real = torch.empty_like(tensor, device=device)
            allocated[id(tensor)] = (
                nn.Parameter(real, tensor.requires_grad)
                if isinstance(tensor, nn.Parameter)
                else real
            )
            made.append((name, allocated[id(tensor)]))
        store[name] = allocated[id(tensor)]
    return keep, made


def _adopt(module: nn.Module, eager: nn.Module, allocated: dict[int, torch.Tensor]) -> None:
    """Put ``eager``'s tensors in place of ``module``'s meta ones (same layout)."""
    theirs = dict(eager.named_modules())
    for path, m in module.named_modules():
        for store, name, tensor in own_slots(m):
            other = theirs[path]
            fresh = (other._parameters if store is m._parameters else other._buffers)[name]
            assert fresh is not None
            if isinstance(fresh, nn.Parameter):
                fresh.requires_grad_(tensor.requires_grad)
            allocated[id(tensor)] = fresh
            store[name] = fresh


class _Run:
    """Runs the steps on ``target``; ``kept``: values of tied tensors to put back after the
    module's initializer."""

    def __init__(self, target: torch.device, bar: Progress) -> None:
        self.target, self.bar = target, bar
        self.allocated: dict[int, torch.Tensor] = {}
        self.kept: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: initializations written on the placeholders of layers built on meta, with their
        #: tensors, run after every step in the order they were written
        self.inits: list[tuple[Init, torch.Tensor]] = []
        #: (module path, name, tensor) of each tensor an Allocate step gave new memory: its
        #: initializer must write it (``_writes``)
        self.fresh: list[tuple[str, str, torch.Tensor]] = []

    def unwritten(self, writes: Writes) -> list[str]:
        """The tensors given memory that nothing wrote: they would hold garbage."""
        return [
            f"{p}.{n}" if p else n
            for p, n, t in self.fresh
            if getattr(t, "_local_tensor", t).numel() and not writes.wrote(t)  # (an empty shard
        ]  # holds nothing)

    def note_inits(self, module: nn.Module, record: Rebuild | CopyFrom) -> None:
        for init, path, name in record.inits:
            self.inits.append((init, getattr(module.get_submodule(path), name)))

    def run(self, step: Step) -> None:
        if isinstance(step, Construct):
            count = _meta_numel(step.module.modules())
            with quiet():  # it warned at its construction
                recipe = step.recipe
                eager = new(recipe.cls, recipe.kwargs, self.target, recipe.dtype)
            _adopt(step.module, eager, self.allocated)
            self.note_inits(step.module, recipe)
            self.bar.advance(count)
        elif isinstance(step, CopyValues):
            count = _meta_numel(step.module.modules())
            for m in step.module.modules():
                _allocate_own(m, self.target, self.allocated)
            copy_values(step.source, step.module)
            record = META_BUILT.get(step.module)
            if record is not None:
                self.note_inits(step.module, record)
            self.bar.advance(count)
        elif isinstance(step, Allocate):
            count = _meta_numel(iter([step.module]))
            keep, made = _allocate_own(step.module, self.target, self.allocated)
            self.fresh += [(step.path, name, t) for name, t in made]
            self.kept[id(step.module)] = [(t, t.detach().clone()) for t in keep]
            self.bar.advance(count)
        else:
            mode = init_mode(step.module, step.path)  # sharded: as if unsharded
            try:
                with mode:
                    step.init()
            except LazynnError:
                raise
            except Exception as error:
                if isinstance(mode, ShardedInit):
                    raise sharded_failure(step.path, error) from error
                raise
            for tensor, value in self.kept.pop(id(step.module), []):
                tensor.copy_(value)  # a tied tensor keeps its first owner's values


def _unwritten_error(left: list[str]) -> LazynnError:
    return LazynnError(
        message(
            "lazynn.materialize",
            "initializers (reset_parameters()) that write every meta tensor they are given",
            "tensors no initializer writes: "
            + ", ".join(f"'{t}'" for t in left[:8])
            + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            + " (made in __init__: a mask or rotary buffer, a gain), which would hold "
            "uninitialized memory",
            "construct the model with lazynn.build(Net, example, device='meta') (the factory "
            "form: materialize then runs your __init__ itself), or set these tensors in the "
            "module's reset_parameters()",
            outcome="the model is unchanged, on meta",
        )
    )


def _last_steps(model: nn.Module, steps: list[Step]) -> dict[int, list[QueueEntry]]:
    """The functions queued in ``model`` (``on_build``), by the index of the last step that
    allocates a tensor of their module (after it, the module is ready)."""
    found: dict[int, list[QueueEntry]] = {}
    for module, entry in due(model):
        inside = {id(m) for m in module.modules()}
        last = max((i for i, s in enumerate(steps) if id(s.module) in inside), default=None)
        if last is not None:
            found.setdefault(last, []).append(entry)
    return found


def materialize(
    model: M, device: torch.device | str | None = None, progress: bool | None = None
) -> M:
    """Allocate a model built on meta (``build(..., device="meta")``) on ``device``.

    Each module with meta tensors gets real, uninitialized memory for its own tensors
    (``to_empty``) and is initialized by its ``reset_parameters()``, in construction order, so
    the values equal an eager model's under the same seed. (``nn.MultiheadAttention`` and
    ``nn.Transformer`` initialize as their constructors do: after their submodules.) Works on
    a model sharded by FSDP2 after the meta build: each rank allocates its own shards.

    Args:
        model: built on meta (or partly on meta).
        device: where to allocate. Default: the current default device.
        progress: as in :func:`build`.

    Raises:
        LazynnError: a lazy layer is still unbuilt, or a module with meta tensors has no
            ``reset_parameters()`` to initialize them (nothing is changed).

    >>> import torch, lazynn
    >>> net = lazynn.build(lazynn.LazyLinear(4), (2, 3), device="meta")
    >>> net.weight.device
    device(type='meta')
    >>> lazynn.materialize(net, "cpu").weight.device
    device(type='cpu')
    """
    target = torch.device(device) if device is not None else torch.get_default_device()
    recipe = FACTORY_BUILT.get(model)
    if recipe is not None:  # made by lazynn.build(factory, ..., device="meta")
        with BUILD_LOCK, atomic(model):
            with torch.inference_mode(False):
                adopt(model, recipe, target)
            run_ready(model)  # work queued with lazynn.on_build
        return model
    unbuilt = [p for p, m in model.named_modules() if is_lazy_module(m)]
    if unbuilt:
        raise LazynnError(
            message(
                "materialize",
                "a built model",
                "unbuilt lazy layers " + ", ".join(f"'{p}'" for p in unbuilt),
                "build it first: lazynn.build(model, example, device='meta')",
            )
        )
    steps, blind = plan_steps(model)
    if blind:
        raise LazynnError(
            message(
                "materialize",
                "modules with a reset_parameters() to initialize their meta tensors",
                ", ".join(f"'{p}'" for p in blind) + " without one",
                "give these modules a reset_parameters() that initializes their own "
                "parameters and buffers (as torch.nn layers have)",
            )
        )
    total = sum(
        _meta_numel(s.module.modules())
        if isinstance(s, (Construct, CopyValues))
        else _meta_numel(iter([s.module]))
        for s in steps
        if not isinstance(s, Initialize)
    )
    with BUILD_LOCK:
        bar = Progress(total, "lazynn.materialize", enabled=progress)
        try:
            # (initializers that drew before a failure: their draws undone too)
            with atomic(model):
                _run_steps(model, steps, _Run(target, bar))
                run_ready(model)  # work queued with lazynn.on_build, still waiting
        finally:
            bar.close()
    return model


def _run_steps(model: nn.Module, steps: list[Step], run: _Run) -> None:
    """Run the steps in order; a module with queued work runs it once it is allocated, as its
    eager construction would at the end of its ``__init__``. Refuses tensors given memory that
    no initializer wrote."""
    queued = _last_steps(model, steps)
    # (inference_mode(False): parameters as a construction outside the mode makes them)
    with torch.inference_mode(False), torch.no_grad(), Writes() as writes:
        for index, step in enumerate(steps):
            run.run(step)
            if index in queued:
                with torch.enable_grad():
                    run_ready(model, only=queued[index])
        run_inits(run.inits)
    left = run.unwritten(writes)
    if left:
        raise _unwritten_error(left)
