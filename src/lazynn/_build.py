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
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from ._declare import LazyLayer
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
    """:func:`build`; ``partial``: lazy layers the examples do not reach stay unbuilt."""
    rehearsal = rehearse(model, example_inputs, example_kwargs)
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
        replaced: list[tuple[torch.Tensor, torch.Tensor]] = []
        shared: dict[int, torch.Tensor] = {}
        try:
            with torch.no_grad():
                if plan.start is not None:
                    torch.set_rng_state(plan.start)
                for _, module in order:
                    if module in rehearsal.sizes and is_unbuilt(module):
                        assert isinstance(module, LazyLayer)
                        module._lazynn_build(rehearsal.sizes[module], device=device, dtype=dtype)
                        _finish(module)
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


def materialize(
    model: M, device: torch.device | str | None = None, progress: bool | None = None
) -> M:
    """Allocate a model built on meta (``build(..., device="meta")``) on ``device``.

    Each module with meta tensors gets real, uninitialized memory for its own tensors
    (``to_empty``) and is initialized by its ``reset_parameters()``, in construction order, so
    the values equal an eager model's under the same seed. Works on a model sharded by FSDP2
    after the meta build: each rank allocates its own shards.

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
    todo = [(p, m) for p, m in model.named_modules() if any(True for _ in _meta_tensors(m))]
    blind = [p for p, m in todo if not callable(getattr(m, "reset_parameters", None))]
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
    total = sum(t.numel() for _, m in todo for t in _meta_tensors(m))
    with _BUILD_LOCK:
        snapshot = Snapshot(model)
        bar = Progress(total, "lazynn.materialize", enabled=progress)
        try:
            allocated: dict[int, torch.Tensor] = {}
            with torch.no_grad():
                for path, module in todo:
                    count = sum(t.numel() for t in _meta_tensors(module))
                    keep = _allocate_own(module, target, allocated)
                    saved = [(t, t.detach().clone()) for t in keep]
                    with init_mode(module, path):  # sharded (FSDP2): as if unsharded
                        module.reset_parameters()  # type: ignore[operator]
                    for tensor, value in saved:  # a tied tensor keeps its first owner's values
                        tensor.copy_(value)
                    bar.advance(count)
            run_ready(model)  # work queued with lazynn.on_build
        except BaseException:
            snapshot.restore()
            raise
        finally:
            bar.close()
    return model
