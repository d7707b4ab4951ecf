"""A minimal progress bar on stderr for long allocations (no dependency)."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]

#: Allocations of fewer parameters than this finish too fast to need a bar.
THRESHOLD = 50_000_000


class Progress:
    """``lazynn.build [#######.............] 35% 124M/355M new parameters (406M in the model)``.

    ``total`` counts what this allocation makes (a build: the lazy layers' parameters and
    buffers); ``model_total``, if given, the model's parameters in all (eager layers, made
    at construction, included), so that the bar's figure is not mistaken for the model's size.
    Shown only when ``enabled`` is True, or when it is None (the default) and the total is at
    least ``THRESHOLD`` parameters and stderr is a terminal. Redraws at most 10 times a second.
    """

    def __init__(
        self, total: int, label: str, enabled: bool | None = None, model_total: int | None = None
    ) -> None:
        if enabled is None:
            enabled = total >= THRESHOLD and sys.stderr.isatty()
        self.enabled = enabled and total > 0
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
        fraction = min(self.done / self.total, 1.0)
        filled = int(fraction * 20)
        bar = "#" * filled + "." * (20 - filled)
        text = f"\r{self.label} [{bar}] {fraction:4.0%} {_short(self.done)}/{_short(self.total)}"
        sys.stderr.write(text + self.suffix)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def _short(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.0f}{unit}"
    return str(n)
