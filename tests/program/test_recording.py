"""The init program's parts on their own (src/lazynn/_program/): a construction recorded on
meta, then replayed, gives the eager values and leaves the generator where eager code does;
values the code reads are computed for real; a block of a tensor replays as the block of
the whole; the recorder's mark sees a reseed and leaves another thread's draws alone.

Every door that runs programs is tested through lazynn's API in tests/building/; these pin
the mechanism's own contracts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
from torch import nn

from lazynn._program.record import Recorder
from lazynn._program.replay import Block, Replay

T = TypeVar("T")


def _recorded(make: Callable[[], T]) -> tuple[T, Recorder]:
    """``make()`` on meta, recorded."""
    with torch.device("meta"), Recorder() as recorder:
        made = make()
    return made, recorder


def test_a_replay_gives_the_eager_values_and_leaves_the_generator_where_eager_does() -> None:
    def make() -> nn.Module:
        model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
        nn.init.orthogonal_(model[1].weight)
        with torch.no_grad():
            model[0].weight.mul_(0.5).add_(1.0)
        return model

    model, recorder = _recorded(make)
    views = {recorder.view_of(p): None for p in model.parameters()}
    torch.manual_seed(0)
    replay = Replay(recorder.tape, "cpu")
    values = replay.run(views)
    replay.finish()
    after_replay = torch.get_rng_state()
    torch.manual_seed(0)
    eager = make()
    assert torch.equal(after_replay, torch.get_rng_state())
    for view, param in zip(views, eager.parameters(), strict=True):
        assert torch.equal(values[view], param)


def test_a_value_the_code_reads_is_computed_for_real_and_moves_no_generator() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()

    def make() -> list[float]:
        noise = torch.randn(3)  # (on meta: recorded, drawn later)
        return [x.item() for x in torch.linspace(0, 0.1, 3)] + [float(noise.sum())]

    values, _ = _recorded(make)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(0)
    expected = [x.item() for x in torch.linspace(0, 0.1, 3)] + [float(torch.randn(3).sum())]
    assert values == expected


@pytest.mark.parametrize("offset", [(0, 0), (2, 0), (0, 3), (3, 2)])
def test_a_block_of_a_tensor_replays_as_that_block_of_the_whole(offset: tuple[int, int]) -> None:
    (weight,), recorder = _recorded(lambda: (torch.empty(6, 7).normal_().mul_(2.0),))
    view = recorder.view_of(weight)
    torch.manual_seed(0)
    whole = Replay(recorder.tape, "cpu").run({view: None})[view]
    torch.manual_seed(0)
    local = torch.empty(3, 4)
    Replay(recorder.tape, "cpu").run({view: Block(view, offset, local)})
    rows, cols = offset
    assert torch.equal(local, whole[rows : rows + 3, cols : cols + 4])


def test_a_reseed_even_to_the_seed_it_has_is_a_step_and_is_put_back() -> None:
    torch.manual_seed(0)
    start = torch.get_rng_state()

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        first = torch.empty(4).uniform_()
        torch.manual_seed(0)  # the seed it has: the stream starts again
        return first, torch.empty(4).uniform_()

    (first, second), recorder = _recorded(make)
    assert torch.equal(torch.get_rng_state(), start)  # put back
    views = {recorder.view_of(first): None, recorder.view_of(second): None}
    torch.manual_seed(0)
    values = list(Replay(recorder.tape, "cpu").run(views).values())
    assert torch.equal(values[0], values[1])  # both drawn from a fresh seed 0


def test_another_threads_draw_during_a_recording_is_left_alone() -> None:
    """Forced interleaving: the recorded code waits while another thread draws."""
    entered, drawn = threading.Event(), threading.Event()

    def draw() -> None:
        assert entered.wait(10)
        torch.rand(3)
        drawn.set()

    def make() -> torch.Tensor:
        entered.set()
        assert drawn.wait(10)
        return torch.empty(2).normal_()

    torch.manual_seed(0)
    other = threading.Thread(target=draw)
    other.start()
    _recorded(make)
    other.join(10)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    torch.rand(3)
    assert torch.equal(after, torch.get_rng_state())
