"""Tensor parallel inside, FSDP2 across: a lazy transformer block on a (2, 2) device mesh.

    python examples/tp_2d.py           # 4 processes on this machine (gloo, CPU)

The recipe, on every rank (torchtitan's, with lazy layers):

1. ``torch.manual_seed(0)``; construct the model with lazy layers (no sizes, no memory);
2. ``lazynn.build(model, example, device="meta")``: every size inferred, nothing allocated;
3. ``parallelize_module(model, mesh["tp"], tp_plan())``: attention and feed-forward weights
   split across the TP ranks (``ColwiseParallel``: ``Shard(0)``, ``RowwiseParallel``:
   ``Shard(1)``), the norms run on sequence shards (``SequenceParallel``);
4. ``fully_shard(model, mesh=mesh["dp"])``: each TP shard split again across the DP ranks;
5. ``lazynn.materialize(model, "cpu")``: each rank allocates its own block of each
   parameter only, and the gathered parameters equal an eager model constructed under the
   same seed, bit for bit.

The script checks the last claim against an eager twin, trains a few steps against a
single-process run of the eager twin, and prints what each rank allocated.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from local_ranks import run_local_ranks
from torch import nn

import lazynn

DIM, HEADS, SEQ = 32, 4, 8


def _linear(lazy: bool, i: int, o: int, bias: bool = False) -> nn.Module:
    return lazynn.LazyLinear(o, bias=bias) if lazy else nn.Linear(i, o, bias=bias)


def _norm(lazy: bool) -> nn.Module:
    return lazynn.LazyLayerNorm() if lazy else nn.LayerNorm(DIM)


class Attention(nn.Module):
    """Causal self-attention, (N, T, DIM) -> (N, T, DIM); heads inferred from the local width
    (``view(n, t, -1, head_dim)``), so a TP rank runs its own heads."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (_linear(lazy, DIM, DIM) for _ in range(3))
        self.wo = _linear(lazy, DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        q, k, v = (
            w(x).view(n, t, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(n, t, -1))  # type: ignore[no-any-return]


class FeedForward(nn.Module):
    """SwiGLU, (N, T, DIM) -> (N, T, DIM)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.w1, self.w3 = _linear(lazy, DIM, 4 * DIM), _linear(lazy, DIM, 4 * DIM)
        self.w2 = _linear(lazy, 4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # type: ignore[no-any-return]


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.attention_norm = _norm(lazy)
        self.attention = Attention(lazy)
        self.ffn_norm = _norm(lazy)
        self.feed_forward = FeedForward(lazy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))  # type: ignore[no-any-return]


class MLP(nn.Module):
    """A head with biases: (N, T, DIM) -> (N, T, 10)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.up = _linear(lazy, DIM, 2 * DIM, bias=True)
        self.down = _linear(lazy, 2 * DIM, 10, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))  # type: ignore[no-any-return]


class Net(nn.Module):
    """Two blocks and the head: (N, SEQ, DIM) -> (N, SEQ, 10)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(lazy) for _ in range(2))
        self.head = MLP(lazy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


def tp_plan(model: Net) -> dict[str, Any]:
    """torchtitan's plan: sequence-parallel norms, column- then row-wise linears; the blocks
    take and give sequence shards (``Shard(1)``), the head gathers them and gives the whole
    output to every TP rank."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {}
    for i in range(len(model.blocks)):
        b = f"blocks.{i}"
        plan |= {
            f"{b}.attention_norm": SequenceParallel(),
            f"{b}.attention": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            f"{b}.attention.wq": ColwiseParallel(),
            f"{b}.attention.wk": ColwiseParallel(),
            f"{b}.attention.wv": ColwiseParallel(),
            f"{b}.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            f"{b}.ffn_norm": SequenceParallel(),
            f"{b}.feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            f"{b}.feed_forward.w1": ColwiseParallel(),
            f"{b}.feed_forward.w3": ColwiseParallel(),
            f"{b}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }
    plan["head.up"] = ColwiseParallel(input_layouts=Shard(1))
    # The output: Replicate, the whole (N, SEQ, 10), kept a DTensor (use_local_output=False).
    # It is the model's output, returned through FSDP2's root: a local tensor there would be
    # DTensor.to_local()'s view, on which FSDP2 warns that an in-place op would skip its
    # pre-backward hook. The training loop takes the local tensor, outside the model.
    plan["head.down"] = RowwiseParallel(use_local_output=False)
    return plan


def batch(size: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch: inputs (size, SEQ, DIM) and regression targets (size, SEQ, 10)."""
    data = torch.Generator().manual_seed(seed)
    return torch.randn(size, SEQ, DIM, generator=data), torch.randn(size, SEQ, 10, generator=data)


def gathered(p: Any) -> torch.Tensor:
    """The whole parameter ``p`` (a DTensor on the (dp, tp) mesh), on every rank: gathered
    across DP first (what FSDP2's own unshard gathers), then across TP. (``p.full_tensor()``
    gathers them in the other order, which DTensor cannot merge into one collective, and
    logs that the two all_gathers are suboptimal.)"""
    from torch.distributed.tensor import Replicate

    tp_block = p.redistribute(placements=[Replicate(), *p.placements[1:]])
    return tp_block.full_tensor()  # type: ignore[no-any-return]


def worker(rank: int, world: int, port: int, results: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = Net(lazy=True)
        lazynn.build(model, (2, SEQ, DIM), device="meta")
        parallelize_module(model, mesh["tp"], tp_plan(model))
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        lazynn.materialize(model, "cpu")
        mine = sum(p.to_local().numel() * p.element_size() for p in model.parameters())

        torch.manual_seed(0)
        eager = Net(lazy=False)
        same = all(
            torch.equal(gathered(p), q)
            for p, q in zip(model.parameters(), eager.parameters(), strict=True)
        )
        full = sum(q.numel() * q.element_size() for q in eager.parameters())

        x, y = batch()
        dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
        rows = slice(dp * 4, dp * 4 + 4)  # this DP rank's half of the batch
        seq = slice(tp * SEQ // 2, (tp + 1) * SEQ // 2)  # this TP rank's half of the sequence
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reference = torch.optim.SGD(eager.parameters(), lr=0.1)
        losses, single = [], []
        for _ in range(3):
            out = model(x[rows, seq]).to_local()  # the whole output (a DTensor, Replicate)
            loss = F.mse_loss(out, y[rows])  # FSDP2 averages over DP ranks
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
            one = F.mse_loss(eager(x), y)  # the single-process run, on the whole batch
            reference.zero_grad()
            one.backward()
            reference.step()
            single.append(one.item())
        drift = max(
            (gathered(p) - q).abs().max().item()
            for p, q in zip(model.parameters(), eager.parameters(), strict=True)
        )
        results.put(
            {
                "rank": rank,
                "bytes": mine,
                "full": full,
                "same": same,
                "losses": losses,
                "single": single,
                "drift": drift,
            }
        )
    finally:
        dist.destroy_process_group()


def main(world: int = 4) -> list[dict[str, Any]]:
    """Run the recipe on ``world`` local processes; print and return each rank's report."""
    reports = run_local_ranks(worker, world)
    for r in reports:
        print(
            f"rank {r['rank']}: allocated {r['bytes'] / 2**10:.1f} KiB of "
            f"{r['full'] / 2**10:.1f} KiB; equals the eager twin: {r['same']}; losses "
            f"{', '.join(f'{v:.4f}' for v in r['losses'])} (one process: "
            f"{', '.join(f'{v:.4f}' for v in r['single'])}); largest drift after training "
            f"{r['drift']:.1e}"
        )
    return reports


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
