"""A minimal progress bar on stderr for long allocations (no dependency), one for every door
that allocates: ``build`` (instance and factory forms, ``threads=N``) and ``materialize``
(sharded too: rank 0 draws it).

>>> Progress(10, "lazynn.build").enabled  # (small, and stderr not a terminal)
False
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from .._module.callers import distributed
from .._module.tensors import own_tensors

__all__ = ["Progress", "meta_numel"]

#: Allocations of fewer parameters than this finish too fast to need a bar.
THRESHOLD = 50_000_000


class Progress:
    """``lazynn.build [#######.............] 35% 124M/355M new parameters (406M in the model)``.

    ``total`` counts what this allocation makes (a build: the lazy layers' parameters and
    buffers); ``model_total``, if given, the model's parameters in all (eager layers, made
    at construction, included), so that the bar's figure is not mistaken for the model's size.
    Shown only when ``enabled`` is True, or when it is None (the default) and the total is at
    least ``THRESHOLD`` parameters and stderr is a terminal; in a distributed job, on rank 0
    only. Redraws at most 10 times a second.
    """

    def __init__(
        self, total: int, label: str, enabled: bool | None = None, model_total: int | None = None
    ) -> None:
        if enabled is None:
            enabled = total >= THRESHOLD and sys.stderr.isatty()
        self.enabled = enabled and total > 0 and _rank() == 0
        self.total = total
        self.done = 0
        self.label = label
        self.suffix = (
            f" new parameters ({_short(model_total)} in the model)"
            if model_total is not None and model_total != total
            else " parameters"
        )
        self._last = 0.0

    def advance(self, count: int) -> None:
        self.done += count
        if self.enabled and (time.monotonic() - self._last > 0.1 or self.done >= self.total):
            self._last = time.monotonic()
            self._draw()

    def _draw(self) -> None:
        done = min(self.done, self.total)  # (a tensor registered, then replaced by a tie)
        fraction = done / self.total
        filled = int(fraction * 20)
        bar = "#" * filled + "." * (20 - filled)
        text = f"\r{self.label} [{bar}] {fraction:4.0%} {_short(done)}/{_short(self.total)}"
        sys.stderr.write(text + self.suffix)
        sys.stderr.flush()

    @contextlib.contextmanager
    def registrations(self) -> Iterator[None]:
        """Advance as this thread's code registers parameters and buffers on modules (each
        tensor once): the bar of a construction the user's ``__init__`` runs itself (the
        factory form), whose allocations lazynn does not make. torch's global registration
        hooks (public), attached only while a bar is shown, and only for its run."""
        if not self.enabled:
            yield
            return
        thread, seen = threading.get_ident(), set()

        def registered(module: nn.Module, name: str, tensor: Any) -> None:
            if (
                threading.get_ident() == thread
                and isinstance(tensor, torch.Tensor)
                and not tensor.is_meta
                and id(tensor) not in seen
            ):
                seen.add(id(tensor))
                self.advance(tensor.numel())

        handles = [
            torch_module.register_module_parameter_registration_hook(registered),
            torch_module.register_module_buffer_registration_hook(registered),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def close(self) -> None:
        if self.enabled:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def meta_numel(model: nn.Module) -> int:
    """How many elements ``model``'s meta tensors hold (each tensor once; a DTensor's local
    shard): what a materialization allocates."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for tensor in own_tensors(module):
            local = getattr(tensor, "_local_tensor", tensor)  # (a DTensor's: to_local())
            if local.is_meta and id(tensor) not in seen:
                seen.add(id(tensor))
                total += local.numel()
    return total


def _rank() -> int:
    """This process's rank in the default group (0 outside a distributed job)."""
    return torch.distributed.get_rank() if distributed() else 0


def _short(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.0f}{unit}"
    return str(n)
