"""Run one function on ``world`` local processes (gloo ranks on 127.0.0.1) and collect what
each reports: the launcher the distributed examples share (``fsdp.py``, ``tp_2d.py``).

``worker(rank, world, port, results)`` joins the process group on ``port`` and puts its
report, a dict with a ``"rank"`` key, on the ``results`` queue.
"""

from __future__ import annotations

import queue
import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

__all__ = ["run_local_ranks"]


def run_local_ranks(worker: Callable[..., None], world: int) -> list[dict[str, Any]]:
    """Spawn ``world`` processes running ``worker``; their reports, by rank. A rank that
    fails stops the others."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    while len(reports) < world:
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                raise RuntimeError("a rank failed; see its traceback above") from None
    for p in procs:
        p.join(60)
    return sorted(reports, key=lambda r: r["rank"])
