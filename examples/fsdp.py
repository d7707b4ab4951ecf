"""FSDP2 with lazynn: define lazily, build on meta, shard, then allocate each rank's shards.

    python examples/fsdp.py            # 2 processes on this machine (gloo, CPU)

The recipe, on every rank:

1. ``torch.manual_seed(0)``; construct the model with lazy layers (no sizes, no memory);
2. ``lazynn.build(model, example, device="meta")``: every size inferred, nothing allocated;
3. ``fully_shard(block)`` for each block, then ``fully_shard(model)``;
4. ``lazynn.materialize(model, "cpu")``: each rank allocates its own shards only, and the
   gathered parameters equal an eager model constructed under the same seed.

The script checks the last claim against an eager twin, trains a few steps, and prints what
each rank allocated.
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


class Residual(nn.Module):
    """x (N, d) -> x + body(x) (N, d)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def make(lazy: bool, width: int = 64, hidden: int = 256, depth: int = 4) -> nn.Module:
    """Residual MLP blocks and a 10-way head; lazy: every input size left to the build."""
    if lazy:
        blocks = [
            Residual(nn.Sequential(lazynn.LazyLayerNorm(), lazynn.LazyLinear(hidden), nn.GELU(),
                                   lazynn.LazyLinear(width)))
            for _ in range(depth)
        ]  # fmt: skip
        return nn.Sequential(*blocks, lazynn.LazyLinear(10))
    blocks = [
        Residual(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                               nn.Linear(hidden, width)))
        for _ in range(depth)
    ]  # fmt: skip
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def worker(rank: int, world: int, port: int, results: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        torch.manual_seed(0)
        model = make(lazy=True)
        lazynn.build(model, (8, 64), device="meta")
        for block in model[:-1]:
            fully_shard(block)
        fully_shard(model)
        lazynn.materialize(model, "cpu")
        mine = sum(p.to_local().numel() * p.element_size() for p in model.parameters())

        torch.manual_seed(0)
        eager = make(lazy=False)
        same = all(
            torch.equal(p.full_tensor(), q)
            for p, q in zip(model.parameters(), eager.parameters(), strict=True)
        )
        full = sum(q.numel() * q.element_size() for q in eager.parameters())

        data = torch.Generator().manual_seed(1)
        x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for _ in range(3):
            half = slice(rank * 8, rank * 8 + 8)
            loss = F.cross_entropy(model(x[half]), y[half])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        results.put({"rank": rank, "bytes": mine, "full": full, "same": same, "losses": losses})
    finally:
        dist.destroy_process_group()


def main(world: int = 2) -> list[dict[str, Any]]:
    """Run the recipe on ``world`` local processes; print and return each rank's report."""
    reports = run_local_ranks(worker, world)
    for r in reports:
        print(
            f"rank {r['rank']}: allocated {r['bytes'] / 2**10:.0f} KiB of "
            f"{r['full'] / 2**10:.0f} KiB; equals the eager twin: {r['same']}; "
            f"losses {', '.join(f'{v:.3f}' for v in r['losses'])}"
        )
    return reports


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
