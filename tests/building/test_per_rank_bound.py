"""The per-rank bound (issue 37): a rank materializing a sharded model allocates what it keeps
(its shards, and whole what it does not shard: buffers) and at most one chunk of
``lazynn._program.draws.CHUNK`` numbers more, on a torchtitan-sized LLaMA: an output layer of
31 MiB drawn by ``trunc_normal_`` cut at 3 sigma (rounds of redraws), and a rope cache of 8 MiB
computed in ``__init__`` (``torch.polar`` of ``torch.outer(torch.arange(...), freqs)``).

Measured per rank by the dispatch-level meter (``tests/allocations.py``), under FSDP2
(``fully_shard`` per block and the root, as torchtitan) and torchtitan's tensor-parallel plan,
2 ranks, gloo, spawned and bounded in time by ``distributed_util``; and in one process,
unsharded. Every rank's blocks, the buffer and the generator's end are the eager model's.
Before issue 37 a rank held 35 MiB more than it kept (the rounds' temporaries of its block,
the rope cache's intermediates): docs/benchmarks.md, "The per-rank bound".
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from allocations import CHUNK_BYTES, Allocations
from distributed_util import Report, pack, run_sections, section, unpack

#: torchtitan-sized: the output layer and the embedding 32000 x 256 (31.25 MiB each), a rope
#: cache of 32768 positions x 32 frequencies (complex64: 8 MiB)
SIZES = {"vocab": 32000, "dim": 256, "layers": 2, "heads": 4, "seq": 16384, "hidden": 688}


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """torchtitan's llama3 (Meta's ``precompute_freqs_cis``)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, layer: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.init_std = 0.02 / (2 * (layer + 1)) ** 0.5  # torchtitan's depth init

    def init_weights(self) -> None:
        for linear in (self.wq, self.wk, self.wv, self.w1):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        for linear in (self.wo, self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=self.init_std)


class Titan(nn.Module):
    """torchtitan's llama3 ``Transformer``: the rope cache a persistent buffer, computed in
    ``__init__`` and again by ``init_weights`` (torchtitan's order)."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, hidden: int):
        super().__init__()
        self.rope = (dim // heads, seq * 2)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(*self.rope), persistent=True)
        self.layers = nn.ModuleList(Block(dim, hidden, i) for i in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def init_weights(self) -> None:
        self.freqs_cis = precompute_freqs_cis(*self.rope)
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            layer.init_weights()  # type: ignore[operator]
        std = self.output.in_features**-0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


def titan(**sizes: int) -> Titan:
    """The factory a trainer calls: construct, then torchtitan's ``init_weights``."""
    model = Titan(**sizes)
    model.init_weights()
    return model


def _tp_plan(model: Titan) -> dict[str, Any]:
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
    for i in range(len(model.layers)):
        for name in ("attention_norm", "ffn_norm"):
            plan[f"layers.{i}.{name}"] = SequenceParallel()
        for name in ("wq", "wk", "wv", "w1", "w3"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("wo", "w2"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    return plan


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "_local_tensor", tensor)


def _kept(model: nn.Module) -> int:
    """The bytes this rank keeps: each storage its tensors' local parts hold, once."""
    storages = {}
    for tensor in (*model.parameters(), *model.buffers()):
        storage = _local(tensor).untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _materialize(model: nn.Module) -> Report:
    with Allocations() as allocated:
        lazynn.materialize(model, "cpu")
    report: Report = {"peak": allocated.peak, "kept": _kept(model)}
    report["largest"] = (allocated.largest, allocated.largest_op)
    blocks = {}
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        local = _local(tensor)
        if local is tensor:
            offset = [0] * tensor.dim()
        else:  # the protocol torch.distributed.checkpoint reads a shard's place with
            (chunk,) = tensor.__create_chunk_list__()  # type: ignore[attr-defined]
            offset = [int(o) for o in chunk.offsets]
        blocks[name] = (pack(local), offset)
    report["blocks"] = blocks
    report["next_draw"] = pack(torch.rand(4))
    return report


def _fsdp_worker(rank: int, world: int) -> Report:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = lazynn.build(functools.partial(titan, **SIZES), device="meta")
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return _materialize(model)


def _tp_worker(rank: int, world: int) -> Report:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = lazynn.build(functools.partial(titan, **SIZES), device="meta")
    parallelize_module(model, mesh, _tp_plan(model))
    return _materialize(model)


@pytest.fixture(scope="module")
def eager() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = titan(**SIZES)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    return {n: t.detach() for n, t in tensors.items()}, torch.rand(4)


def _check(report: Report, eager: tuple[dict[str, torch.Tensor], torch.Tensor], who: str) -> None:
    tensors, next_draw = eager
    assert set(report["blocks"]) == set(tensors), who
    for name, (packed, offset) in report["blocks"].items():
        block = unpack(packed)
        index = tuple(slice(o, o + n) for o, n in zip(offset, block.shape, strict=True))
        assert torch.equal(block, tensors[name][index]), f"{who}: {name}"
    assert torch.equal(unpack(report["next_draw"]), next_draw), f"{who}: the generator's end"
    output = tensors["output.weight"]
    assert output.nbytes > 30 << 20  # (tens of MiB: 31.25)
    # what the rank keeps, and at most one chunk of numbers more at once
    excess = report["peak"] - report["kept"]
    assert excess <= CHUNK_BYTES, f"{who}: {excess / 2**20:.2f} MiB over what it keeps"


@pytest.mark.distributed
def test_each_rank_holds_what_it_keeps_and_one_chunk_with_the_eager_numbers(
    eager: tuple[dict[str, torch.Tensor], torch.Tensor],
) -> None:
    ranks = run_sections(_fsdp_worker, _tp_worker, world=2, timeout=300)
    for worker, mode in ((_fsdp_worker, "fsdp2"), (_tp_worker, "tp")):
        reports = section(ranks, worker)
        for r in reports:
            _check(r, eager, f"{mode} rank {r['rank']}")
            total = sum(t.numel() * t.element_size() for t in eager[0].values())
            assert r["kept"] < 0.7 * total, (mode, r["kept"], total)  # (it is sharded)


def test_one_process_holds_the_model_and_one_chunk(
    eager: tuple[dict[str, torch.Tensor], torch.Tensor],
) -> None:
    """Unsharded, in this process: the rounds of the whole output layer in parts, the rope
    cache in bands."""
    torch.manual_seed(0)
    model = lazynn.build(functools.partial(titan, **SIZES), device="meta")
    _check(_materialize(model), eager, "one process")
    assert _kept(model) == sum(t.nbytes for t in eager[0].values())
