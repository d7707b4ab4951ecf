"""materialize(): a model built on meta, allocated once, with the eager model's numbers.

Each meta tensor gets its value one of two ways, decided before anything changes:

* it keeps its **init program** (``lazynn.build`` made it on meta, in either form): its
  construction's tape is replayed on the target, whole or as this rank's shard
  (``install.py``); wrapped, copied or pickled since, it keeps it;
* it keeps none (a model made on meta without lazynn): its module's ``reset_parameters()``
  runs on real memory, in construction order (``reset.py``).

Then the work queued with ``lazynn.on_build`` runs, where the eager program would have run it
(values a checkpoint loaded since the build are put back after it: loaded values win).
Everything happens under the one rollback, ``atomic``: on any failure the model, still on
meta, and every generator are as they were.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from .._errors import LazynnError, message
from .._module.lifecycle import is_lazy_module
from .._module.snapshot import atomic
from .._module.state import BUILD_LOCK
from .arguments import check_device, check_module, check_progress, check_threads
from .install import install, pending
from .progress import Progress, meta_numel
from .queue import run_ready
from .reset import plan_steps, run_steps

__all__ = ["materialize"]

M = TypeVar("M", bound=nn.Module)


def materialize(
    model: M,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    threads: int = 1,
) -> M:
    """Allocate a model built on meta (``build(..., device="meta")``) on ``device``, with the
    values the eager model gets under the same seed.

    Each tensor's init program (the construction ``build`` recorded on meta) runs on the
    target: on one device, or, for a model sharded since (FSDP2 ``fully_shard``, tensor
    parallel, 2-D), only this rank's shards. Meta tensors that keep no program (a model made
    on meta without lazynn) are initialized by their module's ``reset_parameters()``, in
    construction order.

    Args:
        model: built on meta (or partly on meta), wrapped, copied or sharded since.
        device: where to allocate. Default: the current default device.
        progress: as in :func:`build`.
        threads: how many threads draw the CPU random stream: each large random fill is
            drawn in parts at once, each from the generator jumped to its part, with the
            numbers and the generator's end of one thread. Default 1: parallel drawing pays
            only for fills of millions of numbers, on cores of their own.

    Raises:
        LazynnError: a lazy layer is still unbuilt, a module with meta tensors and no program
            has no ``reset_parameters()``, a tensor would hold uninitialized memory, or a
            tensor was replaced since the build other than by a checkpoint load
            (``module.to_empty()``: materialize instead; nothing is changed).
        ArgumentError: ``threads`` is not a whole number of 1 or more.

    >>> import torch, lazynn
    >>> net = lazynn.build(lazynn.LazyLinear(4), (2, 3), device="meta")
    >>> net.weight.device
    device(type='meta')
    >>> lazynn.materialize(net, "cpu").weight.device
    device(type='cpu')
    """
    check_module(model, "lazynn.materialize")
    threads = check_threads(threads, "lazynn.materialize")
    progress = check_progress(progress, "lazynn.materialize")
    target = check_device(device, "lazynn.materialize") or torch.get_default_device()
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
    covered = {(id(module), name) for module, _, name, _ in pending(model)}
    steps, blind = plan_steps(model, covered)
    if blind:
        raise LazynnError(
            message(
                "materialize",
                "modules with a reset_parameters() to initialize their meta tensors",
                ", ".join(f"'{p}'" for p in blind) + " without one",
                "give these modules a reset_parameters() that initializes their own "
                "parameters and buffers (as torch.nn layers have), or build the model with "
                "lazynn.build(..., device='meta'), whose tensors keep their init programs",
            )
        )
    with BUILD_LOCK:
        bar = Progress(meta_numel(model), "lazynn.materialize", enabled=progress)
        try:
            with atomic(model):
                with torch.inference_mode(False):
                    install(model, target, bar.advance, threads)
                run_steps(model, steps, target, bar)
                run_ready(model)  # work queued with lazynn.on_build, still waiting
        finally:
            bar.close()
    return model
