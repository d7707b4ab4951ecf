"""The cycle collector paused while rehearsals run (src/lazynn/_rehearsal/collector.py): once
for concurrent rehearsals, resumed by the last, left off where the user had turned it off."""

from __future__ import annotations

import gc
import threading

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
