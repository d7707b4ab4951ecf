"""docs/when-to-build.md's "Replacing seed checkpoints": examples/titan.py, a torchtitan-style
llama3 trainer, gives every rank one eager construction's numbers through lazynn, where
torchtitan's own flow does not; and each rank allocates its shards only."""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import torch
from test_examples import warnings_in
from torch.distributed.device_mesh import init_device_mesh

import lazynn
from allocations import CHUNK_BYTES, Allocations
from distributed_util import Report, run_ranks
from paths import EXAMPLES, ROOT

sys.path.insert(0, str(EXAMPLES))
import titan

pytestmark = pytest.mark.distributed

#: the model's size: 39 parameters and the freqs_cis buffer, 898 KiB of parameters
TENSORS, FULL_KIB = 40, 898


def _lines(stdout: str, what: str) -> list[str]:
    """The report's lines for one flow, rank 0's first."""
    lines = [line for line in stdout.splitlines() if line.split(": ")[1:2] == [what]]
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1"], stdout
    return lines


@pytest.fixture(scope="module")
def report() -> str:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "titan.py")], capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert warnings_in(run.stderr) == [], run.stderr  # a shipped example runs clean
    return run.stdout


@pytest.mark.parametrize("flow", ["lazynn + FSDP2", "lazynn + TP"])
def test_lazynn_gives_every_rank_the_eager_numbers_and_half_the_model(
    report: str, flow: str
) -> None:
    for line in _lines(report, flow):
        assert f": {TENSORS} of {TENSORS} tensors equal eager;" in line, line
        assert "same generator after: True" in line, line
        held = int(line.split("holds ")[1].split(" KiB")[0])
        assert f"KiB of {FULL_KIB} KiB" in line, line
        assert abs(held - FULL_KIB / 2) <= 2, line  # its half of every sharded parameter


def test_lazynn_trains_as_one_process(report: str) -> None:
    for line in _lines(report, "lazynn + FSDP2"):
        ours = [float(v) for v in line.split("losses ")[1].split(" (")[0].split(", ")]
        single = [float(v) for v in line.split("one process: ")[1].split(")")[0].split(", ")]
        assert ours == single, line  # to the 4 digits printed
        assert ours[-1] < ours[0], line


def test_a_reseeding_factory_gives_torchtitans_single_process_numbers(report: str) -> None:
    for line in _lines(report, "lazynn + FSDP2, reseeded factory"):
        assert f"{TENSORS} of {TENSORS} tensors equal torchtitan's one-process init" in line
        assert "same generator after: True" in line, line


def test_torchtitans_flow_differs_from_eager_and_from_its_own_single_process_init(
    report: str,
) -> None:
    for line in _lines(report, "torchtitan (meta, fully_shard, to_empty, init_weights)"):
        found = re.search(
            r"(\d+) of (\d+) tensors differ from eager, (\d+) from torchtitan's one-process "
            r"init; (\d+) repeat rank 0's shard on every rank",
            line,
        )
        assert found, line
        eager, total, own, repeated = map(int, found.groups())
        assert total == TENSORS
        # every drawn tensor: 30 (the 9 RMSNorm weights and freqs_cis are not random)
        assert eager == own == repeated == 30, line
        assert "torch warned: DTensor random operators may not have complete support" in line
    assert "lazynn equals the reference on every rank: True" in report


def _masked(line: str) -> str:
    """A report line without its loss values, which may move in the last digit printed
    between torch releases (they are checked against one process's above)."""
    return re.sub(r"; losses .*", "; losses ...", line)


def test_the_page_shows_the_report_as_printed(report: str) -> None:
    page = (ROOT / "docs" / "when-to-build.md").read_text()
    shown = page.split("`python examples/titan.py` runs it")[1].split("```text\n")[1]
    shown_lines = shown.split("```")[0].splitlines()
    printed = [_masked(line) for line in report.splitlines()]
    rank1 = "rank 1: ...the same four lines for rank 1"
    assert rank1 in shown_lines
    assert [_masked(line) for line in shown_lines if line != rank1] == [
        line for line in printed if not line.startswith("rank 1: ")
    ]
    # rank 1's lines are rank 0's
    assert [line.replace("rank 1: ", "rank 0: ", 1) for line in printed if "rank 1: " in line] == [
        line for line in printed if line.startswith("rank 0: ")
    ]


def _peaks(rank: int, world: int) -> Report:
    """On each rank: what ``build(device="meta")`` and then ``materialize`` allocate, for the
    example's FSDP2 and tensor-parallel models."""
    mesh = init_device_mesh("cpu", (world,))
    report: Report = {}
    for flow, shard in (
        ("fsdp", titan.apply_fsdp),
        ("tp", functools.partial(titan.apply_tp, mesh=mesh)),
    ):
        torch.manual_seed(0)
        with Allocations() as building:
            model = lazynn.build(functools.partial(titan.make, titan.ARGS), device="meta")
        shard(model)
        with Allocations() as materializing:
            lazynn.materialize(model, "cpu")
        report[flow] = {
            "build": building.peak,
            "peak": materializing.peak,
            "held": titan.held(model) + sum(b.numel() * b.element_size() for b in model.buffers()),
        }
    return report


def test_each_rank_allocates_its_shards_and_temporaries_never_the_model() -> None:
    for ranks in run_ranks(_peaks):
        for flow in ("fsdp", "tp"):
            r = ranks[flow]
            assert r["build"] == 0, r  # the meta build allocates nothing
            # its shards and the RoPE buffer, and no more than one chunk of temporaries at once
            # (docs/when-to-build.md, FSDP2); here, far less: about 500 KiB in all, where the
            # model is 898 KiB
            assert r["held"] <= r["peak"] <= r["held"] + CHUNK_BYTES, (flow, r)
            assert r["peak"] < 0.6 * FULL_KIB * 2**10, (flow, r)
