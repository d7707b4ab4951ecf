"""Python's cycle collector paused while a rehearsal runs.

A rehearsal makes and drops tens of thousands of objects (a snapshot's copies, meta tensors,
hooks), and each generation-2 collection they trigger walks every object of the process: on
an 80-block LLaMA-70B-shaped model that was 60% of a ``summary`` (0.92 s against 0.28-0.38 s
with the collector paused, docs/benchmarks.md), and half of a 3-layer MLP's ``build``. What a
rehearsal leaves behind is collected after it, as usual.

The collector is process-wide: :func:`paused` pauses it once for any number of rehearsals
running at once (threads) and resumes it when the last one ends, if it was running when the
first one began.

>>> import gc
>>> with paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0
_resume = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The cycle collector off inside (see the module doc)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume and not gc.isenabled():
                gc.enable()
