"""Exact initialization drawn in parallel (issue 27): each rank draws only its blocks' words,
threads draw parts of one fill, and the numbers and every generator's end stay the serial
eager construction's.

Ranks are simulated in one process: N threads, each replaying the recorded construction for
its blocks (:class:`~lazynn._program.replay.Ranks`, ``agree`` a barrier's maximum, where
processes use ``all_reduce(MAX)``; tests/building/test_real_models.py runs the real thing
on gloo). Jumps are forced (``always_jump``) so that small tensors take the path large ones
take; sizes are the adversarial ones: 16-blocks and their tails, 624-word twists, 1 to 15
elements (a cached normal), float64, bfloat16, float16, uneven and empty shards, a
``trunc_normal_`` that needs several rounds, ``orthogonal_`` and ``sparse_`` drawn whole.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import nn

import lazynn
import lazynn._program.draws as draws_module
import lazynn._program.jump as jump_module
from lazynn._program.draws import draw_parts, draw_region
from lazynn._program.jump import counters
from lazynn._program.record import Recorder
from lazynn._program.replay import Block, Ranks, Replay


@pytest.fixture
def always_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every skip of more than two keys' words jumps (the path of long skips)."""

    def pays(words: int, repeated: bool = False) -> bool:
        return words > 1248

    monkeypatch.setattr(jump_module, "jump_pays", pays)
    monkeypatch.setattr(draws_module, "jump_pays", pays)


class Mixed(nn.Module):
    """Every kind of init a model uses, at adversarial sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(37, 100)  # kaiming_uniform_, a 16-tail, 624-word twists
        self.head = nn.Linear(100, 3)
        self.embedding = nn.Embedding(1000, 8)  # normal_, 8,000 elements
        self.narrow = nn.Parameter(torch.empty(40, 24))  # trunc_normal_, several rounds
        nn.init.trunc_normal_(self.narrow, std=1.0, a=-0.6, b=0.6)
        self.usual = nn.Parameter(torch.empty(64, 33))  # timm's / torchtitan's trunc_normal_
        nn.init.trunc_normal_(self.usual, std=0.02)
        self.wide = nn.Parameter(torch.empty(33, 17, dtype=torch.float64).normal_())
        self.brain = nn.Parameter(torch.empty(50, 17, dtype=torch.bfloat16).normal_())
        self.halves = nn.Parameter(torch.empty(7, 16, dtype=torch.float16).uniform_(-1, 1))
        self.tiny = nn.Parameter(torch.empty(5).normal_())  # the scalar path: a cached normal
        self.tinier = nn.Parameter(torch.empty(3).normal_())  # (which this one reads)
        self.tail = nn.Parameter(torch.empty(17, 3).normal_(0.5, 2.0))
        self.orthogonal = nn.Parameter(torch.empty(20, 10))
        nn.init.orthogonal_(self.orthogonal)  # QR of the whole: drawn whole by its holders
        self.sparse = nn.Parameter(torch.empty(30, 10))
        nn.init.sparse_(self.sparse, 0.5)  # randperm: drawn whole
        self.register_buffer("noise", torch.randn(3, 5))
        self.after = nn.Parameter(torch.rand(1000, 3))  # (after all of it: offsets add up)


def _blocks(shape: tuple[int, ...], world: int, dim: int) -> list[tuple[int, ...]]:
    """Each rank's (offset, size) along ``dim`` as DTensor's Shard(dim) cuts (torch.chunk:
    uneven, the last ones possibly empty)."""
    size = shape[dim]
    per = -(-size // world)
    out = []
    for rank in range(world):
        lo = min(rank * per, size)
        out.append((lo, min(per, size - lo)))
    return out


def _replay_as_ranks(
    make: Callable[[], nn.Module], world: int, dim: int, seed: int = 0
) -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """Each simulated rank's blocks of every tensor of ``make()``, and its generator's end."""
    with torch.device("meta"), Recorder() as recorder:
        model = make()
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    torch.manual_seed(seed)
    start = torch.get_rng_state()
    barrier, seen = threading.Barrier(world), [0] * world
    results: list[Any] = [None] * world

    def rank_run(rank: int) -> None:
        def agree(rounds: int) -> int:
            seen[rank] = rounds
            barrier.wait()
            most = max(seen)
            barrier.wait()
            return most

        wanted: dict[Any, Block | None] = {}
        names = {}
        for name, tensor in tensors.items():
            view = recorder.view_of(tensor)
            cut = dim if tensor.dim() > dim else 0
            lo, n = _blocks(tuple(tensor.shape), world, cut)[rank]
            offset = tuple(lo if d == cut else 0 for d in range(tensor.dim()))
            shape = tuple(n if d == cut else s for d, s in enumerate(tensor.shape))
            local = torch.full(shape, float("nan"), dtype=tensor.dtype)
            wanted[view] = Block(view, offset, local)
            names[name] = view
        replay = Replay(recorder.tape, "cpu", start, ranks=Ranks(rank, world, agree))
        values = replay.run(wanted)
        results[rank] = ({n: values[v] for n, v in names.items()}, replay.default.get_state())

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(r is not None for r in results), "a simulated rank failed"
    return [r[0] for r in results], [r[1] for r in results]


def _eager(make: Callable[[], nn.Module], seed: int = 0) -> tuple[dict[str, torch.Tensor], Any]:
    torch.manual_seed(seed)
    model = make()
    return dict(model.named_parameters()) | dict(model.named_buffers()), torch.get_rng_state()


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_each_rank_draws_its_blocks_of_the_eager_numbers(
    world: int, dim: int, always_jump: None
) -> None:
    eager, end = _eager(Mixed)
    jumps = counters().jumps
    blocks, ends = _replay_as_ranks(Mixed, world, dim)
    if world > 1 and dim == 0:  # (column blocks draw their rows whole: gaps of < 1248 words)
        assert counters().jumps > jumps  # (the ranks jumped over the others' words)
    for rank, (mine, state) in enumerate(zip(blocks, ends, strict=True)):
        assert torch.equal(state, end), f"rank {rank}: the generator ends elsewhere"
        for name, full in eager.items():
            cut = dim if full.dim() > dim else 0
            lo, n = _blocks(tuple(full.shape), world, cut)[rank]
            expected = full.detach().narrow(cut, lo, n)
            assert torch.equal(mine[name], expected), (rank, name)


def test_trunc_normal_rounds_are_agreed_between_ranks() -> None:
    """The block that needs the most rounds decides the generator's end for every rank."""

    def make() -> nn.Module:
        layer = nn.Module()
        layer.weight = nn.Parameter(torch.empty(400, 16))
        nn.init.trunc_normal_(layer.weight, std=1.0, a=-0.55, b=0.55)
        layer.after = nn.Parameter(torch.rand(16))
        return layer

    for seed in range(3):
        eager, end = _eager(make, seed)
        blocks, ends = _replay_as_ranks(make, 4, 0, seed)
        assert all(torch.equal(e, end) for e in ends)
        assert torch.equal(torch.cat([b["weight"] for b in blocks]), eager["weight"].detach())
        assert torch.equal(torch.cat([b["after"] for b in blocks]), eager["after"].detach())


@st.composite
def _cases(draw: st.DrawFn) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """A 2-D shape around 16-blocks and 624-word twists, and a block in it."""
    rows = draw(st.sampled_from([1, 2, 3, 15, 16, 17, 39, 40, 41, 312, 313]))
    row = draw(st.sampled_from([1, 3, 15, 16, 17, 624, 625, 1300]))
    r0 = draw(st.integers(0, rows - 1))
    c0 = draw(st.integers(0, row - 1))
    return (rows, row), (r0, c0), (draw(st.integers(0, rows - r0)), draw(st.integers(1, row - c0)))


@settings(max_examples=120, deadline=None)
@given(
    case=_cases(),
    kind=st.sampled_from(["uniform", "normal"]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_a_block_drawn_with_jumps_is_the_block_of_a_whole_draw(
    case: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    kind: str,
    dtype: torch.dtype,
    seed: int,
) -> None:
    shape, offset, size = case
    fill = torch.Tensor.uniform_ if kind == "uniform" else torch.Tensor.normal_
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jump_module, "jump_pays", lambda words, repeated=False: words > 1248)
        patch.setattr(draws_module, "jump_pays", lambda words, repeated=False: words > 1248)
        generator = torch.Generator().manual_seed(seed)
        whole = fill(torch.empty(shape, dtype=dtype), generator=generator)
        end = generator.get_state()
        generator = torch.Generator().manual_seed(seed)
        block = torch.empty(size, dtype=dtype)
        draw_region(block, fill, shape, offset, (), {"generator": generator})
    index = tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))
    assert torch.equal(block, whole[index])
    assert torch.equal(generator.get_state(), end)


# --- threads ----------------------------------------------------------------------------------


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads take parts of fills of a few hundred numbers (as of millions by default)."""
    monkeypatch.setattr(draws_module, "PART", 64)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("total", [16 * 64, 16 * 64 * 3 + 1, 5003])
def test_threads_fill_parts_of_the_stream_as_one_thread_does(
    threads: int, dtype: torch.dtype, total: int, small_parts: None
) -> None:
    for fill, args in ((torch.Tensor.normal_, (0.5, 2.0)), (torch.Tensor.uniform_, (-1.0, 1.0))):
        serial = torch.Generator().manual_seed(3)
        expected = fill(torch.empty(total, dtype=dtype), *args, generator=serial)
        parallel = torch.Generator().manual_seed(3)
        out = torch.empty(total, dtype=dtype)
        used = draw_parts(out, fill, args, {}, parallel, threads)
        if not used:
            assert threads == 1 or total // 64 < 2
            fill(out, *args, generator=parallel)
        assert torch.equal(out, expected)
        assert torch.equal(parallel.get_state(), serial.get_state())


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(5, 7),  # (eager, before the lazy layers)
        lazynn.LazyLinear(300),
        nn.GELU(),
        lazynn.LazyLinear(1001),
        nn.LayerNorm(1001),
        lazynn.LazyLinear(17),
    )


class _Factory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(512)
        self.b = lazynn.LazyLinear(333)
        self.embedding = nn.Parameter(torch.empty(1000, 64))
        nn.init.trunc_normal_(self.embedding, std=1.0, a=-1.0, b=1.0)  # (rounds, in threads)
        self.small = nn.Parameter(torch.empty(7).normal_())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("form", ["instance", "factory"])
def test_build_with_threads_is_the_eager_model(
    threads: int, form: str, small_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = draws_module.draw_parts

    def spy(*args: Any, **kwargs: Any) -> bool:
        used = real(*args, **kwargs)
        calls.append(used)
        return used

    monkeypatch.setattr("lazynn._program.replay.draw_parts", spy)
    torch.manual_seed(0)
    expected = lazynn.build(_net() if form == "instance" else _Factory, (2, 5))
    end = torch.get_rng_state()
    torch.manual_seed(0)
    got = lazynn.build(_net() if form == "instance" else _Factory, (2, 5), threads=threads)
    assert torch.equal(torch.get_rng_state(), end)
    assert got.state_dict().keys() == expected.state_dict().keys()
    for (name, value), other in zip(
        got.state_dict().items(), expected.state_dict().values(), strict=True
    ):
        assert value.device.type == "cpu", name
        assert torch.equal(value, other), name
    assert any(calls) == (threads > 1)  # (threads drew, where there were more than one)


@pytest.mark.parametrize("threads", [2, 8])
def test_materialize_with_threads_is_the_eager_model(threads: int, small_parts: None) -> None:
    torch.manual_seed(0)
    expected = lazynn.build(_Factory, (2, 5))
    end = torch.get_rng_state()
    torch.manual_seed(0)
    model = lazynn.build(_Factory, (2, 5), device="meta")
    lazynn.materialize(model, "cpu", threads=threads)
    assert torch.equal(torch.get_rng_state(), end)
    for name, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


@pytest.mark.parametrize("threads", [0, -2, 1.5, True, "2", None])
def test_threads_must_be_a_count(threads: Any) -> None:
    model = _net()
    with pytest.raises(lazynn.ArgumentError, match=r"threads=.* Fix: pass threads=1"):
        lazynn.build(model, (2, 5), threads=threads)
    assert lazynn.is_lazy(model[1])
    built = lazynn.build(_Factory, (2, 5), device="meta")
    with pytest.raises(lazynn.ArgumentError, match=r"lazynn\.materialize"):
        lazynn.materialize(built, "cpu", threads=threads)
    assert built.a.weight.is_meta


def test_a_part_too_small_to_pay_is_drawn_by_one_thread() -> None:
    generator = torch.Generator().manual_seed(0)
    out = torch.full((1000,), float("nan"))
    assert not draw_parts(out, torch.Tensor.normal_, (), {}, generator, threads=8)
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())
    assert out.isnan().all()  # (nothing drawn: the caller draws it whole)


def test_a_fill_a_later_one_overwrites_is_skipped_not_drawn() -> None:
    """kaiming_uniform_ at construction, then an init that redraws the weight (torchtitan's
    trunc_normal_): a rank skips the first fill's words instead of drawing its block."""

    def make() -> nn.Module:
        layer = nn.Linear(256, 512)
        nn.init.trunc_normal_(layer.weight, std=0.02)
        return layer

    eager, end = _eager(make)
    skipped = counters().skipped_words
    blocks, ends = _replay_as_ranks(make, 2, 0)
    assert all(torch.equal(e, end) for e in ends)
    assert torch.equal(torch.cat([b["weight"] for b in blocks]), eager["weight"].detach())
    # each rank skips the whole uniform_ (131,072 words) and the other half of the normal_
    assert counters().skipped_words - skipped >= 2 * (131_072 + 65_536)


@pytest.mark.parametrize(
    ("shape", "offset", "size"),
    [
        ((17, 3), (16, 1), (1, 2)),  # (a block in the last, short piece: rows under 16)
        ((33, 5), (32, 1), (1, 3)),
        ((18, 3), (16, 1), (2, 1)),
        ((3, 8), (2, 0), (1, 1)),
    ],
)
@pytest.mark.parametrize("skips", [True, False])
def test_a_block_in_the_last_short_piece_is_drawn(
    shape: tuple[int, int],
    offset: tuple[int, int],
    size: tuple[int, int],
    skips: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Found by review: the last piece started off a 16-element boundary.) ``skips``: False
    is the serial fallback (a failed self-test, CUDA), which draws the skipped pieces."""
    import lazynn._program.stream as stream_module

    monkeypatch.setattr(stream_module, "skipping", lambda: skips)
    for fill in (torch.Tensor.uniform_, torch.Tensor.normal_):
        generator = torch.Generator().manual_seed(5)
        whole = fill(torch.empty(shape), generator=generator)
        end = generator.get_state()
        generator = torch.Generator().manual_seed(5)
        block = torch.empty(size)
        draw_region(block, fill, shape, offset, (), {"generator": generator})
        index = tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))
        assert torch.equal(block, whole[index])
        assert torch.equal(generator.get_state(), end)


@pytest.mark.parametrize(("total", "start", "stop"), [(40, 0, 24), (40, 16, 24), (100, 0, 70)])
def test_the_serial_fallback_draws_a_last_piece_of_16_or_more(
    total: int, start: int, stop: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice ending within 16 of a normal_'s end: the rest is one piece with the tail (a
    shorter one would take torch's scalar path and draw other words)."""
    import lazynn._program.stream as stream_module

    monkeypatch.setattr(stream_module, "skipping", lambda: False)
    generator = torch.Generator().manual_seed(2)
    whole = torch.empty(total).normal_(generator=generator)
    end = generator.get_state()
    generator = torch.Generator().manual_seed(2)
    part = torch.empty(stop - start)
    draws_module.draw_slice(
        part, torch.Tensor.normal_, (total,), start, (), {"generator": generator}
    )
    assert torch.equal(part, whole[start:stop])
    assert torch.equal(generator.get_state(), end)


def test_threads_jumping_for_the_first_time_at_once_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reduction table is made once, under a lock, whichever thread asks first. (No
    distance's terms kept either: an earlier test's jump of the same distance would leave
    nothing to compute, and the table unmade.)"""
    monkeypatch.setattr(jump_module, "_TABLE", [])
    monkeypatch.setattr(jump_module, "_TERMS", collections.OrderedDict())
    start = torch.Generator().manual_seed(9).get_state()
    expected = jump_module.advance(start, 200_000, jump=False)
    ready = threading.Barrier(8)
    results: list[bool] = []

    def jump() -> None:
        ready.wait()
        results.append(torch.equal(jump_module.advance(start, 200_000, jump=True), expected))

    threads = [threading.Thread(target=jump) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [True] * 8
    assert len(jump_module._TABLE) == 256


def test_build_with_threads_keeps_the_dtype_and_what_is_declared_on_meta(
    small_parts: None,
) -> None:
    got = {}
    for threads in (1, 2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), lazynn.LazyLinear(1000))
        lazynn.build(net, (2, 3), dtype=torch.float64, threads=threads)
        got[threads] = net.state_dict()
        torch.manual_seed(0)
        declared = nn.Sequential(nn.Linear(3, 4, device="meta"), lazynn.LazyLinear(5))
        lazynn.build(declared, (2, 3), threads=threads)
        assert declared[0].weight.is_meta  # (declared there: the build allocates no eager layer)
    for name, value in got[1].items():
        assert value.dtype == torch.float64
        assert torch.equal(got[2][name], value), name
