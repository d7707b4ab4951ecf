"""build(): whole-model shape inference on meta, then one allocation.

``build(model, *examples)`` runs the model once on meta tensors (``_rehearsal/rehearse.py``)
to learn every lazy layer's sizes, then allocates each layer once, in *construction order*
(the order of ``model.modules()``), so that initialization draws the random numbers an eager
model's construction draws: under one seed, ``build(LazyNet(), x)`` equals ``EagerNet()`` bit
for bit.

For a model that mixes eager and lazy layers, the eager layers constructed after the first
lazy one drew their numbers at construction from the wrong place in the stream; ``build``
replays the stream from the first lazy layer's construction (its recorded generator state),
re-initializing those eager layers with ``reset_parameters()``, unless their values were
changed since construction (then they are kept, with a warning).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch import nn

from .._errors import (
    InferenceError,
    message,
)
from .._module.snapshot import atomic
from .._module.state import BUILD_LOCK, context
from .._module.tensors import (
    is_placeholder,
)
from .._rehearsal.collector import paused
from .._rehearsal.rehearse import apart, rehearse, warn_notes
from .allocate import allocate
from .arguments import check_device, check_dtype, check_model, check_progress, check_threads
from .factory import build_factory, is_factory
from .install import install
from .progress import Progress, meta_numel
from .queue import run_ready

__all__ = ["build", "build_from"]

M = TypeVar("M", bound=nn.Module)


@paused()  # (the cycle collector: see _rehearsal/collector.py)
def build(
    model: M | Callable[[], M],
    *example_inputs: Any,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    progress: bool | None = None,
    threads: int = 1,
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
        dtype: the floating-point dtype of the new parameters (or its name, ``"bfloat16"``).
            Default: as declared or moved.
        progress: show a progress bar on stderr. Default: for large models (over 50M new
            parameters) when stderr is a terminal.
        threads: how many threads draw the CPU random stream. Above 1, on the CPU, the model
            is built on meta, then given its values as ``materialize(model, device,
            threads=threads)`` gives them (each large random fill drawn in parts at once, the
            numbers and the generator's end those of one thread), on ``device`` (default: the
            default device). Default 1: parallel drawing pays only for fills of millions of
            numbers, on cores of their own.
        **example_kwargs: the forward's keyword inputs, as above.

    Returns:
        ``model``, every layer plain torch.nn.

    Raises:
        InferenceError: the forward failed on the examples (the message names the module's
            path, type and the input shapes it received), or a lazy layer was never called.
            The model is then exactly as it was.
        ArgumentError: ``threads`` is not a whole number of 1 or more.

    >>> import torch, lazynn
    >>> from torch import nn
    >>> net = nn.Sequential(lazynn.LazyConv2d(8, 3), nn.Flatten(), lazynn.LazyLinear(10))
    >>> lazynn.build(net, (1, 3, 32, 32))[2]
    Linear(in_features=7200, out_features=10, bias=True)
    """
    check_model(model, "lazynn.build")
    threads = check_threads(threads, "lazynn.build")
    dtype = check_dtype(dtype, "lazynn.build")
    progress = check_progress(progress, "lazynn.build")
    target = device = check_device(device, "lazynn.build")
    if threads > 1 and _drawn_on_cpu(model, target):
        return _build_in_threads(
            model, example_inputs, example_kwargs, target, dtype, threads, progress
        )
    if is_factory(model):
        made = build_factory(model, example_inputs, example_kwargs, target, dtype, progress)
        return cast(M, made)
    assert isinstance(model, nn.Module)
    return build_from(cast(M, model), example_inputs, example_kwargs, device, dtype, progress)


def _drawn_on_cpu(model: Any, target: torch.device | None) -> bool:
    """Whether a build of ``model`` draws on the CPU only: its target is the CPU, and no tensor
    of an instance is declared on meta (it stays there: nothing to draw)."""
    if (target or torch.get_default_device()).type != "cpu":
        return False
    if not isinstance(model, nn.Module):
        return True
    tensors = (*model.parameters(), *model.buffers())
    return not any(t.is_meta and not is_placeholder(t) for t in tensors)


def _build_in_threads(
    model: M | Callable[[], M],
    example_inputs: tuple[Any, ...],
    example_kwargs: dict[str, Any],
    target: torch.device | None,
    dtype: torch.dtype | None,
    threads: int,
    progress: bool | None,
) -> M:
    """``build`` with ``threads``: on meta, then every init program replayed on ``target``
    with parts of its large fills drawn by threads (``install``, with its progress bar), all
    or nothing."""
    target = target or torch.get_default_device()
    meta = torch.device("meta")
    with BUILD_LOCK, atomic(*([model] if isinstance(model, nn.Module) else []), values=True):
        if is_factory(model):
            made = cast(M, build_factory(model, example_inputs, example_kwargs, meta, dtype))
        else:
            assert isinstance(model, nn.Module)
            made = build_from(cast(M, model), example_inputs, example_kwargs, meta, dtype)
        bar = Progress(meta_numel(made), "lazynn.build", progress)
        try:
            with torch.inference_mode(False):
                install(made, target, bar.advance, threads=threads)
        finally:
            bar.close()
        run_ready(made)  # (work queued with lazynn.on_build, still waiting)
        if dtype is not None:  # (the eager layers too, as a build on the device does)
            made.to(dtype=dtype)
    return made


def build_from(
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
    # The rehearsal and the allocation under one hold of the build lock: another thread's
    # build of the same model waits, then finds nothing left to build. (Inside a forward
    # that a rehearsal runs, what the build runs is not that forward's: apart.)
    # A build that a rehearsal's forward runs builds that rehearsal's twin: what the build of
    # the model itself must say, that build says (the notes go to the rehearsal).
    nested = context().rehearsal is not None
    with BUILD_LOCK, apart():
        rehearsal = rehearse(model, example_inputs, example_kwargs, literal=partial)
        if rehearsal.unreached and not partial:
            raise InferenceError(
                message(
                    "build",
                    "example inputs whose forward calls every lazy layer",
                    "a forward that never called "
                    + ", ".join(f"'{p}'" for p in rehearsal.unreached),
                    "pass inputs (or a training/eval mode) that reach these layers",
                    outcome="the model is unchanged",
                )
            )
        allocate(
            model,
            rehearsal,
            torch.device(device) if device is not None else None,
            dtype,
            progress,
            quiet=partial or nested,
            examples=(*example_inputs, *example_kwargs.values()),
        )
    if not nested:
        warn_notes(rehearsal.notes.values())
    return model
