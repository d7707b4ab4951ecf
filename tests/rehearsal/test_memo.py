"""Memoized rehearsal: identical repeated blocks reuse one block's result.

The rehearsal with memoization must learn exactly what the plain rehearsal learns (every
module's call shapes, every lazy layer's sizes, every tensor), only faster.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
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
        self.extra = nn.Sequential(nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self.inner(x))  # type: ignore[no-any-return]


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
    "operators": lambda b: (
        len(b.extra + nn.Sequential(nn.ReLU())),
        len(nn.Sequential(nn.ReLU()) + b.extra),
        str(b.extra) == repr(b.extra),
        f"{b.inner}".startswith("_Inner("),
    ),
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


def test_blocks_reaching_one_module_through_a_shared_function_each_run() -> None:
    """Blocks alike but for a function they share that calls one module of the model (a
    router, a gate): each call reaches that module, so none is skipped (in the twin each block
    has its own copy of such a function, as the memo once saw them)."""

    class Router(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(lazynn.LazyLinear(8) for _ in range(3))
            self.k = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.k += 1
            return self.experts[(self.k - 1) % 3](x)  # type: ignore[no-any-return]

    class Block(nn.Module):
        def __init__(self, route: Any) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.route = route

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.route(self.fc(x))  # type: ignore[no-any-return]

    class Net(nn.Module):
        def __init__(self, how: str) -> None:
            super().__init__()
            self.router = router = Router()

            def route(x: torch.Tensor) -> torch.Tensor:
                return router(x)  # type: ignore[no-any-return]

            shared = {
                "closure": route,
                "method": router.__call__,
                "partial": functools.partial(router),
            }
            self.blocks = nn.ModuleList(Block(shared[how]) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    for how in ("closure", "method", "partial"):
        report = lazynn.summary(Net(how), (2, 8))
        calls = {r.path: r.calls for r in report.rows if r.path.startswith("router")}
        assert calls == {
            "router": 3,
            "router.experts": 0,
            **{f"router.experts.{i}": 1 for i in range(3)},
        }, how
        built = lazynn.build(Net(how), (2, 8))
        assert [e.in_features for e in built.router.experts] == [8, 8, 8]


def test_a_build_whose_forward_runs_blocks_on_other_threads_finishes() -> None:
    """A forward that runs blocks on worker threads, in a build (whose thread holds the build
    lock throughout): a worker that makes a skipped block's twin does not wait for that lock."""

    class Branch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    pool = concurrent.futures.ThreadPoolExecutor(2)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList(Branch() for _ in range(3))
            self.head = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            outs = [pool.submit(b, x[: i + 1]).result(30) for i, b in enumerate(self.branches)]
            return self.head(torch.cat(outs))  # type: ignore[no-any-return]

    try:
        done: list[nn.Module] = []
        thread = threading.Thread(target=lambda: done.append(lazynn.build(Net(), (3, 8))))
        thread.start()
        thread.join(60)
        assert done, "the build did not finish"
        assert done[0].head.in_features == 8
    finally:
        pool.shutdown(wait=False)


def test_a_build_of_another_model_meanwhile_does_not_rehearse_again() -> None:
    """Only a change to the block being made (checked by its fingerprint) reruns the
    rehearsal: another model built meanwhile (even in the forward) does not, so the forward
    runs once."""
    runs: list[int] = []

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(lazynn.LazyLinear(8), nn.ReLU()) for _ in range(3)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            runs.append(1)
            thread = threading.Thread(  # (another model, built by a first call)
                target=lambda: nn.Sequential(lazynn.LazyLinear(2))(torch.randn(1, 2))
            )
            thread.start()
            thread.join(30)
            for block in self.blocks:
                x = block(x)
            _ = self.blocks[2][1].inplace  # (a skipped block, made now)
            return x

    lazynn.summary(Net(), (2, 8))
    assert len(runs) == 1


def test_the_build_lock_says_whether_this_thread_holds_it() -> None:
    """``threading.RLock._is_owned`` (private to Python's threading; the rehearsal asks it
    whether its thread holds the build lock for the whole run)."""
    from lazynn._module.state import BUILD_LOCK

    seen: list[bool] = []
    assert not BUILD_LOCK._is_owned()  # type: ignore[attr-defined]
    with BUILD_LOCK:
        assert BUILD_LOCK._is_owned()  # type: ignore[attr-defined]
        thread = threading.Thread(target=lambda: seen.append(BUILD_LOCK._is_owned()))  # type: ignore[attr-defined]
        thread.start()
        thread.join(30)
    assert seen == [False]
