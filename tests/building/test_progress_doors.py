"""The progress bar where it is meant to appear on its own: in a terminal (a pseudo-terminal
here) for a large model, on every door that allocates; on rank 0 only of a distributed job."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr
from typing import Any

import pytest

from distributed_util import Report, run_ranks

#: a factory of 50,005,000 parameters: just over the bar's threshold (50M)
_SCRIPT = textwrap.dedent(
    """
    import sys, torch, lazynn
    from torch import nn

    def net():
        return nn.Sequential(lazynn.LazyLinear(5000))

    door = sys.argv[1]
    if door == "factory":
        lazynn.build(net, (1, 10000))
    elif door == "threads":
        lazynn.build(net, (1, 10000), threads=2)
    elif door == "instance":
        lazynn.build(net(), (1, 10000))
    else:
        lazynn.materialize(lazynn.build(net, (1, 10000), device="meta"))
    print("built", file=sys.stderr)
    """
)


def _stderr_of(door: str, terminal: bool) -> str:
    """What the script's stderr shows: a pseudo-terminal's, or a pipe's."""
    command = [sys.executable, "-c", _SCRIPT, door]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(command, stderr=follower, stdout=subprocess.DEVNULL)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # (the terminal closed: the process ended)
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


@pytest.mark.slow
@pytest.mark.parametrize("door", ["factory", "threads", "instance", "materialize"])
def test_a_large_model_in_a_terminal_shows_the_bar_on_every_door(door: str) -> None:
    shown = _stderr_of(door, terminal=True)
    assert "[####################] 100% 50M/50M parameters" in shown, shown
    assert shown.rstrip().endswith("built")
    assert "####" not in _stderr_of(door, terminal=False)  # (piped: no bar)


def _rank_worker(rank: int, world: int) -> Report:
    import torch
    from torch import nn

    import lazynn

    model = lazynn.build(lambda: nn.Sequential(lazynn.LazyLinear(8)), (2, 4), device="meta")
    err = io.StringIO()
    with redirect_stderr(err):
        lazynn.materialize(model, progress=True)
    return {"err": err.getvalue(), "built": not model[0].weight.is_meta, "torch": torch.__version__}


@pytest.mark.slow
@pytest.mark.distributed
def test_in_a_distributed_job_rank_zero_alone_draws_the_bar() -> None:
    ranks: list[Any] = sorted(
        run_ranks(_rank_worker, world=2, timeout=120), key=lambda r: r["rank"]
    )
    assert all(r["built"] for r in ranks)
    assert "lazynn.materialize [####################] 100% 40/40 parameters" in ranks[0]["err"]
    assert ranks[1]["err"] == ""
