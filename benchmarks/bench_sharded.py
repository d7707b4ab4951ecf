"""Sharded materialize per rank against an unsharded one, by model size and number of ranks.

    python benchmarks/bench_sharded.py [--widths 512,1024,2048] [--depth 8] [--worlds 2,4]
                                       [--modes fsdp,tp,2d] [--forms instance,factory]
                                       [--repeats 3] [--quick]

A stack of ``depth`` MLP blocks (``LazyLinear(4 * width)``, GELU, ``LazyLinear(width)``:
about ``8 * depth * width**2`` parameters) is built on meta (``lazynn.build``: the instance
form, ``build(model, ...)``, or the factory form, ``build(make, ...)``, whose tensors carry
their init programs), sharded, and allocated by ``lazynn.materialize(model, "cpu")``.
Contenders, each in fresh spawned processes (gloo on 127.0.0.1, ``torch.set_num_threads(1)``
per process):

- ``baseline``: one process, unsharded;
- ``fsdp``: ``fully_shard`` per block and the root (every parameter ``Shard(0)``);
- ``tp``: ``parallelize_module`` with the first linear of each block ``ColwiseParallel``
  (weight and bias ``Shard(0)``) and the second ``RowwiseParallel`` (weight ``Shard(1)``: a
  column block, drawn by ``draw_region``; bias replicated);
- ``2d``: a (2, world // 2) mesh ("dp", "tp"): the TP plan on ``mesh["tp"]``, then
  ``fully_shard`` on ``mesh["dp"]`` (``_StridedShard`` blocks), as in examples/tp_2d.py.

Measured per contender and size, over ``repeats`` fresh models (built and sharded outside the
clock; the ranks start together after a barrier):

- the seconds of ``materialize`` on the slowest rank (median over repeats) and its ratio to
  the baseline of the same size: each rank allocates its block only and draws its blocks'
  numbers, skipping the rest of the stream (src/lazynn/_program/draws.py);
- a lower bound: ``torch.empty`` of each local shard's shape plus one ``uniform_`` into it
  (the work ``nn.Linear.reset_parameters`` does on those sizes, without the rest of the
  stream: what an init that does not reproduce the unsharded model would cost);
- the bytes of parameters a rank holds against the full model's;
- the growth of the rank's peak resident memory during ``materialize`` (Linux's ``VmHWM``,
  reset before it through ``/proc/self/clear_refs``), against the full model's bytes.

More processes than cores (4 ranks on a 2-core machine) share the cores: a rank's seconds
then include waiting for one, which the lower bound's column shows too.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import queue
import re
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import lazynn

MODES = ("baseline", "fsdp", "tp", "2d")


def make(width: int, depth: int) -> nn.Sequential:
    """``depth`` blocks of LazyLinear(4 * width), GELU, LazyLinear(width)."""
    blocks = [
        nn.Sequential(lazynn.LazyLinear(4 * width), nn.GELU(), lazynn.LazyLinear(width))
        for _ in range(depth)
    ]
    return nn.Sequential(*blocks)


def tp_plan(model: nn.Sequential) -> dict[str, Any]:
    """Megatron's MLP split: the up projection column-wise, the down projection row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i in range(len(model)):
        plan[f"{i}.0"] = ColwiseParallel()
        plan[f"{i}.2"] = RowwiseParallel()
    return plan


def shard(model: nn.Sequential, mode: str, world: int) -> None:
    """Shard ``model`` (built on meta) in place for ``mode`` over ``world`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if mode == "fsdp":
        for block in model:
            fully_shard(block)
        fully_shard(model)
    elif mode == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, tp_plan(model))
    elif mode == "2d":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(model))
        for block in model:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif mode != "baseline":
        raise ValueError(f"unknown mode {mode!r}")


def built(form: str, width: int, depth: int) -> nn.Sequential:
    """The model on meta, in ``form`` (under seed 0)."""
    torch.manual_seed(0)
    if form == "factory":
        model = lazynn.build(functools.partial(make, width, depth), (2, width), device="meta")
    else:
        model = lazynn.build(make(width, depth), (2, width), device="meta")
    assert isinstance(model, nn.Sequential)
    return model


def _status(field: str) -> int:
    """A field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        found = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(found.group(1)) * 1024 if found else 0


def reset_peak() -> int:
    """Reset the process's peak resident memory to its current one; the current one."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    return _status("VmRSS")


def local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local block (the tensor itself when unsharded)."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p


def lower_bound(shapes: Sequence[torch.Size]) -> float:
    """Seconds of ``torch.empty`` + ``uniform_`` of each shape (kept alive until the end)."""
    start = time.perf_counter()
    kept = [torch.empty(shape).uniform_(-0.01, 0.01) for shape in shapes]
    seconds = time.perf_counter() - start
    del kept
    return seconds


def worker(
    rank: int,
    world: int,
    port: int,
    mode: str,
    form: str,
    widths: Sequence[int],
    depth: int,
    repeats: int,
    out: Any,
) -> None:
    """One rank: for each width, ``repeats`` times build, shard, time materialize and the
    lower bound; put (rank, width, times, bounds, local bytes, full bytes, peak growths) on
    ``out``."""
    torch.set_num_threads(1)
    distributed = mode != "baseline"
    if distributed:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    try:
        # untimed: the process's first build and materialize (torch's one-time imports and
        # caches, DTensor's first dispatches) on a small model of the same shape
        model = built(form, 64, depth)
        shard(model, mode, world)
        lazynn.materialize(model, "cpu")
        del model
        for width in widths:
            times, bounds, peaks, mine, full = [], [], [], 0, 0
            for _ in range(repeats):
                model = built(form, width, depth)
                shard(model, mode, world)
                gc.collect()  # the last repeat's model (FSDP's hooks hold cycles): not in the clock
                if distributed:
                    dist.barrier()
                resident = reset_peak()
                start = time.perf_counter()
                lazynn.materialize(model, "cpu")
                times.append(time.perf_counter() - start)
                peaks.append(_status("VmHWM") - resident if resident >= 0 else -1)
                shapes = [local(p).shape for p in model.parameters()]
                mine = sum(local(p).numel() * p.element_size() for p in model.parameters())
                full = sum(p.numel() * p.element_size() for p in model.parameters())
                del model
                gc.collect()
                if distributed:
                    dist.barrier()
                bounds.append(lower_bound(shapes))
            out.put((rank, width, times, bounds, mine, full, peaks))
    finally:
        if distributed:
            dist.destroy_process_group()


def run(
    mode: str, form: str, world: int, widths: Sequence[int], depth: int, repeats: int
) -> dict[int, dict[str, float]]:
    """Run one contender in ``world`` fresh processes; per width: the median over repeats of
    the slowest rank's seconds (materialize, lower bound), a rank's and the full bytes, and
    the largest peak growth of a rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    args = (world, port, mode, form, tuple(widths), depth, repeats, out)
    procs = [ctx.Process(target=worker, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    results: list[tuple[int, int, list[float], list[float], int, int, list[int]]] = []
    while len(results) < world * len(widths):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"a rank of {mode} x {world} failed") from None
    for p in procs:
        p.join(60)
    report: dict[int, dict[str, float]] = {}
    for width in widths:
        rows = [r for r in results if r[1] == width]
        slowest = [max(r[2][i] for r in rows) for i in range(repeats)]
        bound = [max(r[3][i] for r in rows) for i in range(repeats)]
        report[width] = {
            "seconds": statistics.median(slowest),
            "fastest": statistics.median(min(r[2][i] for r in rows) for i in range(repeats)),
            "bound": statistics.median(bound),
            "bytes": max(r[4] for r in rows),
            "full": rows[0][5],
            "peak": statistics.median(max(r[6][i] for r in rows) for i in range(repeats)),
        }
    return report


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--widths",
        type=ints,
        default=[512, 1024, 2048],
        help="comma-separated block widths (default: 16.8M, 67M, 268M params)",
    )
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument(
        "--worlds",
        type=ints,
        default=[2, 4],
        help="numbers of ranks for fsdp and tp (2d: the even ones >= 4)",
    )
    parser.add_argument(
        "--modes",
        default="fsdp,tp,2d",
        help="comma-separated, of fsdp, tp, 2d (the baseline always runs)",
    )
    parser.add_argument(
        "--forms",
        default="instance",
        help="comma-separated, of instance (build(model, ...)) and factory (build(make, ...))",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="widths 256,512, worlds 2,4, 1 repeat: under a minute"
    )
    args = parser.parse_args()
    if args.quick:
        args.widths, args.worlds, args.repeats = [256, 512], [2, 4], 1
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES[1:]}")
    forms = [f for f in args.forms.split(",") if f]
    if set(forms) - {"instance", "factory"}:
        parser.error(f"unknown forms {sorted(set(forms) - {'instance', 'factory'})}")
    contenders = [("baseline", form, 1) for form in forms]
    for mode in ("fsdp", "tp", "2d"):
        if mode in modes:
            contenders += [
                (mode, form, w)
                for form in forms
                for w in args.worlds
                if w > 1 and (mode != "2d" or (w >= 4 and w % 2 == 0))
            ]
    cores = os.cpu_count() or 1
    print(
        f"{cores} cores, torch {torch.__version__}; one thread per process; depth "
        f"{args.depth}; median of {args.repeats}; seconds: the slowest rank"
    )
    reports: dict[tuple[str, str, int], dict[int, dict[str, float]]] = {}
    for mode, form, world in contenders:
        began = time.perf_counter()
        reports[mode, form, world] = run(mode, form, world, args.widths, args.depth, args.repeats)
        print(f"  ran {mode} ({form}) x {world} in {time.perf_counter() - began:.0f} s", flush=True)
    print()
    print(
        "| parameters | contender | form | ranks | materialize, slowest rank | fastest rank "
        "| ratio to baseline | empty + uniform_ of the local shards | parameters per rank "
        "| peak memory growth, largest rank |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for width in args.widths:
        for mode, form, world in contenders:
            base = reports["baseline", form, 1][width]["seconds"]
            r = reports[mode, form, world][width]
            over = " (oversubscribed)" if world > cores else ""
            peak = (
                f"{r['peak'] / 2**20:.0f} MiB ({r['peak'] / r['full']:.2f}x the model)"
                if r["peak"] >= 0
                else "n/a"
            )
            print(
                f"| {r['full'] / 4 / 1e6:.1f}M | {mode} | {form} | {world}{over} "
                f"| {r['seconds']:.2f} s | {r['fastest']:.2f} s | {r['seconds'] / base:.2f}x "
                f"| {r['bound']:.2f} s | {r['bytes'] / 2**20:.0f} of {r['full'] / 2**20:.0f} MiB "
                f"(1/{r['full'] / r['bytes']:.2f}) | {peak} |"
            )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
