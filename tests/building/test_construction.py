"""The init program sees the whole construction: what ``__init__`` draws, reads, seeds and
makes gives the eager program's numbers through every door (``build``, ``build`` on meta then
``materialize``, ``threads=2`` in both), or is refused at the door naming the real cause.

One harness: each row is a model written twice (sizes lazy, sizes written in), built through
every door under one seed and compared with the eager construction under that seed: every
parameter and buffer, the Python attributes ``__init__`` computed, and where the generator
ends.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import lazynn

DOORS = ["build", "meta+materialize", "build(threads=2)", "meta+materialize(threads=2)"]


def through(door: str, factory: Callable[[], nn.Module], example: Any) -> nn.Module:
    """``factory``'s model built on ``example`` through ``door``."""
    if door == "build":
        return lazynn.build(factory, example)
    if door == "build(threads=2)":
        return lazynn.build(factory, example, threads=2)
    threads = 2 if door.endswith("(threads=2)") else 1
    return lazynn.materialize(lazynn.build(factory, example, device="meta"), threads=threads)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@dataclass(frozen=True)
class Row:
    """A model: ``make(lazy)`` constructs it, ``example`` is what it is built on, ``same``
    compares what ``__init__`` computed besides tensors (default: nothing)."""

    make: Callable[[bool], nn.Module]
    example: Any
    same: Callable[[nn.Module, nn.Module], bool] = lambda a, b: True
    #: the seed both constructions run under
    seed: int = 0


# --- values read in __init__ ---------------------------------------------------------------


class _ReadsDraws(nn.Module):
    """``.tolist()`` of numbers drawn in ``__init__`` (a permutation of heads, a random
    mask's values), and a buffer drawn on the CPU from a private generator."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        self.values = torch.randn(3).tolist()
        self.order = torch.randperm(5).tolist()
        generator = torch.Generator().manual_seed(1)
        self.register_buffer("noise", torch.randn(3, generator=generator, device="cpu"))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x)) + self.noise[:2]  # type: ignore[no-any-return]


class _ValueCheckedDraws(nn.Module):
    """Draws whose numbers, and whether they are accepted at all, depend on values computed
    in ``__init__`` (``poisson``'s rates, ``multinomial``'s probabilities), read back, and
    followed by a draw whose place in the stream they decide."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        self.counts = torch.poisson(torch.linspace(0.5, 2.0, 6)).tolist()
        self.picks = torch.multinomial(torch.softmax(torch.randn(5), 0), 3).tolist()
        self.register_buffer("after", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.after  # type: ignore[no-any-return]


class _DrawsAfterALazyLayer(nn.Module):
    """A number ``__init__`` draws after a lazy layer's construction decides how many blocks
    follow, and a branch (the eager layer's numbers come first: the draw's place in the
    stream depends on the lazy layer's sizes)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(64, 4)
        self.drawn = torch.rand(()).item()
        blocks = 2 + int(self.drawn * 10**6) % 50
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(blocks))
        self.head = nn.Linear(4, 8 if torch.rand(()) > 0.5 else 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


class _SetsGenerators(nn.Module):
    """``__init__`` code that sets generators itself: a private one's state saved and put
    back around a draw, a private one reseeded, the default one's state put back, and
    ``torch.random.fork_rng`` around a reseed; then draws."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        private = torch.Generator().manual_seed(1)
        saved = private.get_state()
        noise = torch.randn(5, generator=private)
        private.set_state(saved)  # (the same numbers again)
        self.register_buffer("again", torch.randn(5, generator=private) - noise)
        private.manual_seed(3)
        self.register_buffer("reseeded", torch.randn(4, generator=private))
        state = torch.get_rng_state()
        torch.randn(7)
        torch.set_rng_state(state)  # (the default generator back: the next draw repeats)
        self.register_buffer("repeated", torch.randn(7))
        with torch.random.fork_rng():
            torch.manual_seed(11)
            self.register_buffer("forked", torch.randn(3))
        self.head = nn.Linear(4, 2)  # (drawn where the fork left the generator: as before)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x))  # type: ignore[no-any-return]


class _KeepsAnEma(nn.Module):
    """An EMA copy of the network made in ``__init__`` (``copy.deepcopy``), never called: it
    has the network's sizes, as eager copies do."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4), nn.ReLU())
        self.ema = copy.deepcopy(self.net)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))  # type: ignore[no-any-return]


class _Symmetric(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return (weight + weight.t()) / 2


class _Parametrized(nn.Module):
    """A parametrization registered in ``__init__`` (``register_parametrization`` makes a new
    class each time it is called)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        self.square = nn.Linear(4, 4)
        parametrize.register_parametrization(self.square, "weight", _Symmetric())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.square(self.fc(x))  # type: ignore[no-any-return]


class _MovesDtypes(nn.Module):
    """Lazy layers moved to other dtypes in ``__init__``: one to float64, one to bfloat16,
    the rest left as they are (a mixed-precision model)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.wide = (lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)).double()
        self.narrow = (lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4)).to(torch.bfloat16)
        self.head = lazynn.LazyLinear(2) if lazy else nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.wide(x.double()).to(torch.bfloat16)
        return self.head(self.narrow(x).float())  # type: ignore[no-any-return]


class _CopiesGeneratorStates(nn.Module):
    """Generators set from another's state after it drew: the default one's
    (``get_rng_state``), a private one's (``get_state``), a clone (``clone_state``)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        torch.randn(5)
        copied = torch.Generator()
        copied.set_state(torch.get_rng_state())
        self.register_buffer("copied", torch.randn(3, generator=copied))
        first = torch.Generator().manual_seed(2)
        torch.randn(7, generator=first)
        second = torch.Generator()
        second.set_state(first.get_state())
        self.register_buffer("second", torch.randn(3, generator=second))
        clone = torch.default_generator.clone_state()
        self.register_buffer("cloned", torch.randn(3, generator=clone))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x))  # type: ignore[no-any-return]


class _BuildsInside(nn.Module):
    """``__init__`` that seeds, builds a lazy part itself (``lazynn.build`` on an example
    drawn from a private generator) and shares one module in two places."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        torch.manual_seed(5)
        generator = torch.Generator().manual_seed(2)
        example = torch.randn(2, 3, generator=generator)
        inner = nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4), nn.ReLU())
        self.inner = lazynn.build(inner, example) if lazy else inner
        shared = nn.Linear(4, 4)
        self.blocks = nn.Sequential(shared, nn.Tanh(), shared)
        self.fc = lazynn.LazyLinear(2) if lazy else nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.inner(x)))  # type: ignore[no-any-return]


class _MixesDevices(nn.Module):
    """Real tensors made on the CPU in ``__init__`` that take values from the model's (meta, in
    a recorded construction): a write into a real buffer, and a product of real and model
    tensors read back (torch does nothing, or returns uninitialized memory, for such mixes on
    meta)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)
        self.register_buffer("mirror", torch.zeros(2, device="cpu"))
        with torch.no_grad():
            self.mirror.add_(self.head.bias)
            self.total = float((torch.ones(3, 4, device="cpu") @ self.head.weight.t()).sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x)) + self.mirror  # type: ignore[no-any-return]


ROWS = {
    "reads drawn values": Row(
        _ReadsDraws,
        (2, 3),
        lambda a, b: (a.values, a.order) == (b.values, b.order),  # type: ignore[union-attr]
    ),
    "draws after a lazy layer": Row(
        _DrawsAfterALazyLayer,
        (2, 64),
        lambda a, b: a.drawn == b.drawn,  # type: ignore[union-attr]
        seed=1,  # (a draft drawing at the stand-in's place made more blocks than eager)
    ),
    "sets generators": Row(_SetsGenerators, (2, 3)),
    "keeps an EMA copy": Row(_KeepsAnEma, (2, 3)),
    "copies generator states": Row(_CopiesGeneratorStates, (2, 3)),
    "parametrized": Row(_Parametrized, (2, 3)),
    "moves dtypes": Row(_MovesDtypes, (2, 3)),
    "builds a part itself": Row(_BuildsInside, (2, 3)),
    "mixes real and meta tensors": Row(
        _MixesDevices,
        (2, 3),
        lambda a, b: a.total == b.total,  # type: ignore[union-attr]
    ),
    "value-checked draws": Row(
        _ValueCheckedDraws,
        (2, 3),
        lambda a, b: (a.counts, a.picks) == (b.counts, b.picks),  # type: ignore[union-attr]
    ),
}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("name", ROWS)
def test_every_door_gives_the_eager_construction(name: str, door: str) -> None:
    row = ROWS[name]
    torch.manual_seed(row.seed)
    eager = row.make(False)
    after = torch.get_rng_state()
    torch.manual_seed(row.seed)
    built = through(door, lambda: row.make(True), row.example)
    assert torch.equal(torch.get_rng_state(), after)
    mine, theirs = state(built), state(eager)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
    assert row.same(built, eager)


@pytest.mark.parametrize("name", ROWS)
def test_a_summary_of_the_factory_moves_no_generator(name: str) -> None:
    row = ROWS[name]
    torch.manual_seed(0)
    before = torch.get_rng_state()
    lazynn.summary(lambda: row.make(True), row.example)
    assert torch.equal(torch.get_rng_state(), before)


class _ReseedsAGivenGenerator(nn.Module):
    """A generator given to the model, reseeded by its ``__init__`` before it draws."""

    def __init__(self, generator: torch.Generator, lazy: bool) -> None:
        super().__init__()
        generator.manual_seed(3)
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)
        self.register_buffer("noise", torch.randn(4, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.noise  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", DOORS)
def test_a_generator_given_to_the_factory_ends_where_eager_leaves_it(door: str) -> None:
    """Reseeded and drawn from by ``__init__``: every door ends it where eager construction
    does; a summary of the factory leaves it (and the default one) as it was."""
    given = torch.Generator()
    given.manual_seed(7)
    torch.manual_seed(0)
    eager = _ReseedsAGivenGenerator(given, lazy=False)
    after = given.get_state(), torch.get_rng_state()
    factory = functools.partial(_ReseedsAGivenGenerator, given, lazy=True)
    given.manual_seed(7)
    torch.manual_seed(0)
    built = through(door, factory, (2, 3))
    assert torch.equal(given.get_state(), after[0])
    assert torch.equal(torch.get_rng_state(), after[1])
    assert all(torch.equal(state(built)[k], v) for k, v in state(eager).items())
    given.manual_seed(7)
    before = given.get_state(), torch.get_rng_state()
    lazynn.summary(factory, (2, 3))
    assert torch.equal(given.get_state(), before[0])
    assert torch.equal(torch.get_rng_state(), before[1])


class _DropsALazyLayer(nn.Module):
    """A backbone whose classifier a feature extractor leaves out (torchvision's ResNet in
    DETR's IntermediateLayerGetter): eager code draws the classifier's numbers anyway."""

    def __init__(self) -> None:
        super().__init__()
        backbone = nn.ModuleDict({"body": lazynn.LazyLinear(4), "fc": lazynn.LazyLinear(10)})
        self.body = backbone["body"]
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", DOORS)
def test_a_lazy_layer_constructed_and_left_out_of_the_model_is_refused(door: str) -> None:
    with pytest.raises(lazynn.LazynnError) as info:
        through(door, _DropsALazyLayer, (2, 3))
    text = str(info.value)
    assert "LazyLinear(out_features=10, bias=True), lazy layer number 2 of its" in text
    assert "Fix: construct it with its sizes written (Linear(...): the eager class)" in text


def test_a_summary_leaves_another_threads_draws_from_a_given_generator() -> None:
    """The factory draws from a generator it was given while another thread draws from it
    too (forced: ``__init__`` waits on events): the summary puts back only what the code did,
    and the other thread's draws stay."""
    given = torch.Generator().manual_seed(7)
    reached, go = threading.Event(), threading.Event()

    class Waits(nn.Module):
        def __init__(self, generator: torch.Generator) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(4)
            self.register_buffer("noise", torch.randn(4, generator=generator))
            reached.set()
            assert go.wait(30)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.noise  # type: ignore[no-any-return]

    summary = threading.Thread(
        target=lambda: lazynn.summary(functools.partial(Waits, given), (2, 3))
    )
    summary.start()
    try:
        assert reached.wait(30)
        torch.randn(5, generator=given)  # (another thread's draws, meanwhile)
        after_theirs = given.get_state()
    finally:
        go.set()
        summary.join(30)
    # (its stream where their draws left it; its seed field, which the recording marks while
    # it runs, its own again)
    assert torch.equal(given.get_state()[8:], after_theirs[8:])
    assert given.initial_seed() == 7


class _IndexesALazyWeight(nn.Module):
    """``__init__`` steps that need a lazy layer's input size: an index along it, a copy of
    a tensor of the real shape (the factory's first run knows no size yet)."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(8)
        with torch.no_grad():
            if step == "index":
                self.fc.weight[:, 3].zero_()
            else:
                self.fc.weight.copy_(torch.ones(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", [*DOORS, "summary"])
@pytest.mark.parametrize("step", ["index", "copy"])
def test_a_step_in_init_that_needs_a_lazy_size_is_refused_naming_it(door: str, step: str) -> None:
    """Refused with the real cause (the step, the layer, its stand-in shape, the user's line)
    and a fix other than the call that failed, not torch's bare error about the stand-in;
    no generator moved."""
    before = torch.get_rng_state()
    factory = functools.partial(_IndexesALazyWeight, step)
    with pytest.raises(lazynn.UnbuiltError) as info:
        _ = lazynn.summary(factory, (2, 5)) if door == "summary" else through(door, factory, (2, 5))
    text = str(info.value)
    what = "Tensor.__getitem__" if step == "index" else "Tensor.copy_"
    where = "lazynn.summary(factory)" if door == "summary" else "lazynn.build(factory)"
    assert text.startswith(where + ": expected a factory whose __init__ steps")
    assert (
        f"received {what} on the 'weight' of LazyLinear (standing as a tensor of shape (8, " in text
    )
    assert "test_construction.py:" in text  # (the user's line)
    assert "lazynn.on_build(layer, fn)" in text
    assert torch.equal(torch.get_rng_state(), before)
