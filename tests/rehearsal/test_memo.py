"""Memoized rehearsal: identical repeated blocks reuse one block's result.

The rehearsal with memoization must learn exactly what the plain rehearsal learns (every
module's call shapes, every lazy layer's sizes, every tensor), only faster.
"""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from lazynn._module.tensors import is_placeholder
from lazynn._rehearsal.hollow import is_hollow
from lazynn._rehearsal.learnt import Rehearsal
from lazynn._rehearsal.rehearse import rehearse
from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import models

CASES = {
    **{name: (ref.lazy, ref.example) for name, ref in models.REFERENCE.items()},
    "llama_tiny": models.LAZY_ONLY["llama_tiny"],
}


def learnt(model: nn.Module, r: Rehearsal) -> dict[str, object]:
    paths = {id(m): p for p, m in model.named_modules()}
    return {
        "calls": {p: (c.inputs, c.outputs) for p, c in r.calls.items()},
        "types": r.types,
        "tensors": {
            p: [(i.name, i.shape, i.dtype, i.requires_grad) for i in t]
            for p, t in r.tensors.items()
        },
        "sizes": {paths[id(m)]: s for m, s in r.sizes.items()},
        "unreached": r.unreached,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_memoized_rehearsal_learns_the_same(name: str) -> None:
    factory, example = CASES[name]
    model = factory()
    x = example("cpu")
    plain = learnt(model, rehearse(model, (x,), {}, memoize=False))
    memo = learnt(model, rehearse(model, (x,), {}, memoize=True))
    assert memo == plain


def test_identical_blocks_are_skipped() -> None:
    calls: list[int] = []

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return self.fc(x)

    model = nn.Sequential(*[Block() for _ in range(6)])
    r = rehearse(model, ((2, 8),), {})
    assert len(calls) == 1  # one block ran; five reused its result
    assert len(r.sizes) == 6
    assert all(s == {"in_features": 8} for s in r.sizes.values())
    built = lazynn.build(model, (2, 8))
    assert all(type(b.fc) is nn.Linear for b in built)


def test_blocks_that_differ_or_carry_hooks_run() -> None:
    calls: list[int] = []

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return self.fc(x)

    model = nn.Sequential(Block(8), Block(8), Block(8), Block(4))
    model[1].register_forward_hook(lambda m, a, o: None)
    rehearse(model, ((2, 8),), {})
    # block 0 runs, 1 carries a hook so it runs, 2 reuses 0's result, 3 differs so it runs
    assert len(calls) == 3


def test_training_mode_is_part_of_a_block_identity() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y if self.training else y[:, :2]

    model = nn.Sequential(Block(), Block(), lazynn.LazyLinear(3))
    model[1].eval()
    plain = learnt(model, rehearse(model, ((2, 8),), {}, memoize=False))
    memo = learnt(model, rehearse(model, ((2, 8),), {}, memoize=True))
    assert memo == plain
    assert memo["sizes"]["2"] == {"in_features": 2}


# --- the twins of skipped blocks, made on their first touch (_rehearsal/hollow.py) ----------
class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(8)
        self.norm = nn.LayerNorm(8)
        self.parts = nn.ModuleList([nn.ReLU(), nn.Dropout(0.1)])
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.fc(x)) * self.scale
        for part in self.parts:
            x = part(x)
        return x


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)  # type: ignore[no-any-return]


class _Log:
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.hollow_after: list[bool] = []


class _Stack(nn.Module):
    """Six identical blocks; ``touch`` reads block 3 before any block runs, ``widths`` the
    input width of each block's call (a different one: a call the memo cannot answer)."""

    def __init__(self, touch: Any = None, widths: tuple[int, ...] = (8,) * 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(6))
        self.touch, self.widths = touch, widths
        self.log = _Log()  # (shared with the twin: an object of another type than a list)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.touch is not None:
            self.log.seen.append(self.touch(self.blocks[3]))
        for block, width in zip(self.blocks, self.widths, strict=True):
            x = block(x[..., :width])
        self.log.hollow_after = [is_hollow(b.inner) for b in self.blocks]
        return x


TOUCHES = {
    "attribute": lambda b: (b.inner.scale, b.inner.fc.out_features, b.inner.norm.eps),
    "repr": lambda b: repr(b),
    "isinstance": lambda b: (
        isinstance(b.inner, _Inner),
        isinstance(b.inner, nn.Module),
        isinstance(b.inner, nn.Sequential),
    ),
    "class": lambda b: (b.inner.__class__.__name__, b.inner.parts.__class__.__name__),
    "named parameters": lambda b: [(n, p.device.type) for n, p in b.named_parameters()],
    "state dict": lambda b: sorted(b.state_dict()),
    "len, iter, index": lambda b: (len(b.inner.parts), [type(m) for m in b.inner.parts]),
    "bool, contains, reversed": lambda b: (
        bool(b.inner.parts),
        b.inner.parts[0] in b.inner.parts,
        [type(m).__name__ for m in reversed(b.inner.parts)],
    ),
    "dir": lambda b: "norm" in dir(b.inner) and "forward" in dir(b.inner.norm),
    "write": lambda b: setattr(b.inner.norm, "eps", 1e-3) or b.inner.norm.eps,
    "call": lambda b: tuple(b.inner.norm(torch.empty(2, 8)).shape),
    "deepcopy": lambda b: repr(copy.deepcopy(b.inner.norm)),
    "modules": lambda b: [type(m).__name__ for m in b.modules()],
}


@pytest.mark.parametrize("touch", list(TOUCHES))
def test_a_skipped_blocks_twin_answers_any_touch_as_a_made_one(touch: str) -> None:
    """Below a block like an earlier one the twin is left hollow; whatever the forward does
    with it (read, write, call, repr, isinstance, iterate, copy) it answers as the twin made at
    once would (a rehearsal without the memo), the rehearsal learns the same, and the model is
    untouched."""
    answers, learned = [], []
    model = _Stack(TOUCHES[touch])
    before = {k: v.clone() for k, v in model.state_dict().items() if not is_placeholder(v)}
    for memoize in (False, True):
        r = rehearse(model, (torch.empty(2, 8),), {}, memoize=memoize)
        answers.append(model.log.seen.pop())
        learned.append(learnt(model, r))
    assert answers[0] == answers[1]
    assert learned[0] == learned[1]
    assert model.blocks[3].inner.norm.eps == 1e-5
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_skipped_blocks_twins_are_not_made() -> None:
    """The saving itself: after a run, the blocks the memo skipped are still hollow, but for
    the one a touch made; the first block, which ran, was made."""
    model = _Stack()
    rehearse(model, (torch.empty(2, 8),), {})
    assert model.log.hollow_after == [False, True, True, True, True, True]
    model = _Stack(TOUCHES["attribute"])
    rehearse(model, (torch.empty(2, 8),), {})
    assert model.log.hollow_after == [False, True, True, False, True, True]
    model = _Stack(TOUCHES["isinstance"])  # (answered by its class: nothing made)
    rehearse(model, (torch.empty(2, 8),), {})
    assert model.log.hollow_after == [False, True, True, True, True, True]
    rehearse(model, (torch.empty(2, 8),), {}, memoize=False)
    assert model.log.hollow_after == [False] * 6


def test_a_skipped_block_called_as_no_earlier_one_is_made_and_runs() -> None:
    """A block like an earlier one, called with another input (the memo cannot answer): made
    when called, it runs and its lazy layers learn their own sizes."""
    model = _Stack(widths=(8, 8, 4, 8, 3, 8))
    r = rehearse(model, (torch.empty(2, 8),), {})
    assert model.log.hollow_after == [False, True, False, True, False, True]
    assert learnt(model, r) == learnt(
        model, rehearse(model, (torch.empty(2, 8),), {}, memoize=False)
    )
    sizes = {p: s for p, s in learnt(model, r)["sizes"].items()}  # type: ignore[union-attr]
    assert sizes["blocks.2.inner.fc"] == {"in_features": 4}
    assert sizes["blocks.4.inner.fc"] == {"in_features": 3}
    built = lazynn.build(_Stack(widths=(8, 8, 4, 8, 3, 8)), (2, 8))
    assert [b.inner.fc.in_features for b in built.blocks] == [8, 8, 4, 8, 3, 8]


def test_a_skipped_block_a_hook_kept_is_made_when_touched_after_the_run() -> None:
    """A global hook keeps the skipped blocks (they are called); touched after the build, a
    block is made then: a working meta module, its sizes those of the block that ran."""
    kept: list[nn.Module] = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: kept.append(m))
    try:
        model = lazynn.build(_Stack(), (2, 8))
    finally:
        handle.remove()
    blocks = [m for m in kept if isinstance(m, _Block) and m not in set(model.modules())]
    assert len(blocks) == 6
    assert is_hollow(blocks[4].inner)
    assert "LayerNorm((8,)" in repr(blocks[4])
    assert [p.device.type for p in blocks[4].parameters()] == ["meta"] * 4
    assert blocks[4].inner.norm(torch.empty(3, 8, device="meta")).shape == (3, 8)
    assert blocks[5].inner.fc.in_features == 8  # (made from the model as it is now: built)


class _Gate:
    """The first forward to reach it waits for ``built`` (after setting ``entered``)."""

    def __init__(self) -> None:
        self.armed = True
        self.entered, self.built = threading.Event(), threading.Event()
        self.classes: list[tuple[str, str]] = []


class _Peeking(nn.Module):
    def __init__(self, gate: _Gate) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(6))
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = type(self.blocks[0].inner.fc).__name__
        if self.gate.armed:
            self.gate.armed = False
            self.gate.entered.set()
            assert self.gate.built.wait(30)
        self.gate.classes.append((first, type(self.blocks[3].inner.fc).__name__))
        for block in self.blocks:
            x = block(x)
        return x


def test_a_skipped_block_touched_after_another_thread_built_the_model_is_not_mixed_in() -> None:
    """A summary's twin is made in parts (a skipped block when touched). Another thread
    builds the model between the parts (forced: the summary's forward waits for the build):
    the block is not made from the built model beside the rest made from the unbuilt one;
    the rehearsal runs again on a twin made at once, which sees one model."""
    gate = _Gate()
    model = _Peeking(gate)
    report: list[Any] = []
    thread = threading.Thread(target=lambda: report.append(lazynn.summary(model, (2, 8))))
    thread.start()
    assert gate.entered.wait(30)
    lazynn.build(model, (2, 8))  # (its own rehearsal passes the disarmed gate)
    gate.built.set()
    thread.join(30)
    assert not thread.is_alive()
    assert report  # (the summary succeeded)
    assert gate.classes[-1] == ("Linear", "Linear")  # (its last run: one model, built)
    assert all(a == b for a, b in gate.classes)
