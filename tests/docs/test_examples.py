"""The README's main job: the digits example trains a fully lazy CNN to a useful accuracy."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from paths import EXAMPLES

#: a warning on stderr: Python's (``UserWarning: ...``), c10d's (``Warning: ...``), or a line
#: of torch's logging at level WARNING (``[rank0]:W1201 21:17:16.547000 ...``)
WARNING = re.compile(r"warn|^(\[rank\d+\]:)?\[?W\d{4} ", re.IGNORECASE)


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if WARNING.search(line)]


def _load(name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("line", "warns"),
    [
        ("/x/_fsdp_state.py:331: UserWarning: FSDP2-wrapped module (FSDPNet) returned a view", 1),
        ("[rank2]:W1201 21:17:16.547000 21146 torch/distributed/tensor/_redistribute.py:390] ", 1),
        ("[W1201 21:19:07.320755555 ProcessGroup.cpp:390] Warning: At the time of process", 1),
        ("rank 0: allocated 35.2 KiB of 139.8 KiB; equals the eager twin: True", 0),
    ],
)
def test_warnings_in_finds_each_kind_of_warning_line(line: str, warns: int) -> None:
    assert len(warnings_in(line)) == warns


def test_digits_example_learns(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn")
    digits = _load("digits")
    accuracy = digits.main(epochs=2)  # type: ignore[attr-defined]
    assert accuracy > 0.9
    out = capsys.readouterr().out
    assert "LazyConv2d(?, 16" in out
    assert "Conv2d(1, 16" in out
    assert "every layer is plain torch.nn: True" in out


@pytest.mark.distributed
def test_fsdp_example_shards_and_equals_eager() -> None:
    """docs/when-to-build.md's FSDP2 recipe, run as the docs say: 2 processes, gloo."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "fsdp.py")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert warnings_in(run.stderr) == [], run.stderr  # a shipped example runs clean
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout
    for rank, line in enumerate(lines):
        # each rank holds half of the parameters, and the gathered shards equal the eager twin
        assert line.startswith(f"rank {rank}: allocated 261 KiB of 522 KiB"), line
        assert "equals the eager twin: True" in line, line
        losses = [float(v) for v in line.split("losses ")[1].split(", ")]
        assert losses[-1] < losses[0]


@pytest.mark.distributed
def test_tp_2d_example_shards_equals_eager_and_trains_as_one_process() -> None:
    """docs/when-to-build.md's 2-D recipe, run as the docs say: 4 processes, gloo."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "tp_2d.py")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert warnings_in(run.stderr) == [], run.stderr  # a shipped example runs clean
    lines = run.stdout.splitlines()
    assert len(lines) == 4, run.stdout
    for rank, line in enumerate(lines):
        mine = float(line.split("allocated ")[1].split(" KiB")[0])
        full = float(line.split(" of ")[1].split(" KiB")[0])
        assert mine < full / 3, line  # a quarter of each sharded parameter, the norms' halves
        assert line.startswith(f"rank {rank}: "), line
        assert "equals the eager twin: True" in line, line
        ours = [float(v) for v in line.split("losses ")[1].split(" (")[0].split(", ")]
        single = [float(v) for v in line.split("one process: ")[1].split(")")[0].split(", ")]
        assert ours == single, line  # to the 4 digits printed
        assert ours[-1] < ours[0]
