"""Drawing a slice of a random fill chunk by chunk equals the slice of a whole draw.

This is what lets lazynn.materialize initialize FSDP2 shards with the numbers of an
unsharded model (src/lazynn/_program/draws.py). It depends on how torch's CPU kernels draw
(uniform_: one number per element; normal_: blocks of 16), so it is checked against torch
for many sizes, chunkings, slices and dtypes: a kernel change fails here first.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from lazynn._program.draws import draw_region, draw_slice

FILLS = {
    "uniform": (torch.Tensor.uniform_, (-0.5, 0.25)),
    "normal": (torch.Tensor.normal_, (0.1, 0.02)),
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, int]:
    rows = draw(st.integers(1, 40))
    row = draw(st.sampled_from([1, 3, 7, 16, 17, 33]))
    start = draw(st.integers(0, rows - 1))
    count = draw(st.integers(0, rows - start))
    chunk = draw(st.sampled_from([16, 32, 48, 160, 1 << 20]))
    return (rows, row), start, count, chunk


@settings(max_examples=150, deadline=None)
@given(
    case=cases(),
    fill=st.sampled_from(sorted(FILLS)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_a_slice_drawn_in_chunks_equals_the_slice_of_a_whole_draw(
    case: tuple[tuple[int, ...], int, int, int], fill: str, dtype: torch.dtype, seed: int
) -> None:
    shape, start, count, chunk = case
    op, args = FILLS[fill]
    torch.manual_seed(seed)
    whole = op(torch.empty(shape, dtype=dtype), *args)
    after_whole = torch.get_rng_state()
    torch.manual_seed(seed)
    part = torch.full((count, shape[1]), float("nan"), dtype=dtype)
    draw_slice(part, op, shape, start * shape[1], args, {}, chunk=chunk)
    assert torch.equal(part, whole[start : start + count])
    # and the generator ends where the whole draw leaves it: later layers draw the same
    assert torch.equal(torch.get_rng_state(), after_whole)


@st.composite
def blocks(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """A full shape (1 to 3 dims), a block in it (offset, shape) and a chunk size."""
    full = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=3)))
    offset = tuple(draw(st.integers(0, n - 1)) for n in full)
    shape = tuple(draw(st.integers(0, n - o)) for n, o in zip(full, offset, strict=True))
    chunk = draw(st.sampled_from([16, 32, 48, 160, 1 << 20]))
    return full, offset, shape, chunk


@settings(max_examples=200, deadline=None)
@given(
    case=blocks(),
    fill=st.sampled_from(sorted(FILLS)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_a_block_drawn_in_chunks_equals_the_block_of_a_whole_draw(
    case: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int],
    fill: str,
    dtype: torch.dtype,
    seed: int,
) -> None:
    """Any shard's block (a Shard(1) column block, a 2-D shard, an empty one) is the block of
    the whole draw, and the generator ends where the whole draw leaves it."""
    full, offset, shape, chunk = case
    op, args = FILLS[fill]
    torch.manual_seed(seed)
    whole = op(torch.empty(full, dtype=dtype), *args)
    after_whole = torch.get_rng_state()
    torch.manual_seed(seed)
    block = torch.full(shape, float("nan"), dtype=dtype)
    draw_region(block, op, full, offset, args, {}, chunk=chunk)
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
    assert torch.equal(block, whole[index])
    assert torch.equal(torch.get_rng_state(), after_whole)


def test_an_explicit_generator_is_used() -> None:
    gen = torch.Generator().manual_seed(3)
    whole = torch.empty(50).uniform_(generator=gen)
    gen.manual_seed(3)
    part = torch.empty(20)
    draw_slice(part, torch.Tensor.uniform_, (50,), 30, (), {"generator": gen}, chunk=16)
    assert torch.equal(part, whole[30:])


def test_copies_of_one_lazy_layer_sharded_equal_eager_copies() -> None:
    """nn.TransformerEncoder deep-copies its layer: eager copies share the original's values,
    and so do lazy copies built on meta, sharded by FSDP2, then materialized (one process
    here; tests/building/test_distributed.py shards over two)."""
    import warnings

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import lazynn

    def make(lazy: bool) -> nn.Module:
        layer = (
            lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16, dropout=0.0)
            if lazy
            else nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
        )
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        x = torch.zeros(3, 5, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's nested-tensor note
            torch.manual_seed(0)
            eager = make(False)
            torch.manual_seed(0)
            model = lazynn.build(make(True), x, device="meta")
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        lazynn.materialize(model, "cpu")
        theirs = dict(eager.named_parameters())
        for name, p in model.named_parameters():
            assert torch.equal(p.full_tensor(), theirs[name]), name
    finally:
        dist.destroy_process_group()


def test_other_placements_equal_eager_and_partial_is_refused_changing_nothing() -> None:
    """FSDP2 sharding on the last dim initializes as eager (tests/building/test_distributed.py
    checks
    Shard(1) and 2-D shards on real ranks); a Partial parameter, which holds no block of
    its values, is refused and the model stays on meta."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial, Shard

    import lazynn

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        model = lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (2, 3), device="meta")
        fully_shard(model, mesh=mesh, shard_placement_fn=lambda p: Shard(p.dim() - 1))
        lazynn.materialize(model, "cpu")
        torch.manual_seed(0)
        eager = nn.Sequential(nn.Linear(3, 4))
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            assert torch.equal(p.full_tensor(), q)

        partial = lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (2, 3), device="meta")
        weight = DTensor.from_local(torch.empty(4, 3, device="meta"), mesh, [Partial()])
        partial[0].weight = nn.Parameter(weight)
        with pytest.raises(lazynn.LazynnError, match=r"'0\.weight'.*Partial"):
            lazynn.materialize(partial, "cpu")
        assert all(p.is_meta or p.to_local().is_meta for p in partial.parameters())
    finally:
        dist.destroy_process_group()
