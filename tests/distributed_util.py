"""A small harness for multi-process tests: spawn ``world`` ranks on 127.0.0.1 (gloo, CPU),
run one function on each, and collect the dict each rank reports.

Workers report plain Python values (numbers, strings, lists): the parent asserts. Every run
is bounded in time: hung workers are terminated and the test fails with a clear message.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as torch_mp

__all__ = ["Report", "always_jump", "pack", "run_ranks", "run_sections", "section", "unpack"]

Report = dict[str, Any]
Worker = Callable[..., Report]


def always_jump() -> int:
    """In a rank's process: every skip of the random stream longer than two keys jumps (the
    path of a large model's skips, on a test's small one); returns the jumps made so far."""
    import lazynn._program.draws as draws
    import lazynn._program.jump as jump

    def pays(words: int, repeated: bool = False) -> bool:
        return words > 1248

    jump.jump_pays = pays  # type: ignore[assignment]
    draws.jump_pays = pays  # type: ignore[assignment]
    return jump.counters().jumps


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pack(tensor: torch.Tensor) -> tuple[list[int], str, bytes]:
    """A CPU tensor as plain values a worker can report: (shape, dtype name, raw bytes)."""
    t = tensor.detach().cpu().contiguous()
    return list(t.shape), str(t.dtype).removeprefix("torch."), t.numpy().tobytes()


def unpack(packed: tuple[list[int], str, bytes]) -> torch.Tensor:
    """The tensor :func:`pack` reported, bit for bit."""
    shape, dtype, data = packed
    flat = torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype))
    return flat.reshape(shape)


def _entry(
    rank: int, world: int, port: int, results: Any, worker: Worker, args: tuple[Any, ...]
) -> None:
    """One rank: join the process group, run ``worker(rank, world, *args)``, report."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # two ranks share a couple of cores
    report: Report = {"rank": rank}
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        try:
            report.update(worker(rank, world, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # reported to the parent, which fails the test
        report["crash"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    results.put(report)
    # Once the report is through the pipe, leave without the interpreter's teardown: gloo's
    # threads and the store's destructors have aborted a rank after a complete, correct report
    # (SIGABRT once in CI's torch 2.14.1 run, the other rank exiting 0). A rank that dies before
    # reporting still fails the test by its missing report and exit code.
    results.close()
    results.join_thread()
    os._exit(0)


def run_ranks(worker: Worker, *args: Any, world: int = 2, timeout: float = 90.0) -> list[Report]:
    """Run ``worker(rank, world, *args)`` on ``world`` spawned processes; their reports by rank.

    ``worker`` must be a module-level function (spawn pickles it by name). Fails the calling
    test if a rank crashes, hangs past ``timeout`` seconds, or exits without reporting.
    """
    ctx = torch_mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, results, worker, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    reports: list[Report] = []
    deadline = time.monotonic() + timeout
    try:
        while len(reports) < world and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                reports.append(results.get(timeout=0.5))
                if "crash" in reports[-1]:  # the others may wait on it in a collective
                    deadline = min(deadline, time.monotonic() + 5.0)
            if len(reports) < world and all(not p.is_alive() for p in procs):
                with contextlib.suppress(queue.Empty):  # a report may still be in flight
                    while len(reports) < world:
                        reports.append(results.get(timeout=2.0))
                break
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
    finally:
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.terminate()
            p.join(10)
        for p in hung:
            if p.is_alive():
                p.kill()
                p.join(5)
    ranks = sorted(reports, key=lambda r: r["rank"])
    name = getattr(worker, "__name__", repr(worker))
    stuck = [procs.index(p) for p in hung]
    crashes = [f"rank {r['rank']}: {r['crash']}" for r in ranks if "crash" in r]
    if crashes:
        waiting = f" (ranks {stuck} were left waiting and terminated)" if stuck else ""
        raise AssertionError(f"{name} crashed{waiting}:\n" + "\n".join(crashes))
    if hung:
        raise AssertionError(
            f"{name}: ranks {stuck} did not finish within {timeout} s and were terminated; "
            f"reports received: {ranks}"
        )
    codes = [p.exitcode for p in procs]
    if len(ranks) != world:
        raise AssertionError(f"{name}: {len(ranks)} of {world} ranks reported (exit codes {codes})")
    assert codes == [0] * world, f"{name}: exit codes {codes}"
    return ranks


def _sections(rank: int, world: int, workers: tuple[Worker, ...]) -> Report:
    """Run each worker in turn on this rank; a worker that raises reports its crash only."""
    report: Report = {}
    for worker in workers:
        try:
            report[worker.__name__] = worker(rank, world)
        except Exception as error:
            report[worker.__name__] = {
                "crash": f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
            }
    return report


def run_sections(*workers: Worker, world: int = 2, timeout: float = 120.0) -> list[Report]:
    """Run several independent workers in one launch (spawning costs seconds): rank ``r``'s
    report maps each worker's name to its report. Read one with :func:`section`."""
    return run_ranks(_sections, workers, world=world, timeout=timeout)


def section(ranks: list[Report], worker: Worker) -> list[Report]:
    """Each rank's report from ``worker`` in a :func:`run_sections` launch; fails the calling
    test if it crashed on any rank."""
    reports = [{"rank": r["rank"], **r[worker.__name__]} for r in ranks]
    crashes = [f"rank {r['rank']}: {r['crash']}" for r in reports if "crash" in r]
    if crashes:
        raise AssertionError(f"{worker.__name__} crashed:\n" + "\n".join(crashes))
    return reports
