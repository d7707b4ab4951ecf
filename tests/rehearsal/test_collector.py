"""The cycle collector paused while rehearsals run (src/lazynn/_rehearsal/collector.py): once
for concurrent rehearsals, resumed by the last, left off where the user had turned it off."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import lazynn
from lazynn._rehearsal.collector import paused


def test_overlapping_rehearsals_resume_the_collector_when_the_last_one_ends() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with paused():
            inside.set()
            release.wait(timeout=30)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(timeout=30)
    with paused():  # (the second one ends first: the first is still running)
        assert not gc.isenabled()
    assert not gc.isenabled()
    release.set()
    thread.join(timeout=30)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
        lazynn.summary(torch.nn.Sequential(lazynn.LazyLinear(3)), (2, 4))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_build_and_summary_leave_the_collector_running() -> None:
    model = torch.nn.Sequential(lazynn.LazyLinear(3), torch.nn.ReLU())
    lazynn.summary(model, (2, 4))
    assert gc.isenabled()
    lazynn.build(model, (2, 4))
    assert gc.isenabled()


@pytest.mark.parametrize("run", ["build", "summary"])
def test_a_rehearsal_leaves_no_cycles_for_the_collector(run: str) -> None:
    """The rehearsal's hooks and forwards come off the twin when it is done (Twin.release):
    what the rehearsal made is freed as it is dropped, not left to a collection (which walks
    every object made since the last one). A BatchNorm (its shape-only forward is bound to it) and
    repeated blocks (memoized forwards) included. (A summary's FLOP counter leaves torch's
    own: pytree's self-referencing helper functions, no module, tensor or dict.)"""
    from torch import nn

    def block() -> nn.Module:
        return nn.Sequential(
            lazynn.LazyConv2d(4, 3, padding=1), lazynn.LazyBatchNorm2d(), nn.ReLU()
        )

    def model_() -> nn.Module:
        return nn.Sequential(block(), block(), block(), nn.Flatten(), lazynn.LazyLinear(3))

    # (once before: the layouts it needs are remembered then, and a cache that makes room
    # drops nothing during the run measured; what earlier code left is collected)
    lazynn.summary(lazynn.build(model_(), (2, 3, 8, 8)), (2, 3, 8, 8))
    model = model_()
    if run == "summary":
        lazynn.build(model, (2, 3, 8, 8))
    gc.collect()
    gc.disable()
    # (what existed before the run, which the run may free: an earlier test's objects, let go
    # of by something during it, are not the run's)
    before = {id(o) for o in gc.get_objects()}
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        if run == "build":
            lazynn.build(model, (2, 3, 8, 8))
        else:
            lazynn.summary(model, (2, 3, 8, 8))
        gc.collect()
        left = [o for o in gc.garbage if id(o) not in before]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    if run == "build":
        assert left == []
    kept = [type(o).__name__ for o in left if isinstance(o, (nn.Module, torch.Tensor, dict))]
    assert kept == []
