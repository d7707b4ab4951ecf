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
from ._placeholder import is_placeholder, relocate
from ._progress import Progress
from ._rehearse import Rehearsal, _is_lazy_module, rehearse
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
    rehearsal = rehearse(model, example_inputs, example_kwargs)
    if rehearsal.unreached:
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
        model, rehearsal, torch.device(device) if device is not None else None, dtype, progress
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


def _replays(rehearsal: Rehearsal, order: list[nn.Module], device: torch.device | None) -> Any:
    """The CPU generator state to replay from, or None when there is nothing to replay."""
    if device is not None and device.type not in ("cpu", "meta"):
        return None
    for module in order:
        if module in rehearsal.sizes or module in rehearsal.inputs:
            state = module.__dict__.get("_lazynn_rng")
            declared = module.__dict__.get("_lazynn_device")
            if declared is not None and declared.type != "cpu" and device is None:
                return None
            return state
    return None


def _allocate(
    model: nn.Module,
    rehearsal: Rehearsal,
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: bool | None,
) -> None:
    order = list(model.modules())
    start = _replays(rehearsal, order, device)
    total = sum(
        info.numel
        for path, module in model.named_modules()
        if module in rehearsal.sizes or module in rehearsal.inputs
        for info in rehearsal.tensors.get(path, [])
    )
    with _BUILD_LOCK:
        snapshot = Snapshot(model)
        rng_before = torch.get_rng_state()
        bar = Progress(total, "lazynn.build", enabled=progress)
        try:
            with torch.no_grad():
                # On meta nothing draws: the generator is left where construction began, so
                # that materialize() draws what an eager construction would.
                on_meta = device is not None and device.type == "meta"
                if start is not None:
                    torch.set_rng_state(start)
                mixed = start
                seen_lazy = False
                kept: list[str] = []
                owned: set[int] = set()  # tensors of modules already visited (ties)
                for path, module in model.named_modules():
                    tied = any(id(t) in owned for t in _own_tensors(module))
                    owned.update(id(t) for t in _own_tensors(module))
                    if module in rehearsal.sizes and is_unbuilt(module):
                        assert isinstance(module, LazyLayer)
                        module._lazynn_build(rehearsal.sizes[module], device=device, dtype=dtype)
                        _finish(module)
                        seen_lazy = True
                        bar.advance(sum(t.numel() for t in module.parameters()))
                    elif module in rehearsal.inputs and _is_lazy_module(module):
                        _retarget(module, device, dtype)
                        a, k = rehearsal.inputs[module]
                        module._infer_parameters(module, a, k)  # type: ignore[operator]
                        seen_lazy = True
                        bar.advance(sum(t.numel() for t in module.parameters()))
                    elif seen_lazy and _own_tensors(module) and on_meta:
                        # materialize() will initialize it in construction order; the eager
                        # layers before the first lazy one keep their (correct) values.
                        module.to_empty(device="meta", recurse=False)
                    elif seen_lazy and mixed is not None and _own_tensors(module):
                        mixed = _replay_eager(path, module, mixed, kept, tied)
                if (device is not None and not on_meta) or dtype is not None:
                    model.to(device=None if on_meta else device, dtype=dtype)
        except BaseException:
            snapshot.restore()
            torch.set_rng_state(rng_before)
            raise
        finally:
            bar.close()
    if kept:
        warnings.warn(
            "lazynn.build kept the values of "
            + ", ".join(f"'{p}'" for p in kept)
            + ": they were changed after construction, so they were not re-initialized in "
            "construction order; the layers after them still were",
            stacklevel=3,
        )


def _replay_eager(
    path: str, module: nn.Module, mixed: torch.Tensor, kept: list[str], tied: bool
) -> Any:
    """Re-initialize an eager layer where an all-eager construction would have.

    ``mixed`` is the generator state at this point of the *mixed* model's construction (lazy
    layers drew nothing there). Replaying the layer's init from it tells whether the layer
    still holds its constructed values; if so it is re-initialized from the current (eager)
    position, else kept. Returns the mixed stream's next state.
    """
    reset: Any = getattr(module, "reset_parameters", None)
    if not callable(reset):
        return mixed  # nothing to replay with: kept as constructed
    eager_position = torch.get_rng_state()
    torch.set_rng_state(mixed)
    twin: Any = copy.deepcopy(module)
    twin.reset_parameters()
    mixed_after = torch.get_rng_state()
    untouched = all(
        torch.equal(a, b) for a, b in zip(_own_tensors(twin), _own_tensors(module), strict=True)
    )
    torch.set_rng_state(eager_position)
    if untouched and not tied:
        reset()
    else:  # changed by the user, or sharing a tensor with an earlier module (weight tying)
        if not tied:
            kept.append(path)
        twin = copy.deepcopy(module)
        twin.reset_parameters()  # advance the stream as eager init would
    return mixed_after


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
            with torch.no_grad():
                for _, module in todo:
                    count = sum(t.numel() for t in _meta_tensors(module))
                    module.to_empty(device=target, recurse=False)
                    module.reset_parameters()  # type: ignore[operator]
                    bar.advance(count)
        except BaseException:
            snapshot.restore()
            raise
        finally:
            bar.close()
    return model
