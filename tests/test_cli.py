"""The command line: ``python -m lazynn summary FILE.py:FACTORY --input SHAPE[:DTYPE] [--dtype]``.

Most cases call ``lazynn._cli.main(argv)`` in-process (fast); a few run the real command in
subprocesses, started together once per module (``runs``), to check exit statuses and that
errors print one line and no traceback.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lazynn
from lazynn._cli import main

ROOT = Path(__file__).resolve().parents[1]
DIGITS = "examples/digits.py:make_model"

NETS = '''\
"""Factories for the command-line tests."""
import torch
from torch import nn

import lazynn


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fuse = lazynn.LazyLinear(16)
        self.embed = nn.Embedding(50, 8)
        self.head = lazynn.LazyLinear(4)

    def forward(self, features, extra, tokens):
        hidden = torch.relu(self.fuse(torch.cat([features, extra], dim=-1)))
        return self.head(torch.cat([hidden, self.embed(tokens).mean(dim=1)], dim=-1))


def two_inputs():
    return TwoInputs()


def tiny():
    return nn.Sequential(lazynn.LazyLinear(3))


def broken():
    return nn.Sequential(lazynn.LazyConv2d(4, 5))


def raises():
    raise RuntimeError("bad config\\nsecond line of the detail")


def not_a_module():
    return 3
'''

CRASHES = 'raise ValueError("fails at import\\nsecond line of the detail")\n'


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    (folder / "crashes.py").write_text(CRASHES)
    path = folder / "nets.py"
    path.write_text(NETS)
    return path


def built_total(factory: object, *examples: object) -> int:
    assert callable(factory)
    model = lazynn.build(factory(), *examples)
    assert not lazynn.is_lazy(model)
    return sum(p.numel() for p in model.parameters())


def total_line(n: int) -> str:
    return f"Total params:         {n:,}"


def digits_total() -> int:
    pytest.importorskip("sklearn")
    namespace = runpy.run_path(str(ROOT / "examples" / "digits.py"), run_name="digits_test")
    return built_total(namespace["make_model"], (2, 1, 8, 8))


def nets_total(nets: Path) -> int:
    namespace = runpy.run_path(str(nets), run_name="nets_test")
    return built_total(namespace["two_inputs"], (2, 5), (2, 3), lazynn.Spec((2, 7), torch.long))


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lazynn: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# --- in-process -----------------------------------------------------------------------------


def test_main_digits(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    total = digits_total()
    monkeypatch.chdir(ROOT)
    assert main(["summary", DIGITS, "--input", "2x1x8x8"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "LazyConv2d -> Conv2d" in out
    assert total_line(total) in out.splitlines()
    assert out.splitlines()[0] == "Sequential: input [2, 1, 8, 8] -> output [2, 10]"
    # The command prints exactly what lazynn.summary gives (constructed on meta or not).
    namespace = runpy.run_path(str(ROOT / "examples" / "digits.py"), run_name="digits_test")
    assert out == str(lazynn.summary(namespace["make_model"](), (2, 1, 8, 8))) + "\n"


def test_main_several_inputs_and_long(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    argv = [
        "summary",
        f"{nets}:two_inputs",
        "--input",
        "2x5",
        "--input",
        "2x3",
        "--input",
        "2x7:long",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "TwoInputs: input [2, 5], [2, 3], [2, 7] int64 -> output [2, 4]"
    assert total_line(nets_total(nets)) in lines
    (embed,) = [line for line in lines if "(Embedding)" in line]
    assert embed.split()[2:6] == ["[2,", "7]", "int64", "[2,"]


def test_main_dtype(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    """--dtype sets the model's dtype for the summary only: 18 parameters of 2 or 4 bytes."""
    assert main(["summary", f"{nets}:tiny", "--input", "2x5", "--dtype", "float16"]) == 0
    half = capsys.readouterr().out.splitlines()
    assert torch.get_default_dtype() == torch.float32
    assert main(["summary", f"{nets}:tiny", "--input", "2x5"]) == 0
    full = capsys.readouterr().out.splitlines()
    assert total_line(18) in half
    assert total_line(18) in full
    assert "Parameter memory:     36 B" in half
    assert "Parameter memory:     72 B" in full


ERRORS = {
    "missing file": (
        ["examples/no_such_file.py:make_model", "--input", "2x3"],
        ["no such file", "no_such_file.py"],
    ),
    "no factory name": (["{nets}", "--input", "2x3"], ["FILE.py:FACTORY", "nets.py"]),
    "missing factory": (
        ["{nets}:no_such_factory", "--input", "2x3"],
        ["'no_such_factory'", "two_inputs"],
    ),
    "bad shape": (["{nets}:tiny", "--input", "2xax3"], ["--input", "'2xax3'"]),
    "negative dimension": (["{nets}:tiny", "--input", "2x-1"], ["'2x-1'"]),
    "bad input dtype": (["{nets}:tiny", "--input", "2x5:foo"], ["'foo'"]),
    "bad --dtype": (
        ["{nets}:tiny", "--input", "2x5", "--dtype", "float99"],
        ["--dtype", "'float99'"],
    ),
    "integer --dtype": (
        ["{nets}:tiny", "--input", "2x5", "--dtype", "int64"],
        ["--dtype", "floating-point", "'int64'"],
    ),
    "failing model": (
        ["{nets}:broken", "--input", "1x3x2x2"],
        ["LazyConv2d at '0'", "(1, 3, 2, 2)"],
    ),
    "failing model, float16": (
        ["{nets}:broken", "--input", "1x3x2x2", "--dtype", "float16"],
        ["LazyConv2d at '0'", "(1, 3, 2, 2)"],
    ),
    "not a module": (["{nets}:not_a_module", "--input", "2"], ["returned int", "nn.Module"]),
    "factory raises": (["{nets}:raises", "--input", "2"], ["raises()", "bad config"]),
    "file raises": (["{crashes}:make", "--input", "2"], ["crashes.py", "fails at import"]),
}


def fill(args: list[str], nets: Path) -> list[str]:
    return [a.format(nets=nets, crashes=nets.parent / "crashes.py") for a in args]


@pytest.mark.parametrize("case", list(ERRORS))
def test_main_errors(
    case: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
) -> None:
    args, fragments = ERRORS[case]
    monkeypatch.chdir(ROOT)
    code = main(["summary", *fill(args, nets)])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, *fragments)
    assert torch.get_default_dtype() == torch.float32


# --- subprocesses ---------------------------------------------------------------------------

RUNS = {
    "digits": [DIGITS, "--input", "2x1x8x8"],
    "several": ["{nets}:two_inputs", "--input", "2x5", "--input", "2x3", "--input", "2x7:long"],
    "missing file": ERRORS["missing file"][0],
    "missing factory": ERRORS["missing factory"][0],
    "bad shape": ERRORS["bad shape"][0],
    "bad --dtype": ERRORS["bad --dtype"][0],
    "failing model": ERRORS["failing model"][0],
}


@pytest.fixture(scope="module")
def runs(nets: Path) -> dict[str, tuple[int, str, str]]:
    """Every command of RUNS, run at once: name -> (exit status, stdout, stderr)."""
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "lazynn", "summary", *fill(args, nets)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in RUNS.items()
    }
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        results[name] = (process.returncode, out, err)
    return results


@pytest.mark.slow
def test_command_digits(runs: dict[str, tuple[int, str, str]]) -> None:
    code, out, err = runs["digits"]
    assert code == 0, err
    assert "Traceback" not in err
    assert "LazyConv2d -> Conv2d" in out
    assert "LazyLinear -> Linear" in out
    assert total_line(digits_total()) in out.splitlines()


@pytest.mark.slow
def test_command_several_inputs_and_long(runs: dict[str, tuple[int, str, str]], nets: Path) -> None:
    code, out, err = runs["several"]
    assert code == 0, err
    assert out.splitlines()[0] == "TwoInputs: input [2, 5], [2, 3], [2, 7] int64 -> output [2, 4]"
    assert total_line(nets_total(nets)) in out.splitlines()


@pytest.mark.parametrize(
    "case", ["missing file", "missing factory", "bad shape", "bad --dtype", "failing model"]
)
@pytest.mark.slow
def test_command_errors(case: str, runs: dict[str, tuple[int, str, str]]) -> None:
    code, out, err = runs[case]
    assert_one_line_error(code, out, err, *ERRORS[case][1])


def test_file_can_import_its_neighbours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "helpers.py").write_text("WIDTH = 7\n")
    (tmp_path / "net.py").write_text(
        "import lazynn\nfrom helpers import WIDTH\n\n\n"
        "def make():\n    return lazynn.LazyLinear(WIDTH)\n"
    )
    assert main(["summary", f"{tmp_path / 'net.py'}:make", "--input", "2x3"]) == 0
    assert "weight [7, 3]" in capsys.readouterr().out
    assert str(tmp_path) not in sys.path


def test_a_shape_too_large_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "summary",
            "examples/digits.py:make_model",
            "--input",
            "99999999999999x99999999999x999999x99999",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("lazynn: error:")
