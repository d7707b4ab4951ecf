"""FSDP2 materialize: what drawing each shard's numbers from the whole stream costs.

    python benchmarks/bench_sharded.py [--width 2048] [--depth 8]

A stack of MLP blocks (about 8 * 2 * 4 * width**2 parameters) is built on meta; then
- baseline: ``lazynn.materialize`` in one process (each tensor allocated and initialized
  once, whole);
- sharded: 2 processes (gloo, CPU), ``fully_shard`` per block and the root, then
  ``lazynn.materialize``: each rank allocates half, but draws every number (to keep its slice
  of the eager model's values).
Reports each as seconds and as a ratio to the baseline, and each rank's parameter bytes.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import lazynn


def make(width: int, depth: int) -> nn.Module:
    blocks = [
        nn.Sequential(lazynn.LazyLinear(4 * width), nn.GELU(), lazynn.LazyLinear(width))
        for _ in range(depth)
    ]
    return nn.Sequential(*blocks)


def baseline(width: int, depth: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.manual_seed(0)
        model = lazynn.build(make(width, depth), (2, width), device="meta")
        start = time.perf_counter()
        lazynn.materialize(model, "cpu")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(rank: int, port: int, width: int, depth: int, repeats: int, out: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    times, nbytes = [], 0
    for _ in range(repeats):
        torch.manual_seed(0)
        model = lazynn.build(make(width, depth), (2, width), device="meta")
        for block in model:
            fully_shard(block)
        fully_shard(model)
        dist.barrier()
        start = time.perf_counter()
        lazynn.materialize(model, "cpu")
        times.append(time.perf_counter() - start)
        nbytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    out.put((rank, statistics.median(times), nbytes))
    dist.destroy_process_group()


def sharded(width: int, depth: int, repeats: int) -> list[tuple[int, float, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, width, depth, repeats, out))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    results = []
    while len(results) < 2:
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError("a rank failed") from None
    for p in procs:
        p.join()
    return sorted(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # each rank gets one of the 2 cores: compare like with like
    total = sum(p.numel() for p in make(args.width, args.depth).parameters()
                if not lazynn.is_lazy(p))  # fmt: skip
    base = baseline(args.width, args.depth, args.repeats)
    model = lazynn.build(make(args.width, args.depth), (2, args.width), device="meta")
    total = sum(p.numel() for p in model.parameters())
    print(f"{total / 1e6:.1f}M parameters, {total * 4 / 2**20:.0f} MiB; one thread per process")
    print(f"baseline (1 process, unsharded): {base:.2f} s")
    for rank, seconds, nbytes in sharded(args.width, args.depth, args.repeats):
        print(f"rank {rank} (sharded over 2): {seconds:.2f} s = {seconds / base:.2f}x, "
              f"{nbytes / 2**20:.0f} MiB of parameters")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
