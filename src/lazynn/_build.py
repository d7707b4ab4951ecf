"""build() and materialize(): whole-model shape inference on meta, then one allocation.

``build(model, *examples)`` runs the model once on meta tensors (``_rehearse``) to learn every
lazy layer's sizes, then allocates each layer once, in *construction order* (the order of
``model.modules()``), so that initialization draws the random numbers an eager model's
construction draws: under one seed, ``build(LazyNet(), x)`` equals ``EagerNet()`` bit for bit.

For a model that mixes eager and lazy layers, the eager layers constructed after the first
lazy one drew their numbers at construction from the wrong place in the stream; ``build``
replays the stream from the first lazy layer's construction (its recorded generator state),
re-initializing those eager layers with ``reset_parameters()``, unless their values were
changed since construction (then they are kept, with a warning).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from ._declare import CLASS_KEY, LazyLayer, _new
from ._errors import InferenceError, LazynnError, message
from ._mixin import _BUILD_LOCK, _finish, is_unbuilt
from ._on_build import run_ready
from ._placeholder import is_placeholder, relocate
from ._progress import Progress
from ._rehearse import Rehearsal, _is_lazy_module, rehearse
from ._sharded import init_mode
from ._snapshot import Snapshot

__all__ = ["build", "materialize"]

M = TypeVar("M", bound=nn.Module)


def build(
    model: M,
    *example_inputs: Any,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    progress: bool | None = None,
    **example_kwargs: Any,
) -> M:
    """Build every lazy layer of ``model`` from example inputs, without running it for real.

    Args:
        model: any ``nn.Module`` holding lazynn layers, torch's ``nn.Lazy*`` layers, or both,
            mixed with eager layers. Built in place and returned.
        *example_inputs: the forward's positional inputs: tensors (only their shape and dtype
            are used), ``torch.Size`` / tuples of ints (default dtype), :class:`lazynn.Spec`
            (shape and dtype), or structures of these.
        device: where to allocate the parameters. Default: where each layer was declared or
            moved to. ``"meta"`` infers shapes and allocates nothing (see :func:`materialize`).
        dtype: the floating-point dtype of the new parameters. Default: as declared or moved.
        progress: show a progress bar on stderr. Default: for large models (over 50M new
            parameters) when stderr is a terminal.
        **example_kwargs: the forward's keyword inputs, as above.

    Returns:
        ``model``, every layer plain torch.nn.

    Raises:
        InferenceError: the forward failed on the examples (the message names the module's
            path, type and the input shapes it received), or a lazy layer was never called.
            The model is then exactly as it was.

    >>> import torch, lazynn
    >>> from torch import nn
    >>> net = nn.Sequential(lazynn.LazyConv2d(8, 3), nn.Flatten(), lazynn.LazyLinear(10))
    >>> lazynn.build(net, (1, 3, 32, 32))[2]
    Linear(in_features=7200, out_features=10, bias=True)
    """
    return _build(model, example_inputs, example_kwargs, device, dtype, progress)


def _build(
    model: M,
    example_inputs: tuple[Any, ...],
    example_kwargs: dict[str, Any],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    progress: bool | None = None,
    partial: bool = False,
) -> M:
    """:func:`build`; ``partial``: from a real call's arguments (only tensors are examples),
    and lazy layers they do not reach stay unbuilt."""
    rehearsal = rehearse(model, example_inputs, example_kwargs, literal=partial)
    if rehearsal.unreached and not partial:
        raise InferenceError(
            message(
                "build",
                "example inputs whose forward calls every lazy layer",
                "a forward that never called " + ", ".join(f"'{p}'" for p in rehearsal.unreached),
                "pass inputs (or a training/eval mode) that reach these layers; the model is "
                "unchanged",
            )
        )
    _allocate(
        model,
        rehearsal,
        torch.device(device) if device is not None else None,
        dtype,
        progress,
        quiet=partial,
    )
    return model


def _own_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [t for t in (*module._parameters.values(), *module._buffers.values()) if t is not None]


def _retarget(module: nn.Module, device: torch.device | None, dtype: torch.dtype | None) -> None:
    """Move a lazy module's placeholders (any kind) to ``device`` / ``dtype`` before its build."""
    if device is None and dtype is None:
        return
    stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
    for store in stores:
        for name, tensor in store.items():
            if tensor is None or not is_placeholder(tensor):
                continue
            floating = tensor.is_floating_point()
            target = device if device is not None else tensor.device
            store[name] = relocate(tensor, target, dtype if floating else None)


def _reset(module: nn.Module) -> Any:
    """The module's ``reset_parameters``, or None."""
    reset = getattr(module, "reset_parameters", None)
    return reset if callable(reset) else None


def _scratch_init(module: nn.Module) -> nn.Module:
    """A copy of ``module`` re-initialized by its ``reset_parameters()`` (draws its numbers)."""
    twin: Any = copy.deepcopy(module)
    twin.reset_parameters()
    return twin  # type: ignore[no-any-return]


class _Plan:
    """How each eager layer after the first lazy one is treated, decided before any change.

    An eager model draws every layer's numbers at construction, in construction order. A mixed
    model's eager layers drew theirs while the lazy ones drew nothing, so from the first lazy
    layer on they hold numbers from the wrong place in the stream. If nothing drew random
    numbers between the model's construction and this build (the generator is exactly where
    replaying the mixed construction from the first lazy layer's recorded state ends), the
    build replays: generator set back to that state, every layer initialized in construction
    order. An eager layer is re-initialized only if it still holds its constructed values and
    has a ``reset_parameters()``; from the first one that cannot be replayed on, later eager
    layers keep their values (with a warning).
    """

    def __init__(
        self,
        order: list[tuple[str, nn.Module]],
        lazy: set[nn.Module],
        device: torch.device | None,
        now: torch.Tensor,
    ) -> None:
        self.start: torch.Tensor | None = None
        self.replay: set[nn.Module] = set()
        #: kept as they are, but their construction's draws are replayed (on a scratch copy)
        #: to keep the stream aligned: tied weights, and layers the user changed
        self.tied: set[nn.Module] = set()
        self.notes: list[str] = []
        first = next((i for i, (_, m) in enumerate(order) if m in lazy), None)
        if first is None:
            return
        eager_after = [
            (p, m)
            for p, m in order[first + 1 :]
            if m not in lazy
            and _own_tensors(m)
            and not any(is_placeholder(t) for t in _own_tensors(m))  # inside a lazy layer
        ]
        state = order[first][1].__dict__.get("_lazynn_rng")
        declared = order[first][1].__dict__.get("_lazynn_device")
        if device is not None and device.type not in ("cpu", "meta"):
            return  # another generator: draw from its current state
        if declared is not None and declared.type != "cpu" and device is None:
            return
        if state is None:
            if eager_after:
                self.notes.append(
                    f"the first lazy layer, '{order[first][0]}', is torch's own (it records no "
                    "construction state), so the eager layers after it keep their values and "
                    "the model is not reproducible as an eager one: use lazynn's layers"
                )
            return
        owned = {id(t) for _, m in order[: first + 1] for t in _own_tensors(m)}
        saved = torch.get_rng_state()
        try:
            torch.set_rng_state(state)
            stopped = None
            for path, module in eager_after:
                tensors = _own_tensors(module)
                if any(id(t) in owned for t in tensors):
                    self.tied.add(module)
                    if _reset(module) is not None:
                        _scratch_init(module)
                elif stopped is None and _reset(module) is not None:
                    twin = _scratch_init(module)
                    same = all(
                        torch.equal(a, b)
                        for a, b in zip(_own_tensors(twin), tensors, strict=True)
                        if not a.is_meta and not b.is_meta
                    )
                    if same:
                        self.replay.add(module)
                    else:  # changed by the user: kept, but the stream advances past its init
                        self.tied.add(module)
                        self.notes.append(
                            f"kept the values of '{path}': they were changed after "
                            "construction, so it was not re-initialized in construction order"
                        )
                elif stopped is None:
                    stopped = path
                owned.update(id(t) for t in tensors)
            end = torch.get_rng_state()
        finally:
            torch.set_rng_state(saved)
        if stopped is not None:
            self.notes.append(
                f"'{stopped}' initializes outside reset_parameters() (or has none): from it on, "
                "eager layers keep their constructed values and may differ from an eager model"
            )
        # (When a layer cannot be replayed the stream's end is unknown: assume nothing drew.)
        if stopped is None and not torch.equal(end, now):
            self.replay.clear()
            self.notes = [
                "random numbers were drawn between constructing the model and build(): the "
                "lazy layers are initialized from the current random state (as a first call "
                "would) and the eager ones keep their values, so the model differs from an "
                "eager one; for an exact eager twin, seed, construct, then build"
            ]
            return
        self.start = state


def _allocate(
    model: nn.Module,
    rehearsal: Rehearsal,
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: bool | None,
    quiet: bool = False,
) -> None:
    """Allocate every lazy layer the rehearsal sized; ``quiet``: no notes on the plan (a first
    call's build, which promises no eager twin)."""
    order = list(model.named_modules())
    lazy = set(rehearsal.sizes) | {m for m in rehearsal.inputs if _is_lazy_module(m)}
    total = sum(
        info.numel for path, m in order if m in lazy for info in rehearsal.tensors.get(path, [])
    )
    on_meta = device is not None and device.type == "meta"
    with _BUILD_LOCK:
        rng_before = torch.get_rng_state()
        plan = _Plan(order, lazy, device, rng_before)
        snapshot = Snapshot(model)
        bar = Progress(total, "lazynn.build", enabled=progress)
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        births: dict[tuple[Any, str], nn.Module] = {}
        replaced: list[tuple[torch.Tensor, torch.Tensor]] = []
        shared: dict[int, torch.Tensor] = {}
        try:
            with torch.no_grad():
                if plan.start is not None:
                    torch.set_rng_state(plan.start)
                for _, module in order:
                    if module in rehearsal.sizes and is_unbuilt(module):
                        assert isinstance(module, LazyLayer)
                        sizes = rehearsal.sizes[module]
                        kin = (module.__dict__.get("_lazynn_birth"), repr(sorted(sizes.items())))
                        source = births.get(kin)
                        recipe = _recipe(module, sizes, dtype)
                        if source is None:
                            births[kin] = module
                            module._lazynn_build(sizes, device=device, dtype=dtype)
                        else:  # a copy of a layer built before: its values, no draws
                            state = torch.get_rng_state()
                            module._lazynn_build(sizes, device=device, dtype=dtype)
                            torch.set_rng_state(state)
                        _finish(module)
                        if source is not None and on_meta:
                            _COPY_OF[module] = source  # materialize() copies its values
                        elif source is not None:
                            _copy_values(source, module)
                        elif on_meta:
                            _REBUILD[module] = recipe
                        bar.advance(sum(t.numel() for t in module.parameters()))
                    elif module in lazy:
                        _retarget(module, device, dtype)
                        a, k = rehearsal.inputs[module]
                        module._infer_parameters(module, a, k)  # type: ignore[operator]
                        bar.advance(sum(t.numel() for t in module.parameters()))
                    elif module in plan.replay and on_meta:
                        _to_meta(module, shared)  # materialize() initializes it in order
                    elif module in plan.replay:
                        twin = _scratch_init(module)  # from the eager position; commit at the end
                        pending += zip(_own_tensors(module), _own_tensors(twin), strict=True)
                    elif module in plan.tied and on_meta:
                        _to_meta(module, shared, only_shared=True)  # follow moved ties
                    elif module in plan.tied and plan.start is not None:
                        _scratch_init(module)  # draws what its construction drew; keeps the tie
                for tensor, fresh in pending:
                    replaced.append((tensor, tensor.data))
                    tensor.data = fresh.data
                if not on_meta and (device is not None or dtype is not None):
                    model.to(device=device, dtype=dtype)
            run_ready(model)  # work queued with lazynn.on_build
        except BaseException:
            for tensor, old in replaced:
                tensor.data = old
            snapshot.restore()
            torch.set_rng_state(rng_before)
            raise
        finally:
            bar.close()
        if on_meta and plan.start is not None:
            # Nothing drew on meta; leave the generator where construction began, so that
            # materialize() draws what an eager construction draws.
            torch.set_rng_state(plan.start)
    for note in [] if quiet else plan.notes:
        warnings.warn(f"lazynn.build: {note}", stacklevel=3)


#: Layers build() built on meta -> how to construct them eagerly (class, arguments, dtype), so
#: that materialize() initializes them exactly as their constructor does (nn.Transformer
#: initializes after deep-copying its layers: per-module resets cannot reproduce that).
_REBUILD: weakref.WeakKeyDictionary[nn.Module, tuple[type[nn.Module], dict[str, Any], Any]] = (
    weakref.WeakKeyDictionary()
)
#: Copies of a lazy layer that build() built on meta -> the layer whose values they take.
_COPY_OF: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def _recipe(
    layer: LazyLayer, sizes: dict[str, Any], dtype: torch.dtype | None
) -> tuple[type[nn.Module], dict[str, Any], Any]:
    """(eager class, constructor arguments, dtype) of ``layer`` built with ``sizes``."""
    chosen = sizes.get(CLASS_KEY, layer.cls_to_become)
    arguments = {**layer._lazynn_kwargs, **{k: v for k, v in sizes.items() if k != CLASS_KEY}}
    return chosen, arguments, dtype if dtype is not None else layer._lazynn_dtype


def _named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]


def _copy_values(source: nn.Module, target: nn.Module) -> None:
    """Give ``target`` (a copy of ``source``, built with the same sizes) ``source``'s values."""
    for (name, a), (other, b) in zip(_named_tensors(source), _named_tensors(target), strict=True):
        assert name == other, (name, other)
        b.copy_(a)


def _to_meta(module: nn.Module, shared: dict[int, torch.Tensor], only_shared: bool = False) -> None:
    """Move a module's own tensors to meta, one meta tensor per real one (ties kept);
    ``only_shared``: move only those another module already moved (its tied weights)."""
    stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
    for store in stores:
        for name, tensor in store.items():
            if tensor is None or tensor.is_meta or (only_shared and id(tensor) not in shared):
                continue
            if id(tensor) not in shared:
                meta = torch.empty_like(tensor, device="meta")
                shared[id(tensor)] = (
                    nn.Parameter(meta, tensor.requires_grad)
                    if isinstance(tensor, nn.Parameter)
                    else meta
                )
            store[name] = shared[id(tensor)]


def _allocate_own(
    module: nn.Module, device: torch.device, allocated: dict[int, torch.Tensor]
) -> list[torch.Tensor]:
    """Give the module's own meta tensors real memory on ``device``, one per meta tensor (so
    tied weights stay tied); returns the tensors another module owns first, to keep."""
    keep = []
    stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
    for store in stores:
        for name, tensor in store.items():
            if tensor is None:
                continue
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
            store[name] = allocated[id(tensor)]
    return keep


def _meta_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    return (t for t in _own_tensors(module) if t.is_meta)


#: in an init step: the module's initializer runs in a later step (after its submodules)
_LATER: Any = object()


def _initializer(module: nn.Module) -> tuple[Any, bool] | None:
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
        # tests/test_build.py materializes both and compares with eager construction.
        return private, True
    return None


@dataclass(frozen=True)
class _Rebuild:
    """Init step: construct the eager layer on the target and adopt its tensors."""

    recipe: tuple[type[nn.Module], dict[str, Any], Any]


@dataclass(frozen=True)
class _CopyFrom:
    """Init step: allocate, then take the values of the layer this one is a copy of."""

    source: nn.Module


def _layout(module: nn.Module) -> list[tuple[str, str, tuple[int, ...], torch.dtype]]:
    return [
        (path, name, tuple(t.shape), t.dtype)
        for path, m in module.named_modules()
        for name, t in (*m._parameters.items(), *m._buffers.items())
        if t is not None
    ]


def _init_steps(model: nn.Module) -> list[tuple[str, nn.Module, Any, bool]]:
    """(path, module, initializer, allocate its own meta tensors?) in the order an eager
    construction initializes.

    The initializer is a function (``reset_parameters``), ``_LATER`` (it runs in a later step,
    after the submodules: see :func:`_initializer`), None (the module has none), or, for a
    lazy layer built on meta by :func:`build`, ``_Rebuild`` (construct it as eager and adopt
    its tensors, exact whatever its constructor does) or ``_CopyFrom`` (a copy of a layer
    built before it, as ``nn.TransformerEncoder`` makes). These two cover the whole subtree;
    they are used only for a subtree whose tensors are all on meta, not sharded and not tied
    to tensors outside it.
    """
    steps: list[tuple[str, nn.Module, Any, bool]] = []
    seen: set[int] = set()
    owners: dict[int, int] = {}
    for m in model.modules():
        for t in _own_tensors(m):
            owners[id(t)] = owners.get(id(t), 0) + 1

    def has_meta(module: nn.Module) -> bool:
        return any(t.is_meta for t in (*module.parameters(), *module.buffers()))

    def whole(module: nn.Module, sharded: bool = False) -> bool:
        tensors = [t for m in module.modules() for t in _own_tensors(m)]
        return all(
            t.is_meta and owners[id(t)] == 1 and (sharded or type(t).__name__ != "DTensor")
            for t in tensors
        )

    def walk(path: str, module: nn.Module) -> None:
        seen.add(id(module))
        source = _COPY_OF.get(module)
        # a copy takes values already there, or given earlier in this call (sharded alike:
        # copies are sharded alike, so the copy is local)
        if (
            source is not None
            and whole(module, sharded=True)
            and (not has_meta(source) or id(source) in seen)
        ):
            seen.update(id(m) for m in module.modules())
            steps.append((path, module, _CopyFrom(source), False))
            return
        recipe = _REBUILD.get(module)
        if recipe is not None and whole(module):
            cls, kwargs, dtype = recipe
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                shadow = _new(cls, kwargs, "meta", dtype)
            if _layout(shadow) == _layout(module):
                seen.update(id(m) for m in module.modules())
                steps.append((path, module, _Rebuild(recipe), False))
                return
        own = any(True for _ in _meta_tensors(module))
        found = _initializer(module)
        after = found is not None and found[1] and has_meta(module)
        if own:
            init = None if found is None else (_LATER if found[1] else found[0])
            steps.append((path, module, init, True))
        for name, child in module._modules.items():
            if child is not None and id(child) not in seen:
                walk(f"{path}.{name}" if path else name, child)
        if after and found is not None:
            steps.append((path, module, found[0], False))

    walk("", model)
    return steps


def _adopt(module: nn.Module, eager: nn.Module, allocated: dict[int, torch.Tensor]) -> None:
    """Put ``eager``'s tensors in place of ``module``'s meta ones (same layout)."""
    theirs = dict(eager.named_modules())
    for path, m in module.named_modules():
        for store, other in (
            (m._parameters, theirs[path]._parameters),
            (m._buffers, theirs[path]._buffers),
        ):
            for name, tensor in store.items():
                if tensor is None:
                    continue
                new = other[name]
                assert new is not None
                if isinstance(new, nn.Parameter):
                    new.requires_grad_(tensor.requires_grad)
                allocated[id(tensor)] = new
                store[name] = new  # type: ignore[assignment]


def _allocate_tree(
    module: nn.Module, device: torch.device, allocated: dict[int, torch.Tensor]
) -> None:
    for m in module.modules():
        _allocate_own(m, device, allocated)


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
    unbuilt = [p for p, m in model.named_modules() if _is_lazy_module(m)]
    if unbuilt:
        raise LazynnError(
            message(
                "materialize",
                "a built model",
                "unbuilt lazy layers " + ", ".join(f"'{p}'" for p in unbuilt),
                "build it first: lazynn.build(model, example, device='meta')",
            )
        )
    steps = _init_steps(model)
    blind = [p for p, m, init, _ in steps if init is None]  # (no initializer)
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
        t.numel()
        for _, m, init, alloc in steps
        if alloc or isinstance(init, (_Rebuild, _CopyFrom))
        for sub in (m.modules() if not alloc else [m])
        for t in _meta_tensors(sub)
    )
    with _BUILD_LOCK:
        snapshot = Snapshot(model)
        bar = Progress(total, "lazynn.materialize", enabled=progress)
        try:
            allocated: dict[int, torch.Tensor] = {}
            kept: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
            with torch.no_grad():
                for path, module, init, alloc in steps:
                    if isinstance(init, _Rebuild):
                        cls, kwargs, dtype = init.recipe
                        count = sum(t.numel() for m in module.modules() for t in _meta_tensors(m))
                        with warnings.catch_warnings():  # it warned at its construction
                            warnings.simplefilter("ignore")
                            eager = _new(cls, kwargs, target, dtype)
                        _adopt(module, eager, allocated)
                        bar.advance(count)
                        continue
                    if isinstance(init, _CopyFrom):
                        count = sum(t.numel() for m in module.modules() for t in _meta_tensors(m))
                        _allocate_tree(module, target, allocated)
                        _copy_values(init.source, module)
                        bar.advance(count)
                        continue
                    if alloc:
                        count = sum(t.numel() for t in _meta_tensors(module))
                        keep = _allocate_own(module, target, allocated)
                        kept[id(module)] = [(t, t.detach().clone()) for t in keep]
                        bar.advance(count)
                    if init is not None and init is not _LATER:
                        with init_mode(module, path):  # sharded (FSDP2): as if unsharded
                            init()
                        for tensor, value in kept.pop(id(module), []):
                            tensor.copy_(value)  # a tied tensor keeps its first owner's values
            run_ready(model)  # work queued with lazynn.on_build
        except BaseException:
            snapshot.restore()
            raise
        finally:
            bar.close()
    return model
