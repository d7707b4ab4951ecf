"""Tensor parallel and 2-D (FSDP2 x TP) materialization, with the numbers of the unsharded model.

The recipe (examples/tp_2d.py): ``lazynn.build(model, example, device="meta")``, then
``parallelize_module`` with torchtitan's plan (``ColwiseParallel``: ``Shard(0)`` weights,
``RowwiseParallel``: ``Shard(1)`` weights and ``Replicate()`` biases, ``SequenceParallel``
norms: ``Replicate()``), on a 2-D mesh then ``fully_shard`` across (``_StridedShard`` over
``Shard``), then ``lazynn.materialize(model, "cpu")``. Each rank allocates its own block of
each parameter only; the gathered parameters equal the eager twin's bit for bit, the random
stream ends where eager construction leaves it, and training steps equal a single-process run
of the eager twin (up to the order of the all-reduce sums).

2 ranks for TP, 4 for the (2, 2) mesh, gloo on 127.0.0.1, spawned and bounded in time by
``distributed_util``. The CUDA test (DTensor's own RNG) skips on a machine without 2 GPUs.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import lazynn
from allocations import CHUNK_BYTES, Allocations
from distributed_util import Report, pack, run_ranks, unpack
from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
from tp_2d import DIM, SEQ, Net, batch, tp_plan

pytestmark = pytest.mark.distributed

STEPS, LR = 3, 0.1
RTOL, ATOL = 1e-5, 1e-6  # all-reduce sums in another order than one process


def _worker(rank: int, world: int, dims: tuple[int, ...], factory: bool = False) -> Report:
    """Build on meta, parallelize (TP on the last mesh dim, FSDP2 on the first if 2-D),
    materialize; report the gathered parameters, each local block, and a few training steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    names = ("dp", "tp") if len(dims) == 2 else ("tp",)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
    torch.manual_seed(0)
    if factory:  # the model's construction recorded: each tensor's init program
        model = lazynn.build(functools.partial(Net, lazy=True), (2, SEQ, DIM), device="meta")
    else:
        model = Net(lazy=True)
        lazynn.build(model, (2, SEQ, DIM), device="meta")
    parallelize_module(model, mesh["tp"], tp_plan(model))
    if len(dims) == 2:
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    report: Report = {
        "placements": {n: [repr(p) for p in t.placements] for n, t in model.named_parameters()},
        "on_meta": all(t.to_local().is_meta for t in model.parameters()),
    }
    with Allocations() as allocated:
        lazynn.materialize(model, "cpu")
    report["peak"] = allocated.peak
    report["next_draw"] = pack(torch.rand(4))
    report["local"] = {
        n: (list(t.to_local().shape), [int(o) for o in t.__create_chunk_list__()[0].offsets])
        for n, t in model.named_parameters()
    }
    report["blocks"] = {n: pack(t.to_local()) for n, t in model.named_parameters()}
    report["materialized"] = {n: pack(t.full_tensor()) for n, t in model.named_parameters()}
    x, y = batch()
    dp = mesh["dp"].get_local_rank() if len(dims) == 2 else 0
    tp = mesh["tp"].get_local_rank()
    per = x.shape[0] // (dims[0] if len(dims) == 2 else 1)
    rows, seq = (
        slice(dp * per, (dp + 1) * per),
        slice(tp * SEQ // dims[-1], (tp + 1) * SEQ // dims[-1]),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(model(x[rows, seq]).to_local(), y[rows])  # FSDP2 averages over DP ranks
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    report["losses"] = losses
    report["trained"] = {n: pack(t.full_tensor()) for n, t in model.named_parameters()}
    return report


def _eager() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    eager = Net(lazy=False)
    return eager, torch.rand(4)


def _single_process_run(eager: Any) -> list[float]:
    x, y = batch()
    optimizer = torch.optim.SGD(eager.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(eager(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _check(
    ranks: list[Report], expected_placements: dict[str, list[str]], dims: tuple[int, ...]
) -> None:
    eager, next_draw = _eager()
    full = dict(eager.named_parameters())
    for r in ranks:
        who = f"rank {r['rank']}"
        assert r["on_meta"], f"{who}: parallelize_module allocated before materialize"
        for name, placements in expected_placements.items():
            assert r["placements"][name] == placements, (who, name, r["placements"][name])
        for name, packed in r["materialized"].items():
            assert torch.equal(unpack(packed), full[name].detach()), f"{who}: {name}"
        assert torch.equal(unpack(r["next_draw"]), next_draw), (
            f"{who}: the random stream after materialize is not where eager construction leaves it"
        )
        # each rank holds its own block only, and it is that block of the eager parameter
        for name, (shape, _) in r["local"].items():
            split = math.prod(
                n for n, p in zip(dims, r["placements"][name], strict=True) if p != "Replicate()"
            )
            assert math.prod(shape) <= math.ceil(full[name].numel() / split), (who, name, shape)
        mine = sum(math.prod(shape) for shape, _ in r["local"].values())
        assert mine < sum(p.numel() for p in full.values()) / (len(dims) + 0.5), (who, mine)
        # and materialize held no more than its blocks at once (the draws of this small model
        # fit in one chunk: see test_distributed.py for a model larger than one)
        largest = max(p.numel() for p in full.values()) * 4
        assert r["peak"] <= mine * 4 + min(CHUNK_BYTES, largest), (who, r["peak"], mine * 4)
        for name, (shape, offset) in r["local"].items():
            index = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
            assert torch.equal(unpack(r["blocks"][name]), full[name].detach()[index]), (who, name)
    losses = _single_process_run(eager)
    trained = dict(eager.named_parameters())
    for r in ranks:
        mean = sum(q["losses"][-1] for q in ranks) / len(ranks)
        assert math.isclose(mean, losses[-1], rel_tol=RTOL), (mean, losses)
        for name, packed in r["trained"].items():
            torch.testing.assert_close(unpack(packed), trained[name].detach(), rtol=RTOL, atol=ATOL)


_TP_PLACEMENTS = {
    "blocks.0.attention_norm.weight": ["Replicate()"],
    "blocks.0.attention.wq.weight": ["Shard(dim=0)"],
    "blocks.0.attention.wo.weight": ["Shard(dim=1)"],
    "head.up.bias": ["Shard(dim=0)"],
    "head.down.weight": ["Shard(dim=1)"],
    "head.down.bias": ["Replicate()"],
}


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_tensor_parallel_materializes_the_eager_numbers_and_trains_as_one_process(
    form: str,
) -> None:
    ranks = run_ranks(_worker, (2,), form == "factory", world=2, timeout=150)
    _check(ranks, _TP_PLACEMENTS, (2,))


@pytest.mark.slow
def test_2d_fsdp2_across_tp_inside_materializes_the_eager_numbers() -> None:
    ranks = run_ranks(_worker, (2, 2), world=4, timeout=240)
    placements = {
        "blocks.0.attention.wq.weight": ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"],
        "blocks.0.attention.wo.weight": ["Shard(dim=0)", "Shard(dim=1)"],
        "blocks.0.attention_norm.weight": ["Shard(dim=0)", "Replicate()"],
    }
    _check(ranks, placements, (2, 2))


def _cuda_worker(rank: int, world: int) -> Report:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Net(lazy=True)
    lazynn.build(model, (2, SEQ, DIM), device="meta")
    parallelize_module(model, mesh["tp"], tp_plan(model))
    lazynn.materialize(model, "cuda")
    return {
        "devices": sorted({str(t.to_local().device.type) for t in model.parameters()}),
        "full": {n: pack(t.full_tensor()) for n, t in model.named_parameters()},
    }


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs 2 CUDA devices: on CUDA, DTensor's own offset-based RNG draws the shards",
)
def test_on_cuda_dtensor_rng_draws_consistent_shards() -> None:
    """On CUDA lazynn leaves random fills to DTensor's RNG (offset-based Philox): every rank's
    shards belong to one tensor, the same on every rank, but not the CPU stream's numbers,
    nor (in general) a single-GPU eager model's (docs/when-to-build.md)."""
    ranks = run_ranks(_cuda_worker, world=2, timeout=150)
    assert all(r["devices"] == ["cuda"] for r in ranks)
    for name in ranks[0]["full"]:
        assert torch.equal(unpack(ranks[0]["full"][name]), unpack(ranks[1]["full"][name])), name


def _edges_worker(rank: int, world: int) -> Report:
    """Uneven shards (a rank holding an empty block, under FSDP2 too), and initializers that
    cannot be reproduced on shards: refused, naming the module, the model left on meta."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    report: Report = {}
    torch.manual_seed(0)
    uneven = lazynn.build(
        nn.Sequential(lazynn.LazyLinear(1), lazynn.LazyLinear(5), lazynn.LazyLinear(3)),
        (2, 3),
        device="meta",
    )
    plan = {"0": ColwiseParallel(), "1": RowwiseParallel(), "2": ColwiseParallel()}
    parallelize_module(uneven, mesh["tp"], plan)
    fully_shard(uneven, mesh=mesh["dp"])
    lazynn.materialize(uneven, "cpu")
    # (each rank's block against the eager parameter: torch's full_tensor() of an uneven
    # _StridedShard hangs in gloo)
    report["uneven"] = {
        n: (pack(t.to_local()), [int(o) for o in t.__create_chunk_list__()[0].offsets])
        for n, t in uneven.named_parameters()
    }
    report["uneven_local"] = {n: list(t.to_local().shape) for n, t in uneven.named_parameters()}
    report["next_draw"] = pack(torch.rand(4))

    def padded() -> nn.Module:
        return nn.Sequential(nn.Embedding(10, 6, padding_idx=3, device="meta"))

    class Randn(nn.Linear):
        def reset_parameters(self) -> None:
            with torch.no_grad():
                self.weight.copy_(torch.randn_like(self.weight))

    class Eye(nn.Linear):
        def reset_parameters(self) -> None:
            nn.init.eye_(self.weight)

    cases = {
        "padding_idx": (padded, {"0": RowwiseParallel()}),
        "randn_like": (lambda: nn.Sequential(Randn(4, 6, device="meta")), {"0": RowwiseParallel()}),
        "eye_": (lambda: nn.Sequential(Eye(4, 6, device="meta")), {"0": ColwiseParallel()}),
    }
    for name, (factory, tp) in cases.items():
        model = factory()
        parallelize_module(model, mesh["tp"], tp)
        state = torch.get_rng_state()
        try:
            lazynn.materialize(model, "cpu")
            report[name] = "materialized"
        except lazynn.LazynnError as error:
            report[name] = str(error)
        report[name + "_meta"] = all(t.to_local().is_meta for t in model.parameters())
        report[name + "_rng"] = torch.equal(torch.get_rng_state(), state)
    return report


def test_uneven_shards_and_initializers_that_shards_cannot_reproduce() -> None:
    from torch import nn

    ranks = run_ranks(_edges_worker, world=2, timeout=150)
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 1), nn.Linear(1, 5), nn.Linear(5, 3))
    next_draw = torch.rand(4)
    for r in ranks:
        for name, p in eager.named_parameters():
            packed, offset = r["uneven"][name]
            if 0 in packed[0]:
                continue  # an empty block: nothing to compare (its stream was drawn: next_draw)
            block = unpack(packed)
            index = tuple(slice(o, o + n) for o, n in zip(offset, block.shape, strict=True))
            assert torch.equal(block, p.detach()[index]), (r["rank"], name)
        assert torch.equal(unpack(r["next_draw"]), next_draw)
        assert r["uneven_local"]["0.weight"] == [1 - r["rank"], 3]  # rank 1: an empty block
        for name, why in (
            ("padding_idx", "into part of a sharded tensor"),
            ("randn_like", "a random op (randn_like)"),
            ("eye_", "with out= (eye)"),
        ):
            assert why in r[name], (r["rank"], name, r[name])
            assert "lazynn.materialize at '0'" in r[name]
            assert r[name + "_meta"], (r["rank"], name)
            assert r[name + "_rng"], (r["rank"], name)
