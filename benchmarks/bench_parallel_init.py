"""Issue 27's benchmark: sharded and threaded materialize of a LLaMA, against serial eager.

Exact initialization drawn in parallel: a LLaMA-shaped model's ``materialize``, sharded per
rank or threaded, against serial eager construction of the same model.

    python benchmarks/bench_parallel_init.py [--dim 2048] [--layers 16] [--heads 16]
                                             [--vocab 32000] [--worlds 2,4,8]
                                             [--modes fsdp,tp] [--threads 1,2,4] [--quick]
                                             [--smt-probe] [--no-memory-guard]

The model is tests/real_models/llama.py's ``Llama`` (Meta's ``llama/model.py`` with
torchtitan's init: ``trunc_normal_(std=0.02)`` for the attention and feed-forward inputs, the
depth-scaled std ``0.02 / sqrt(2 * (layer + 1))`` for the output projections and ``w3``,
``normal_`` for the token embedding, ``trunc_normal_`` cut at 3 sigma for the head). The
defaults size it like a 1B LLaMA: dim 2048, 16 layers, 16 heads, vocabulary 32000, feed-forward
hidden 5472 (the file's ``2/3 * 4 * dim`` rounded to 16), 937.5M parameters, 3.5 GiB in
float32. ``--quick``: dim 512, 8 layers, vocabulary 8000, 2 ranks (33.5M parameters; under a
minute). The lazy model is built on meta in the factory form,
``lazynn.build(partial(Llama, LAZY, ...), Spec((1, 16), long), device="meta")``, whose tensors
carry the init programs of its own construction.

Contenders, each in fresh spawned processes with ``torch.set_num_threads(1)``; every process
first constructs or materializes a tiny model of the same code untimed (torch's one-time
imports and caches):

- ``eager``: ``torch.manual_seed(0)``, then ``Llama(EAGER, ...)`` with its sizes written in, on
  CPU, serially: the baseline every ratio is taken to. Its tensors and the generator's state
  after it are saved to a temporary file for the exactness check.
- ``unsharded``: ``lazynn.materialize(model, "cpu")`` of the whole model in one process.
- ``threads T``: ``lazynn.materialize(model, "cpu", threads=T)``, unsharded, in that same
  process.
- ``fsdp N``: N ranks (gloo on 127.0.0.1), ``fully_shard`` per transformer block and the root
  (every parameter ``Shard(0)``), then ``lazynn.materialize(model, "cpu")``.
- ``tp N``: N ranks, ``parallelize_module`` on a 1-D mesh of N with torchtitan's plan: the
  token embedding ``RowwiseParallel`` (its weight ``Shard(0)``), the norms
  ``SequenceParallel`` (replicated), the head ``ColwiseParallel``; in each block ``wq``,
  ``wk``, ``wv``, ``w1``, ``w3`` ``ColwiseParallel`` (``Shard(0)``), ``wo`` and ``w2``
  ``RowwiseParallel`` (``Shard(1)``: a column block, whose rows each rank draws whole: the
  gap between two rows' parts, a few thousand words, is far below what a jump costs).

Measured per rank (the model built and sharded outside the clock, the ranks started together
after a barrier, and held at one after ``materialize`` so that none checks while others work):
``time.process_time()`` and wall time of ``materialize``; the growth of the rank's peak resident
memory during it (Linux's ``VmHWM``, reset before it through ``/proc/self/clear_refs``); and
the counters of ``lazynn._program.stream.stats()`` (read before and after ``materialize``, the
difference taken): the CPU seconds and number of the generator's jumps, and the words
skipped (jumped, or drawn through by numpy). The jumps' seconds are reported apart, ``process_time -
jump_seconds`` is the drawing, and its ratio to the eager ``process_time`` is set against
the target ``1.3 / N``.

Exactness: after each run every rank compares its local shard of every tensor with the same
block of the eager model's (the file, loaded with ``mmap=True``; the block's offsets from
DTensor's ``__create_chunk_list__``), and its generator's state with the eager one's after
construction: ``exact: yes`` means every tensor bit for bit and the same state on every rank.

Memory: before each sharded run, the ranks' peak is estimated from the previous run of that
mode, a rank's growth scaled by 1/N (the unsharded run's peak for the first); a run whose
estimate exceeds 90% of ``MemAvailable`` is skipped and listed (``--no-memory-guard`` runs it
anyway).

Reading the numbers on a small machine: CPU time is the number to read, not wall time. The
project's machine has 2 vCPUs that are one core's two SMT siblings: two busy processes there
get much less than twice one's work done (``--smt-probe`` measures it: two processes filling
tensors against one, median of 3 alternations, 20 s; it is noisy whenever anything else runs,
0.99x to 2.3x in four runs on that machine). More ranks than vCPUs (4 or 8 on 2) take turns,
so their wall time says nothing about parallel speed; and ranks on a core's two siblings each
run slower per CPU second, so even a rank's ``process_time`` is inflated against the eager run,
which had the core to itself. Threads cannot speed anything up there either: their columns are
for a real multi-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import os
import platform
import queue
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import lazynn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the LLaMA port and its kits: tests/real_models/

from bench_sharded import _status, reset_peak  # noqa: E402  (the same measures of memory)

from lazynn._program.stream import stats  # noqa: E402
from real_models.kit import EAGER, LAZY, Kit  # noqa: E402
from real_models.llama import Llama  # noqa: E402

MODES = ("fsdp", "tp")
#: the model every process constructs or materializes first, untimed
TINY = {"vocab_size": 256, "dim": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 16}
EXAMPLE = lazynn.Spec((1, 16), torch.long)
#: the counters issue 27's stream reports (lazynn._program.stream.stats())
STATS = ("jump_seconds", "jumps", "skipped_words", "skip_seconds")


# --- the model ---------------------------------------------------------------------------------
def make(kit: Kit, sizes: dict[str, int]) -> nn.Module:
    return Llama(kit, **sizes)


def built(sizes: dict[str, int]) -> nn.Module:
    """The lazy model on meta, in the factory form, under seed 0."""
    torch.manual_seed(0)
    return lazynn.build(functools.partial(make, LAZY, sizes), EXAMPLE, device="meta")


def tp_plan(model: nn.Module) -> dict[str, Any]:
    """torchtitan's plan for a LLaMA: the token embedding row-wise (``Shard(0)`` of its
    vocabulary), the norms ``SequenceParallel`` (replicated weights), the head column-wise;
    in each block column-wise in (``Shard(0)``), row-wise out (``Shard(1)``)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):  # type: ignore[arg-type]
        for name in ("attention_norm", "ffn_norm"):
            plan[f"layers.{i}.{name}"] = SequenceParallel()
        for name in ("attention.wq", "attention.wk", "attention.wv"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("feed_forward.w1", "feed_forward.w3"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("attention.wo", "feed_forward.w2"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    return plan


def shard(model: nn.Module, mode: str, world: int) -> None:
    """Shard ``model`` (built on meta) in place for ``mode`` over ``world`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if mode == "fsdp":
        for block in model.layers:  # type: ignore[union-attr]
            fully_shard(block)
        fully_shard(model)
    elif mode == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, tp_plan(model))
    else:
        raise ValueError(f"unknown mode {mode!r}")


def count(sizes: dict[str, int]) -> int:
    """The model's parameters (constructed on meta)."""
    with torch.device("meta"):
        return sum(p.numel() for p in make(EAGER, sizes).parameters())


# --- measuring, inside a process ---------------------------------------------------------------
def stream_stats() -> dict[str, float]:
    """``lazynn._program.stream.stats()``: what skipping words has cost so far."""
    return dict(stats())


def timed(run: Callable[[], Any]) -> dict[str, Any]:
    """CPU seconds, wall seconds, peak memory growth and stream counters of ``run()``."""
    gc.collect()
    before = stream_stats()
    resident = reset_peak()
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = _status("VmHWM") - resident if resident >= 0 else -1
    after = stream_stats()
    stats = {k: after[k] - before[k] for k in STATS}
    return {"cpu": cpu, "wall": wall, "peak": peak, "resident": resident, "stats": stats}


def block(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """A tensor's local block and where it is in the full tensor (the whole of a plain one)."""
    if type(tensor).__name__ != "DTensor":
        return tensor, tuple(slice(0, n) for n in tensor.shape)
    # the protocol torch.distributed.checkpoint reads a shard's place with
    (chunk,) = tensor.__create_chunk_list__()  # type: ignore[attr-defined]
    where = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes, strict=True))
    return tensor.to_local(), where  # type: ignore[attr-defined]


def compare(model: nn.Module, path: str) -> tuple[bool, list[str]]:
    """Whether every local block of ``model``'s tensors and the generator's state equal the
    eager model's (saved at ``path``); the names that differ."""
    saved = torch.load(path, mmap=True, weights_only=True)
    eager: dict[str, torch.Tensor] = saved["tensors"]
    mine = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    mine["freqs_cis"] = model.freqs_cis  # (a plain attribute, as Meta's code keeps it)
    wrong = sorted(set(eager) ^ set(mine))
    for name in sorted(set(eager) & set(mine)):
        local, where = block(mine[name])
        theirs = eager[name][where]
        if local.shape != theirs.shape or not torch.equal(local.detach(), theirs):
            wrong.append(name)
    if not torch.equal(torch.get_rng_state(), saved["rng"]):
        wrong.append("(the generator's state)")
    return not wrong, wrong


# --- the contenders, each in its own processes -------------------------------------------------
def eager_worker(sizes: dict[str, int], path: str, out: Any) -> None:
    """Serial eager construction under seed 0; its tensors and generator state saved."""
    torch.set_num_threads(1)
    make(EAGER, TINY)
    torch.manual_seed(0)
    made: list[nn.Module] = []
    result = timed(lambda: made.append(make(EAGER, sizes)))
    result["stats"] = None  # (no stream: torch draws)
    model = made[0]
    tensors = {**model.state_dict(), "freqs_cis": model.freqs_cis}
    torch.save({"tensors": tensors, "rng": torch.get_rng_state()}, path)
    out.put(("eager", 1, 0, result, True, []))


def local_worker(sizes: dict[str, int], threads: Sequence[int], path: str, out: Any) -> None:
    """Unsharded ``materialize`` in one process, then with ``threads=T`` for each T."""
    torch.set_num_threads(1)
    lazynn.materialize(built(TINY), "cpu")
    for t in (None, *threads):
        model = built(sizes)
        kwargs = {} if t is None else {"threads": t}
        result = timed(lambda m=model, kw=kwargs: lazynn.materialize(m, "cpu", **kw))
        same, wrong = compare(model, path)
        out.put(("unsharded" if t is None else "threads", t or 1, 0, result, same, wrong))
        del model


def rank_worker(
    rank: int, world: int, port: int, mode: str, sizes: dict[str, int], path: str, out: Any
) -> None:
    """One rank: build, shard, materialize (timed, after a barrier), compare its blocks."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(hours=2),
    )
    try:
        tiny = built(TINY)
        shard(tiny, mode, world)
        lazynn.materialize(tiny, "cpu")
        del tiny
        model = built(sizes)
        shard(model, mode, world)
        gc.collect()  # (FSDP's hooks hold cycles: the tiny model goes outside the clock)
        dist.barrier()
        result = timed(lambda: lazynn.materialize(model, "cpu"))
        dist.barrier()  # no rank reads the file while another still draws
        same, wrong = compare(model, path)
        out.put((mode, world, rank, result, same, wrong))
    finally:
        dist.destroy_process_group()


def run(target: Callable[..., None], args: tuple[Any, ...], processes: int, reports: int) -> list:
    """Run ``target(*args, out)`` (``target(rank, *args, out)`` for more than one process) in
    fresh spawned processes; the ``reports`` tuples they put on ``out``."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if processes == 1:
        procs = [ctx.Process(target=target, args=(*args, out))]
    else:
        procs = [ctx.Process(target=target, args=(r, *args, out)) for r in range(processes)]
    for p in procs:
        p.start()
    results: list[tuple[Any, ...]] = []
    while len(results) < reports:
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"a process of {target.__name__}{args[:2]} failed") from None
    for p in procs:
        p.join(60)
    return results


def available() -> int:
    """The memory the kernel could give now (``MemAvailable``: free plus reclaimable), bytes."""
    with open("/proc/meminfo") as f:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(found.group(1)) * 1024 if found else 0


def top(result: dict[str, Any]) -> int:
    """A process's peak resident memory during the measured run (bytes; 0 if unknown)."""
    return max(result["resident"] + result["peak"], 0) if result["peak"] >= 0 else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spin(start: Any, seconds: float, out: Any) -> None:
    """Fill 4M floats with uniform_ for ``seconds`` (from when every process is ready); put the
    number of fills on ``out``."""
    torch.set_num_threads(1)
    x = torch.empty(1 << 22).uniform_()
    start.wait()
    fills, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        x.uniform_()
        fills += 1
    out.put(fills)


def _fills(processes: int, seconds: float) -> int:
    """The fills ``processes`` concurrent processes do in ``seconds``."""
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(processes)
    procs = [ctx.Process(target=_spin, args=(start, seconds, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    return total


def smt_probe(seconds: float = 1.0, repeats: int = 3) -> float:
    """The work two concurrent processes do against one alone in the same time: the median of
    ``repeats`` alternations (another process on the machine disturbs single runs)."""
    ratios = []
    for _ in range(repeats):
        alone = _fills(1, seconds)
        ratios.append(_fills(2, seconds) / alone)
    return statistics.median(ratios)


# --- reporting -------------------------------------------------------------------------------
def machine(probe: float | None) -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        found = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
    if found:
        cpu = found.group(1).strip()
    nproc = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    line = (
        f"Machine: {cpu} (/proc/cpuinfo), nproc {nproc}, {memory:.0f} GiB; Python "
        f"{platform.python_version()}, torch {torch.__version__}, Linux {platform.release()}."
    )
    if probe is not None:
        line += (
            f" Two concurrent processes did {probe:.2f}x the work of one alone (uniform_ fills"
            " on one thread each, median of 3)."
        )
    return line


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=None, help="default: dim // 128")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--worlds", type=ints, default=[2, 4, 8], help="numbers of ranks")
    parser.add_argument("--modes", default="fsdp,tp", help="comma-separated, of fsdp, tp")
    parser.add_argument(
        "--threads", type=ints, default=[1, 2, 4], help="materialize(threads=T), unsharded"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="dim 512, 8 layers, vocabulary 8000, 2 ranks (33.5M parameters; under a minute)",
    )
    parser.add_argument(
        "--smt-probe",
        action="store_true",
        help="measure the work two processes do against one (20 s; noisy on a shared machine)",
    )
    parser.add_argument(
        "--no-memory-guard",
        action="store_true",
        help="run every world, even where the ranks' expected peak exceeds the free memory",
    )
    parser.add_argument(
        "--tmp", default=None, help="folder of the eager model's saved tensors (default: $TMPDIR)"
    )
    args = parser.parse_args()
    if args.quick:
        args.dim, args.layers, args.vocab, args.worlds = 512, 8, 8000, [2]
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(set(modes) - set(MODES))}; choose from {MODES}")
    sizes = {
        "vocab_size": args.vocab,
        "dim": args.dim,
        "n_layers": args.layers,
        "n_heads": args.heads or max(1, args.dim // 128),
        "max_seq_len": 2048,
    }
    params = count(sizes)
    probe = smt_probe() if args.smt_probe else None
    print(machine(probe))
    print(
        f"Model: tests/real_models/llama.py's Llama, dim {sizes['dim']}, {sizes['n_layers']} "
        f"layers, {sizes['n_heads']} heads, vocabulary {sizes['vocab_size']}: "
        f"{params / 1e6:.1f}M parameters ({params * 4 / 2**30:.2f} GiB in float32). One thread "
        "per process.",
        flush=True,
    )
    rows: list[tuple[Any, ...]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as folder:
        path = os.path.join(folder, "eager.pt")
        threads = (sizes, tuple(args.threads), path)
        runs: list[tuple[str, Callable[..., None], tuple[Any, ...], int, int]] = [
            ("eager", eager_worker, (sizes, path), 1, 1),
            ("unsharded, threads", local_worker, threads, 1, 1 + len(args.threads)),
        ]
        for mode in modes:
            for world in args.worlds:
                ranks = (world, 0, mode, sizes, path)  # (the port: chosen just before the run)
                runs.append((f"{mode} x {world}", rank_worker, ranks, world, world))
        for name, target, targs, processes, reports in runs:
            if target is rank_worker:
                # a rank's growth falls as 1/N (it draws and holds only its shards): scaled
                # from this mode's last run, or the unsharded run's for the first
                mode, world = targs[2], targs[0]
                previous = [r for r in rows if r[0] == mode]
                if previous:
                    last = max(r[1] for r in previous)
                    per = max(
                        r[3]["resident"] + max(r[3]["peak"], 0) * last / world
                        for r in previous
                        if r[1] == last
                    )
                else:
                    per = max(top(r[3]) for r in rows if r[0] == "unsharded")
                need = int(world * per)
                if not args.no_memory_guard and need > 0.9 * available():
                    skipped.append(
                        f"{name}: skipped, {world} ranks x {need / world / 2**30:.1f} GiB (a "
                        f"rank's peak so far) > 90% of the {available() / 2**30:.1f} GiB "
                        "available (--no-memory-guard runs it)"
                    )
                    print(f"  {skipped[-1]}", flush=True)
                    continue
                targs = (targs[0], free_port(), *targs[2:])
            began = time.perf_counter()
            rows += run(target, targs, processes, reports)
            print(f"  ran {name} in {time.perf_counter() - began:.0f} s", flush=True)
    report(rows, probe, skipped, params * 4)


def report(
    rows: list[tuple[Any, ...]], probe: float | None, skipped: Sequence[str], model: int
) -> None:
    """Print the tables: per rank (with the eager and unsharded references), threads, exact."""
    eager = next(r[3] for r in rows if r[0] == "eager")
    base = eager["cpu"]
    cores = len(os.sched_getaffinity(0))
    print()
    print(
        f"Eager construction (serial, seed 0): {eager['cpu']:.2f} s CPU, {eager['wall']:.2f} s "
        f"wall, peak memory growth {eager['peak'] / 2**20:.0f} MiB. Ratios below: to its CPU "
        "seconds."
    )
    print()
    print(
        "| contender | ranks | rank | process_time | wall | jumps (count) "
        "| process_time - jumps | ratio to eager | target 1.3/N | words skipped "
        "| peak memory growth (x the model) | exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = {"eager": 0, "unsharded": 1, "fsdp": 2, "tp": 3}
    sharded = sorted((r for r in rows if r[0] in order), key=lambda r: (order[r[0]], r[1], r[2]))
    for mode, world, rank, result, same, _ in sharded:
        stats = result["stats"]
        jumps = drawn = ""
        net = result["cpu"]
        if stats is not None:
            net -= stats.get("jump_seconds", 0.0)
            jumps = f"{stats.get('jump_seconds', 0.0):.2f} s ({stats.get('jumps', 0):.0f})"
            drawn = f"{stats.get('skipped_words', 0) / 1e6:.0f}M"
        over = " (oversubscribed)" if world > cores else ""
        verdict = "(reference)" if mode == "eager" else "yes" if same else "no"
        target = f"{1.3 / world:.2f}x" if mode in MODES else ""
        met = (" (met)" if net / base <= 1.3 / world else " (not met)") if target else ""
        print(
            f"| {mode} | {world}{over} | {rank if mode in MODES else '-'} "
            f"| {result['cpu']:.2f} s | {result['wall']:.2f} s | {jumps} | {net:.2f} s "
            f"| {net / base:.2f}x{met} | {target} | {drawn} "
            f"| {result['peak'] / 2**20:.0f} MiB ({result['peak'] / model:.2f}x) | {verdict} |"
        )
    threads = sorted((r for r in rows if r[0] == "threads"), key=lambda r: r[1])
    if threads:
        one = next((r[3] for r in threads if r[1] == 1 and r[3] is not None), None)
        print()
        measured = "" if probe is None else f"; two processes did {probe:.2f}x one's work"
        print(f"Threads (unsharded, one process), on {cores} vCPUs{measured}.", end="")
        if cores <= 2:
            print(
                " The project's 2-vCPU VM is one core's two SMT siblings: no speed-up from "
                "threads is expected there.",
                end="",
            )
        print()
        print()
        print(
            "| threads | process_time | wall | ratio to T=1 (CPU, wall) "
            "| ratio to eager (CPU, wall) | exact |"
        )
        print("|---|---|---|---|---|---|")
        for _, t, _, result, same, _ in threads:
            if result is None:
                print(f"| {t} | n/a | n/a | n/a | n/a | n/a |")
                continue
            to_one = (
                f"{result['cpu'] / one['cpu']:.2f}x, {result['wall'] / one['wall']:.2f}x"
                if one is not None
                else "n/a"
            )
            print(
                f"| {t} | {result['cpu']:.2f} s | {result['wall']:.2f} s | {to_one} "
                f"| {result['cpu'] / base:.2f}x, {result['wall'] / eager['wall']:.2f}x "
                f"| {'yes' if same else 'no'} |"
            )
    print()
    contenders: dict[str, list[tuple[bool, list[str]]]] = {}
    for mode, world, _, result, same, wrong in rows:
        if mode != "eager" and result is not None:
            name = f"{mode} x {world}" if mode != "unsharded" else mode
            contenders.setdefault(name, []).append((same, wrong))
    for name, checks in contenders.items():
        wrong = sorted({w for _, ws in checks for w in ws})
        verdict = "yes" if all(s for s, _ in checks) else f"no ({', '.join(wrong[:5])})"
        print(f"exact: {verdict}: {name}")
    for line in skipped:
        print(f"not run: {line}")
    if stream_stats() is None:
        print()
        print(
            "(lazynn._program.stream.stats() does not exist yet: no jump columns; every rank "
            "draws the whole random stream.)"
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
