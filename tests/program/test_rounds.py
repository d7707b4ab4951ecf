"""``trunc_normal_``'s rejection rounds worked in parts (issue 37): a round after the first draws
only the parts that still have elements outside ``[a, b]``, each into one part's memory, so
that a replay holds a block and one chunk, where torch's rounds hold two more tensors of the
block. The values and the generator's end stay torch's own ``trunc_normal_``'s, for whole
tensors (a serial ``materialize``), blocks (a rank's shard: flat runs and column blocks, cut
into parts of a few rows), and slices only counted (a tensor no rank keeps).

Parts are made small (a few rows, or 16 elements) so that small tensors take the path large
ones take; jumps are forced for the same reason.
"""

from __future__ import annotations

import threading
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import nn

import lazynn
import lazynn._program.draws as draws_module
import lazynn._program.jump as jump_module
import lazynn._program.rounds as rounds_module
from allocations import Allocations
from lazynn._program.record import Recorder
from lazynn._program.replay import Ranks, Replay
from lazynn._program.rounds import count_rounds, splittable, trunc_normal_block, vouched
from lazynn._program.stream import Stream

#: (mean, std, a, b): torch's usual cut, a 2-sigma one, and windows that take many rounds
WINDOWS = [
    (0.0, 1.0, -2.0, 2.0),
    (0.0, 0.02, -0.04, 0.04),
    (0.5, 2.0, -1.0, 3.0),
    (0.0, 1.0, -0.6, 0.6),
    (0.0, 1.0, -0.55, 0.55),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _jump_always(patch: pytest.MonkeyPatch) -> None:
    def pays(words: int, repeated: bool = False) -> bool:
        return words > 1248

    patch.setattr(jump_module, "jump_pays", pays)
    patch.setattr(draws_module, "jump_pays", pays)


def _torch(shape: tuple[int, ...], dtype: torch.dtype, window: tuple[float, ...], seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    full = nn.init.trunc_normal_(torch.empty(shape, dtype=dtype), *window, generator=generator)
    return full, generator.get_state()


def _rounds(
    shape: tuple[int, ...], dtype: torch.dtype, window: tuple[float, ...], seed: int
) -> int:
    """How many rounds the whole tensor takes (what the blocks' holders agree on)."""
    counted: list[int] = []

    def count(rounds: int) -> int:
        counted.append(rounds)
        return rounds

    stream = Stream(torch.Generator().manual_seed(seed))
    whole = torch.empty(shape, dtype=dtype)
    trunc_normal_block(whole, shape, (0,) * len(shape), window, stream, count)
    return counted[0]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "span"), [((40, 24), 64), ((1001,), 16), ((33, 17), 48)])
def test_a_whole_tensor_in_parts_is_torchs_trunc_normal(
    shape: tuple[int, ...], span: int, dtype: torch.dtype, window: tuple[float, ...]
) -> None:
    for seed in range(3):
        full, end = _torch(shape, dtype, window, seed)
        stream = Stream(torch.Generator().manual_seed(seed))
        mine = torch.empty(shape, dtype=dtype)
        trunc_normal_block(mine, shape, (0,) * len(shape), window, stream, lambda n: n, span)
        assert torch.equal(mine, full), (seed, shape)
        assert torch.equal(stream.settle().get_state(), end), (seed, shape)


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """A 2-D shape around 16-blocks and twists (16 elements at least: fewer are drawn whole),
    and a block of it: a run of rows (Shard(0)) or a column block (Shard(1))."""
    rows = draw(st.sampled_from([2, 3, 15, 16, 17, 40, 41, 313]))
    row = draw(st.sampled_from([1, 3, 16, 17, 24, 625]).filter(lambda n: rows * n >= 16))
    r0 = draw(st.integers(0, rows - 1))
    n = draw(st.integers(1, rows - r0))
    if draw(st.booleans()):
        return (rows, row), (r0, 0), (n, row)
    c0 = draw(st.integers(0, row - 1))
    return (rows, row), (r0, c0), (n, draw(st.integers(1, row - c0)))


@settings(max_examples=80, deadline=None)
@given(
    case=_blocks(),
    window=st.sampled_from(WINDOWS[2:]),
    dtype=st.sampled_from(DTYPES),
    span=st.sampled_from([16, 48, 64, 1024]),
    seed=st.integers(0, 2**16),
)
def test_a_block_in_parts_is_that_block_of_torchs_trunc_normal(
    case: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    window: tuple[float, ...],
    dtype: torch.dtype,
    span: int,
    seed: int,
) -> None:
    shape, offset, size = case
    full, end = _torch(shape, dtype, window, seed)
    most = _rounds(shape, dtype, window, seed)
    with pytest.MonkeyPatch.context() as patch:
        _jump_always(patch)
        stream = Stream(torch.Generator().manual_seed(seed))
        block = torch.full(size, float("nan"), dtype=dtype)
        mine: list[int] = []

        def agree(rounds: int) -> int:
            mine.append(rounds)
            return most

        trunc_normal_block(block, shape, offset, window, stream, agree, span)
    index = tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))
    assert torch.equal(block, full[index])
    assert torch.equal(stream.settle().get_state(), end)
    assert len(mine) == 1
    assert mine[0] <= most  # (its own count, at most the whole tensor's)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("window", WINDOWS)
def test_rounds_counted_on_slices_agree_and_leave_the_generator_where_torch_does(
    world: int, window: tuple[float, ...]
) -> None:
    """A tensor nobody keeps: each rank counts on its slice, keeping no values."""
    total, dtype = 2000, torch.float32
    for seed in range(3):
        _, end = _torch((total,), dtype, window, seed)
        most = _rounds((total,), dtype, window, seed)
        edges = [*(16 * (total * i // world // 16) for i in range(world)), total]
        counts = []
        for rank in range(world):
            stream = Stream(torch.Generator().manual_seed(seed))
            seen: list[int] = []

            def agree(rounds: int, seen: list[int] = seen, most: int = most) -> int:
                seen.append(rounds)
                return most

            count_rounds(total, edges[rank], edges[rank + 1], dtype, window, stream, agree, 48)
            assert torch.equal(stream.settle().get_state(), end), (seed, rank)
            counts.extend(seen)
        assert max(counts) == most, (seed, counts)


def test_the_rounds_are_vouched_for_on_this_release_and_unvouched_ones_are_torchs() -> None:
    """The first use checks the rounds against torch's own function; where they differ, a
    replay runs torch's ``trunc_normal_`` whole (exact, not in parts)."""
    assert vouched()
    assert splittable(torch.float32, 640, (0.0, 1.0, -0.6, 0.6))
    assert not splittable(torch.float32, 640, (0.0, 1.0, -0.2, 0.2))  # (the narrow window)

    def make() -> nn.Module:
        layer = nn.Linear(24, 40)
        nn.init.trunc_normal_(layer.weight, std=1.0, a=-0.6, b=0.6)
        return layer

    torch.manual_seed(0)
    eager = make()
    end = torch.get_rng_state()
    weight = eager.weight.numel() * eager.weight.element_size()
    for trusted in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rounds_module, "vouched", lambda trusted=trusted: trusted)
            torch.manual_seed(0)
            model = lazynn.build(make, device="meta")
            with Allocations() as allocated:
                lazynn.materialize(model, "cpu")
        assert torch.equal(model.weight, eager.weight), trusted
        assert torch.equal(torch.get_rng_state(), end), trusted
        # torch's rounds: a whole redraw beside the weight; lazynn's: parts (one, here)
        kept = weight + model.bias.numel() * 4
        assert (allocated.peak >= kept + 2 * weight) is not trusted, (trusted, allocated.peak)


class _Head(nn.Module):
    """An output layer cut at 3 sigma (torchtitan's), large enough for several parts."""

    def __init__(self) -> None:
        super().__init__()
        self.output = nn.Linear(64, 6000, bias=False)
        std = 64**-0.5
        nn.init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)
        self.narrow = nn.Parameter(torch.empty(3000, 16))
        nn.init.trunc_normal_(self.narrow, std=1.0, a=-0.6, b=0.6)


@pytest.mark.parametrize("span", [4096, None])
def test_a_serial_materialize_holds_one_part_of_the_rounds(
    span: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eager values, and no temporary of the tensor's size: a part's numbers and mask
    (torch's own rounds hold two more tensors of the whole)."""
    if span is not None:
        monkeypatch.setattr(rounds_module, "SPAN", span)
    torch.manual_seed(0)
    eager = _Head()
    end = torch.get_rng_state()
    torch.manual_seed(0)
    model = lazynn.build(_Head, device="meta")
    with Allocations() as allocated:
        lazynn.materialize(model, "cpu")
    assert torch.equal(model.output.weight, eager.output.weight)
    assert torch.equal(model.narrow, eager.narrow)
    assert torch.equal(torch.get_rng_state(), end)
    kept = sum(p.numel() * p.element_size() for p in model.parameters())
    part = 4 * (span or rounds_module.SPAN)
    # a part's numbers, its masks (a byte an element each) and the cursor's scratch
    assert allocated.peak <= kept + 2 * part + 2 * part // 4, (allocated.peak, kept)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_loaded_trunc_normal_is_counted_not_kept_and_the_generator_ends_where_eager_does(
    world: int,
) -> None:
    """A tensor a checkpoint gave: its rounds only move the generator on. Each simulated rank
    counts them on its slice (a part's flags kept), agreed at a barrier; none holds it."""

    def make() -> nn.Module:
        layer = nn.Module()
        layer.weight = nn.Parameter(torch.empty(300, 16))
        nn.init.trunc_normal_(layer.weight, std=1.0, a=-0.6, b=0.6)
        layer.after = nn.Parameter(torch.rand(40))
        return layer

    assert vouched()  # (the self-tests, once a process, before anything is measured)
    torch.manual_seed(0)
    eager = make()
    end = torch.get_rng_state()
    with torch.device("meta"), Recorder() as recorder:
        model = make()
    weight, after = recorder.view_of(model.weight), recorder.view_of(model.after)
    seen, barrier = [0] * world, threading.Barrier(world)
    results: list[Any] = [None] * world

    def rank_run(rank: int) -> None:
        def agree(rounds: int) -> int:
            seen[rank] = rounds
            barrier.wait()
            most = max(seen)
            barrier.wait()
            return most

        ranks = Ranks(rank, world, agree) if world > 1 else None
        torch.manual_seed(0)
        replay = Replay(recorder.tape, "cpu", ranks=ranks)
        given = {weight.storage: eager.weight.detach().clone()}
        with Allocations() as allocated:
            values = replay.run({after: None}, have=given)
        results[rank] = (values[after], replay.default.get_state(), allocated.largest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rounds_module, "SPAN", 256)
        threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    for value, state, largest in results:
        assert torch.equal(value, eager.after)
        assert torch.equal(state, end)
        assert largest <= 256 * 4  # (a part of 256 numbers at most, never the slice)
