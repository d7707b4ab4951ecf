"""The command line: ``lazynn summary TARGET --input SHAPE[:DTYPE] [--dtype]`` (also run as
``python -m lazynn``), TARGET being ``FILE.py:NAME``, ``MODULE:NAME`` or either with literal
arguments, ``FILE.py:NAME(2, width=64)``.

Most cases call ``lazynn._cli.main.main(argv)`` in-process (fast); a few run the real command in
subprocesses, started together once per module (``runs``), to check exit statuses and that
errors print one line and no traceback.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import lazynn
from lazynn._cli.fixes import cli_line, one_line
from lazynn._cli.main import main
from lazynn._errors import Fix, LazynnError, message, with_note
from paths import ROOT

DIGITS = "examples/digits.py:make_model"

NETS = '''\
"""Factories for the command-line tests."""
import os
from typing import Any

import torch
from torch import nn

import lazynn
from lazynn import LazyLinear


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
    raise RuntimeError("bad config\\nsecond line of the detail")  # RAISES


def not_a_module():
    return 3


def conv():
    return nn.Sequential(lazynn.LazyConv2d(4, 3))


def embed():
    return nn.Sequential(nn.Embedding(10, 4), LazyLinear(3))


def sized(width, depth=1, *, bias=True, name="a:b"):
    assert name.count(":") == 1, name
    return nn.Sequential(*[LazyLinear(width, bias=bias) for _ in range(depth)])


def blocks():
    return nn.Sequential(*[nn.Sequential(LazyLinear(8), nn.ReLU()) for _ in range(4)])


class Tied(nn.Module):
    """nanoGPT's tie, its head lazy; and timm's stochastic-depth line."""

    def __init__(self):
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, 3)]
        self.wte = nn.Embedding(10, 8)
        self.head = LazyLinear(10, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx):
        return self.head(self.wte(idx))


def normed():
    return nn.Sequential(LazyLinear(4), nn.BatchNorm1d(4))


def _private():
    return tiny()


class Stack(nn.Sequential):
    @classmethod
    def of(cls, width):
        return cls(LazyLinear(width))


class Faulty(nn.Module):
    def forward(self, x):
        raise ValueError("the faulty forward")  # FAULTY


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = LazyLinear(2)

    def forward(self, x):
        if x.sum() > 0:  # BRANCHY
            x = -x
        return self.fc(x)


class LanguageModel(nn.Module):
    """forward(tokens, (h0, c0)): the state is a tuple."""

    def __init__(self, vocab=50, hidden=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.lstm = lazynn.LazyLSTM(hidden, num_layers=2, batch_first=True)
        self.head = LazyLinear(vocab)

    def forward(self, tokens, state):
        out, state = self.lstm(self.embed(tokens), state)
        return self.head(out), state


class Initialized(nn.Module):
    """Init code the instance form refuses: the factory form runs it."""

    def __init__(self):
        super().__init__()
        self.conv = lazynn.LazyConv2d(4, 3)
        self.head = LazyLinear(2)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
        self.fan_in = self.conv.in_channels * 9

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))
'''

CRASHES = 'raise ValueError("fails at import\\nsecond line of the detail")\n'
CHATTY = """\
import lazynn
from torch import nn

print("the file prints at import")


class Chatty(nn.Sequential):
    def forward(self, x):
        print("the forward prints")
        return super().forward(x)


def make():
    print("the factory prints")
    return Chatty(lazynn.LazyLinear(3))
"""


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    (folder / "crashes.py").write_text(CRASHES)
    (folder / "chatty.py").write_text(CHATTY)
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


def test_a_target_whose_init_code_needs_sizes_is_summarized(
    capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    """The target is constructed as lazynn.build's factory form constructs (on meta only)."""
    assert main(["summary", f"{nets}:Initialized", "--input", "1x3x8x8"]) == 0
    out = capsys.readouterr().out
    assert total_line(3 * 4 * 9 + 4 + 4 * 36 * 2 + 2) in out


def test_a_target_with_a_tied_lazy_head_and_values_read_in_init_is_summarized(
    capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    assert main(["summary", f"{nets}:Tied", "--input", "Bx3:long"]) == 0
    out = capsys.readouterr().out
    assert total_line(80) in out  # (the tied weight once)


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
    "no factory name": (["{nets}", "--input", "2x3"], ["FILE.py:NAME", "MODULE:NAME", "nets.py"]),
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
    "quantized input dtype": ["{nets}:tiny", "--input", "2x5:qint8"],
    "a dimension beyond int64": ["{nets}:tiny", "--input", "99999999999999999999x3x224x224"],
    "float8 --dtype": ["{nets}:tiny", "--input", "2x5", "--dtype", "float8_e4m3fn"],
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


@pytest.mark.parametrize(
    "case", ["quantized input dtype", "a dimension beyond int64", "float8 --dtype"]
)
@pytest.mark.slow
def test_command_input_errors(case: str, runs: dict[str, tuple[int, str, str]]) -> None:
    """No warning, C++ frame or traceback on stderr: the one line alone, exit status 2."""
    code, out, err = runs[case]
    assert_one_line_error(code, out, err, *INPUT_ERRORS[case][1])


def test_file_can_import_its_neighbours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "helpers.py").write_text("WIDTH = 7\n")
    (tmp_path / "net.py").write_text(
        "import lazynn\nfrom helpers import WIDTH\n\n\n"
        "def make():\n    return lazynn.LazyLinear(WIDTH)\n"
    )
    assert main(["summary", f"{tmp_path / 'net.py'}:make", "--input", "2x3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "LazyLinear: input [2, 3] -> output [2, 7]"
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


# --- version, targets, factory arguments ------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"lazynn {lazynn.__version__} ")
    assert torch.__version__ in out


def test_help_names_the_target_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["summary", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for fragment in ["FILE.py:NAME", "MODULE:NAME", "NAME(2, width=64)", "--input", "--dtype"]:
        assert fragment in out
    assert "--input '(2x4x32, 2x4x32)'" in out  # the epilog's example of a tuple argument


def test_factory_arguments(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """lazy_llama takes its configuration: literal arguments in Python call syntax."""
    monkeypatch.chdir(ROOT)
    call = "lazy_llama(2, 32, n_heads=4, d_ff=64, vocab=100, n_kv_heads=None)"
    assert main(["summary", f"examples/models.py:{call}", "--input", "1x16:long"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[0].startswith("LazyLlama: input [1, 16] int64 -> output [1, 16, 100]")
    namespace = runpy.run_path(str(ROOT / "examples" / "models.py"), run_name="models_test")
    factory = namespace["lazy_llama"]
    total = built_total(lambda: factory(2, 32, 4, 64, 100), lazynn.Spec((1, 16), torch.long))
    assert total_line(total) in out.splitlines()


@pytest.mark.parametrize(
    ("call", "total"),
    [
        ("sized(6)", 36),
        ("sized( 6 , depth=2, bias=False )", 5 * 6 + 6 * 6),
        ("sized(6, name='x:y')", 36),  # a colon in a string argument
        ("sized(*(6,))", None),
    ],
)
def test_factory_argument_forms(
    call: str, total: int | None, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    code = main(["summary", f"{nets}:{call}", "--input", "2x5"])
    out, err = capsys.readouterr()
    if total is None:
        assert_one_line_error(code, out, err, "*arguments are not supported")
        return
    assert code == 0, err
    assert out.splitlines()[0] == "Sequential: input [2, 5] -> output [2, 6]"
    assert total_line(total) in out.splitlines()


def test_module_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MODULE:NAME imports MODULE (the current folder first, as `python -m` does)."""
    package = tmp_path / "clipkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    for name in ["clipkg", "clipkg.nets"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["summary", "clipkg.nets:sized(7)", "--input", "2x3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Sequential: input [2, 3] -> output [2, 7]"
    assert str(tmp_path) not in sys.path
    code = main(["summary", "clipkg.nets:TwoInputs.nope", "--input", "2x3"])
    assert_one_line_error(code, *capsys.readouterr(), "'TwoInputs.nope'")


MODULE_ERRORS = {
    "missing module": ("no_such_module_xyz.nets:f", ["no such file or module", "no_such_module"]),
    "missing submodule": ("json.no_such_part:f", ["no such file or module", "json.no_such_part"]),
    "module raises": ("{module}:f", ["failed to import", "fails at import"]),
    "missing attribute": ("json:no_such", ["json has no callable 'no_such'", "loads"]),
    "missing path": ("no/such/folder:f", ["no such file: no/such/folder"]),
}


@pytest.mark.parametrize("case", list(MODULE_ERRORS))
def test_module_errors(
    case: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, fragments = MODULE_ERRORS[case]
    (tmp_path / "cli_crashes_at_import.py").write_text(CRASHES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cli_crashes_at_import", raising=False)
    target = target.format(module="cli_crashes_at_import")
    code = main(["summary", target, "--input", "2"])
    assert_one_line_error(code, *capsys.readouterr(), *fragments)


FACTORY_ERRORS = {
    "non-literal argument": ("sized(width)", ["must be Python literals", "'width' for argument 1"]),
    "non-literal keyword": ("sized(6, depth=2 + n)", ["'2 + n' for depth"]),
    "call in an argument": ("sized(int('6'))", ["Python literals", "int('6')"]),
    "**arguments": ("sized(**{'width': 6})", ["**arguments are not supported"]),
    "missing arguments": ("sized", ["sized() failed", "Fix: pass its arguments", "(width"]),
    "wrong arguments": ("sized(6, nope=1)", ["'nope'", "its signature: sized(width"]),
    "not a call": ("sized[0]", ["expected TARGET", "MODULE:NAME"]),
    "a repeated keyword": ("sized(width=6, width=7)", ["keyword argument repeated: width"]),
    "3,000 nested signs": ("sized(" + "-" * 3000 + "1)", ["nests too deeply", "RecursionError"]),
    "3,000 nested nots": ("sized(" + "not " * 3000 + "1)", ["nests too deeply"]),
    "a deep literal": ("sized(" + "-" * 900 + "1)", ["must be Python literals"]),
}


@pytest.mark.parametrize("case", list(FACTORY_ERRORS))
def test_factory_argument_errors(case: str, capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    call, fragments = FACTORY_ERRORS[case]
    code = main(["summary", f"{nets}:{call}", "--input", "2x5"])
    assert_one_line_error(code, *capsys.readouterr(), *fragments)


def test_no_callable_lists_what_the_file_defines(
    capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    code = main(["summary", f"{nets}:two_input", "--input", "2"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "did you mean 'two_inputs'?")
    defined = err.split("it defines: ")[1].strip().split(", ")
    # functions first, then classes, in their order in the file; no imports, no _private
    assert defined == [
        "two_inputs",
        "tiny",
        "broken",
        "raises",
        "not_a_module",
        "conv",
        "embed",
        "sized",
        "blocks",
        "normed",
        "TwoInputs",
        "Tied",
        "Stack",
        "Faulty",
        "Branchy",
        "LanguageModel",
        "Initialized",
    ]


def test_no_callable_list_is_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "many.py"
    path.write_text("".join(f"def f{i}():\n    pass\n\n\n" for i in range(25)))
    code = main(["summary", f"{path}:g", "--input", "2"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "f0, f1,", "f19, ... (5 more)")
    assert "f20" not in err
    (tmp_path / "empty.py").write_text("from os import path\n")
    code = main(["summary", f"{tmp_path / 'empty.py'}:path", "--input", "2"])
    assert_one_line_error(code, *capsys.readouterr(), "no public function or class")


# --- fixes that name the command's flags -------------------------------------------------------

FIXES = {
    "float16 input, float32 model": (
        ["{nets}:conv", "--input", "1x3x8x8:float16"],
        ["received a torch.float16 input", "Fix: pass --dtype float16", "drop ':float16'"],
    ),
    "half input (an alias)": (
        ["{nets}:tiny", "--input", "2x5:half"],
        ["Fix: pass --dtype float16", "drop ':half' from --input 2x5:half"],
    ),
    "bfloat16 input, --dtype float16": (
        ["{nets}:tiny", "--input", "2x5:bfloat16", "--dtype", "float16"],
        ["Fix: pass --dtype bfloat16", "drop ':bfloat16'"],
    ),
    "float8 input": (
        ["{nets}:tiny", "--input", "2x5:float8_e4m3fn"],
        ["--dtype takes float32, float64, float16 or bfloat16, not float8_e4m3fn", "drop ':float8"],
    ),
    "long input, float model": (
        ["{nets}:tiny", "--input", "2x5:long"],
        ["floating-point input", "drop ':long' from --input 2x5:long"],
    ),
    "float input, embedding": (
        ["{nets}:embed", "--input", "2x5"],
        ["Embedding at '0'", "Fix: pass token ids as integers: add ':long' to their --input"],
    ),
    "bad layout": (
        ["{nets}:conv", "--input", "3x8"],
        ["received shape (3, 8)", "Fix: change the --input shape"],
    ),
    "zero dimension": (
        ["{nets}:tiny", "--input", "2x0"],
        ["Fix: give --input no 0 or negative dimension"],
    ),
    "input too small": (
        ["{nets}:broken", "--input", "1x3x2x2"],
        ["Kernel size", "Fix: check the --input shapes"],
    ),
    "a batch of one, BatchNorm in training": (
        ["{nets}:normed", "--input", "1x3"],
        ["BatchNorm1d at '1'", "Fix: give --input a batch of more than one, or pass --eval"],
    ),
    "too many inputs": (
        ["{nets}:tiny", "--input", "2x5", "--input", "2x5"],
        ["Fix: give one --input per argument of the model's forward"],
    ),
}


@pytest.mark.parametrize("case", list(FIXES))
def test_fixes_name_the_flags(case: str, capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    args, fragments = FIXES[case]
    code = main(["summary", *fill(args, nets)])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, *fragments)
    for python_api in ["x.to(", "layer.to(", "reshape the input", "call the layer", "mode="]:
        assert python_api not in err
    assert "the model is" not in err
    assert torch.get_default_dtype() == torch.float32


def test_fix_with_dtype_works(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    """The fix the float16 error gives, followed, runs."""
    assert (
        main(["summary", f"{nets}:conv", "--input", "1x3x8x8:float16", "--dtype", "float16"]) == 0
    )
    assert main(["summary", f"{nets}:conv", "--input", "1x3x8x8"]) == 0
    assert capsys.readouterr().err == ""


PAIRS = """\
from torch import nn

import lazynn


class Pairs(nn.Module):
    \"\"\"Compares the two halves of its batch: runs at a batch of 2, fails at 3.\"\"\"

    def __init__(self):
        super().__init__()
        self.fc = lazynn.LazyLinear(4)

    def forward(self, x):
        first, second = self.fc(x).unflatten(0, (2, -1))
        return first - second
"""


def test_a_model_failing_at_a_free_batch_keeps_its_fix_key_and_the_command_gives_its_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The summary runs a free batch as numbers, and a failure at one says which: a note
    added to the error's parts, whose fix key the command line still says with its flags."""
    path = tmp_path / "pairs.py"
    path.write_text(PAIRS)
    pairs = runpy.run_path(str(path), run_name="pairs_test")["Pairs"]
    for example in [(None, 5), lazynn.Spec(("N", 5))]:  # Keras's None, a named batch
        with pytest.raises(lazynn.InferenceError, match="ran the symbolic batch") as info:
            lazynn.summary(pairs(), example)
        parts = info.value.parts
        assert parts is not None
        assert parts.key is Fix.INPUT_SHAPES
        assert parts.notes[-1].startswith("lazynn.summary ran the symbolic batch")
    code = main(["summary", f"{path}:Pairs", "--input", "Bx5"])
    fix = "Fix: check the --input shapes"
    assert_one_line_error(code, *capsys.readouterr(), "ran the symbolic batch 'B' as 3", fix)


def test_a_factory_failing_at_the_first_free_batch_says_the_batch_it_ran_as() -> None:
    """A factory's model is built on meta at the first number (2) before the summary runs:
    a failure there has the same note, its parts kept."""

    class Triples(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).unflatten(0, (3, -1)).sum(0)  # type: ignore[no-any-return]

    with pytest.raises(lazynn.InferenceError, match="ran the symbolic batch 'B' as 2") as info:
        lazynn.summary(Triples, lazynn.Spec(("B", 5)))
    assert info.value.parts is not None


HALF_PORTED = """\
import lazynn

layer = lazynn.LazyLinear(768, 3072)
"""


@pytest.mark.parametrize("how", ["file", "module"])
def test_a_lazynn_error_the_users_file_raises_as_it_runs_keeps_its_parts_and_its_own_fix(
    how: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's own code failed, not the command's arguments: its fix is lazynn's (about that
    code), read from the error's parts (not its text), so that where the file raised it goes
    before the fix, as in every other error the command prints."""
    (tmp_path / "half_ported.py").write_text(HALF_PORTED)
    monkeypatch.chdir(tmp_path)
    source = "half_ported.py" if how == "file" else "half_ported"
    code = main(["summary", f"{source}:layer", "--input", "2x768"])
    out, err = capsys.readouterr()
    verb = "run" if how == "file" else "import"
    head = f"{source} failed to {verb}: ArgumentError: LazyLinear: expected bias to be a bool"
    fix = "Fix: delete the input size, which lazynn infers: LazyLinear(3072)"
    assert_one_line_error(code, out, err, head, fix)
    assert err.index("called at half_ported.py:3") < err.index("Fix: ")


# --- the view and the run: --depth, --expand, --format, --width, --eval, --training ---------

VIEWS = {
    "defaults": ([], {}, {}),
    "--depth 0": (["--depth", "0"], {}, {"depth": 0}),
    "--depth 1": (["--depth", "1"], {}, {"depth": 1}),
    "--expand": (["--expand"], {}, {"expand": True}),
    "--depth 2 --expand": (["--depth", "2", "--expand"], {}, {"depth": 2, "expand": True}),
    "--format markdown": (["--format", "markdown"], {}, {"format": "markdown"}),
    "--format json": (["--format", "json"], {}, {"format": "json"}),
    "--format dot": (["--format", "dot"], {}, {"format": "dot"}),
    "--format dot --depth 1 --expand": (
        ["--format", "dot", "--depth", "1", "--expand"],
        {},
        {"format": "dot", "depth": 1, "expand": True},
    ),
    "--width 40": (["--width", "40"], {}, {"width": 40}),
    "--width 0 (no limit)": (["--width", "0"], {}, {"width": None}),
    "--eval": (["--eval"], {"mode": "eval"}, {}),
    "--training": (["--training"], {"training": True, "optimizer": "adamw"}, {}),
    "--optimizer sgd": (["--optimizer", "sgd"], {"training": True, "optimizer": "sgd"}, {}),
    "--training --optimizer Adam --format json": (
        ["--training", "--optimizer", "Adam", "--format", "json"],
        {"training": True, "optimizer": "Adam"},
        {"format": "json"},
    ),
}


@pytest.mark.parametrize("case", list(VIEWS))
def test_view_flags_print_what_render_gives(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    """Each flag is passed on: summary(model, *specs, mode=..., training=..., optimizer=...)
    then .render(format=..., depth=..., expand=..., width=...), defaults otherwise."""
    flags, run, view = VIEWS[case]
    assert main(["summary", f"{nets}:blocks", "--input", "2x5", *flags]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    namespace = runpy.run_path(str(nets), run_name="nets_test")
    result = lazynn.summary(namespace["blocks"](), (2, 5), **{"mode": "train", **run})
    rendered = result.render(
        **{"format": "table", "depth": None, "expand": False, "width": 100, **view}
    )
    assert out == rendered + "\n"


@pytest.mark.slow
def test_the_python_docs_summary_gives_for_a_command_prints_what_it_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/summary.md: "Each command is the same as, in Python": its block, run, prints
    what the command in its first line prints."""
    from doc_pages import blocks

    (block,) = [b for b in blocks(ROOT / "docs" / "summary.md") if "runpy" in b.text]
    command = block.text.splitlines()[1].removeprefix("# lazynn ")
    monkeypatch.chdir(ROOT)
    exec(block.text, {"__name__": "__main__"})
    python = capsys.readouterr().out
    assert main(command.split()) == 0
    assert capsys.readouterr().out == python
    assert python.startswith("| Module (type) |")


def test_json_has_the_run(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    argv = ["summary", f"{nets}:blocks", "--input", "Bx5", "--format", "json"]
    assert main([*argv, "--eval", "--optimizer", "sgd"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "eval"
    assert data["batch"] == "B"
    assert data["total_parameters"] == (5 * 8 + 8) + 3 * (8 * 8 + 8)
    assert data["memory"]["optimizer"] == "SGD"
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "train"
    assert data["memory"] is None  # no estimate unless --training or --optimizer


#: --input -> the summary's first line, or the fragments of its one-line error (docs/summary.md:
#: sizes are integers >= 1; the batch may be a name of letters, in either case)
INPUTS = {
    "2x5": "Sequential: input [2, 5] -> output [2, 3]",
    "2X5": "Sequential: input [2, 5] -> output [2, 3]",
    "Bx5": "Sequential: input [B, 5] -> output [B, 3]",
    "nx5": "Sequential: input [n, 5] -> output [n, 3]",
    "batchx5": "Sequential: input [batch, 5] -> output [batch, 3]",
    "0x5": ["'0x5', with 0", "integers >= 1", "Fix: give --input no 0 or negative dimension"],
    "2x0": ["'2x0', with 0", "integers >= 1"],
    "0x0": ["'0x0', with 0, 0"],
    "-2x5": ["'-2x5', with -2", "integers >= 1"],
    "5xB": ["'5xB'", "a symbolic batch, named by letters, first", "Fix: write the dimensions"],
    "B2x5": ["'B2x5'", "a symbolic batch, named by letters, first"],
    "x5": ["'x5'", "Fix: write the dimensions as integers separated by x"],
}


@pytest.mark.parametrize("shape", list(INPUTS))
def test_input_shapes(shape: str, capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    expected = INPUTS[shape]
    code = main(["summary", f"{nets}:tiny", f"--input={shape}"])  # (= for -2x5)
    out, err = capsys.readouterr()
    if isinstance(expected, str):
        assert code == 0, err
        assert out.splitlines()[0] == expected
    else:
        assert_one_line_error(code, out, err, "--input", *expected)


def test_symbolic_batch_is_passed_on(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    assert main(["summary", f"{nets}:tiny", "--input", "Bx5"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "Sequential: input [B, 5] -> output [B, 3]"


def test_view_widths(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    argv = ["summary", f"{nets}:two_inputs", "--input", "2x5", "--input", "2x3"]
    assert main([*argv, "--input", "2x7:long", "--width", "60"]) == 0
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 60


def test_expand_shows_every_block(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    assert main(["summary", f"{nets}:blocks", "--input", "2x5", "--depth", "1"]) == 0
    collapsed = capsys.readouterr().out
    assert main(["summary", f"{nets}:blocks", "--input", "2x5", "--depth", "1", "--expand"]) == 0
    expanded = capsys.readouterr().out
    assert all(f"  {i} (Sequential)" in expanded for i in range(4))
    assert "  0 (Sequential)" in collapsed
    assert "  3 (Sequential)" not in collapsed  # blocks 1-3, identical: one row


VIEW_ERRORS = {
    "--depth -1": ["--depth", "-1"],
    "--depth x": ["--depth", "x"],
    "--width -5": ["--width", "-5"],
    "--format xml": ["--format", "xml"],
}


@pytest.mark.parametrize("case", list(VIEW_ERRORS))
def test_view_flag_errors(case: str, capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["summary", f"{nets}:tiny", "--input", "2x5", *VIEW_ERRORS[case]])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("python -m lazynn summary: error: argument ")
    assert case.split()[0] in err.splitlines()[-1]


def test_unknown_optimizer(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    code = main(["summary", f"{nets}:tiny", "--input", "2x5", "--optimizer", "nope"])
    assert_one_line_error(code, *capsys.readouterr(), "--optimizer", "'nope'", "adamw", "sgd")


def test_help_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["summary", "--help"])
    out = capsys.readouterr().out
    flags = ["--depth", "--expand", "--format", "--width", "--eval", "--training", "--optimizer"]
    flags += ["--traceback"]
    assert all(flag in out for flag in flags)
    words = " ".join(out.split())
    assert "implies --training" in words
    assert "{table,markdown,json,dot,svg,png}" in words
    assert "Graphviz's dot program, which must be installed: apt install graphviz" in words


# --- one line for any input: huge dimensions, dtype names, factory arguments -------------------


def nets_line(marker: str) -> int:
    """The line of NETS that ends with the comment ``# marker``."""
    (line,) = [i for i, text in enumerate(NETS.splitlines(), 1) if text.endswith(f"# {marker}")]
    return line


INPUT_ERRORS = {
    "a dimension beyond int64": (
        ["--input", "99999999999999999999x3x224x224"],
        ["below 2**63", "'99999999999999999999x3x224x224'", "Fix: give smaller dimensions"],
    ),
    "more elements than int64 counts": (["--input", "4611686018427387904x3"], ["below 2**63"]),
    "more bytes than int64 counts": (
        ["--input", "2305843009213693952x3"],
        ["bytes are below 2**63", "4-byte elements"],
    ),
    "float8 --dtype": (
        ["--input", "2x5", "--dtype", "float8_e4m3fn"],
        ["--dtype: expected one of float32 (float), float64 (double), float16", "bfloat16"],
    ),
    "float8_e5m2 --dtype": (["--input", "2x5", "--dtype", "float8_e5m2"], ["'float8_e5m2'"]),
    "near miss --dtype": (
        ["--input", "2x5", "--dtype", "floot16"],
        ["received 'floot16'; did you mean 'float16'?"],
    ),
    "near miss input dtype": (
        ["--input", "2x5:floot"],
        ["float32, float16, bfloat16", "received 'floot'; did you mean 'float'?"],
    ),
    "quantized input dtype": (["--input", "2x5:qint8"], ["quantized", "drop ':qint8'"]),
    "group not closed": (["--input", "(2x5, 2x5"], ["'(2x5, 2x5'", "not closed"]),
    "group closed twice": (["--input", "(2x5, 2x5))"], ["outside the parentheses"]),
    "groups side by side": (["--input", "(2x5)(2x5)"], ["expected ',' before '('"]),
    "two groups in one --input": (["--input", "(2x5), (2x5)"], ["one --input per argument"]),
    "empty item": (["--input", "(2x5,, 2x5)"], ["expected a shape or a group before ','"]),
    "bad shape in a group": (["--input", "(2x5, 2xa)"], ["'(2x5, 2xa)'", "'2xa'"]),
    "groups nested too deep": (["--input", "(" * 10 + "2x5" + ")" * 10], ["8 deep at most"]),
}


@pytest.mark.parametrize("case", list(INPUT_ERRORS))
def test_input_and_dtype_errors_are_one_line(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    args, fragments = INPUT_ERRORS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning of torch's may show either)
        code = main(["summary", f"{nets}:tiny", *args])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, *fragments)
    assert "frame #" not in err
    assert torch.get_default_dtype() == torch.float32


def test_torchs_cpp_frames_are_dropped() -> None:
    error = RuntimeError(
        "Overflow when unpacking long long\nException raised from THPUtils_unpackLong at "
        "python_numbers.h:79 (most recent call first):\nframe #0: c10::Error::Error(...)"
    )
    assert one_line(error) == "Overflow when unpacking long long"


# --- targets name what the file defines ---------------------------------------------------------

TARGET_REFUSALS = {
    "a module the file imports": ("os.system('echo hi')", ["'os' is the module os", "two_inputs"]),
    "torch, imported": ("torch.save(1, 'x')", ["'torch' is the module torch", "it defines: "]),
    "a class the file imports": ("LazyLinear(3)", ["LazyLinear, which it imports", "lazynn"]),
    "a dunder attribute": ("Initialized.__init__.__globals__", ["not '__init__'"]),
}


@pytest.mark.parametrize("case", list(TARGET_REFUSALS))
def test_a_target_names_what_the_file_defines(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    call, fragments = TARGET_REFUSALS[case]
    code = main(["summary", f"{nets}:{call}", "--input", "2x5"])
    assert_one_line_error(code, *capsys.readouterr(), *fragments)


@pytest.mark.parametrize(
    ("value", "said"),
    [("7", "an int"), ("7.0", "a float"), ("{}", "a dict"), ("...", "an ellipsis")],
)
def test_a_target_naming_an_imported_value_says_its_type_with_its_article(
    value: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    helpers = "sizes_" + said.replace(" ", "_")  # (one module a case: imports are cached)
    (tmp_path / f"{helpers}.py").write_text(f"WIDTH = {value}\n")
    (tmp_path / "net.py").write_text(f"from {helpers} import WIDTH\n")
    code = main(["summary", f"{tmp_path / 'net.py'}:WIDTH", "--input", "2x3"])
    assert_one_line_error(
        code, *capsys.readouterr(), f"'WIDTH' is {said} object, not a function or class"
    )


_MAKES_A_MODEL = (
    "import lazynn\nfrom torch import nn\n\nmodel = nn.Sequential(lazynn.LazyLinear(8))\n\n\n"
    "def make():\n    return nn.Sequential(lazynn.LazyLinear(8))\n\n\n"
    "class Net(nn.Module):\n    pass\n"
)


def test_a_model_the_file_makes_is_refused_with_the_function_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "made.py"
    source.write_text(_MAKES_A_MODEL)
    code = main(["summary", f"{source}:model", "--input", "2x4"])
    assert_one_line_error(
        code,
        *capsys.readouterr(),
        "'model' is a Sequential object, not a function or class",
        "it defines: make, Net.",
        "Fix: name a function that makes the model, def make_model(): return Sequential(...), "
        f"then {source}:make_model",
    )


def test_a_file_alone_is_refused_listing_what_it_defines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "made.py"
    source.write_text(_MAKES_A_MODEL)
    code = main(["summary", str(source), "--input", "2x4"])
    assert_one_line_error(
        code,
        *capsys.readouterr(),
        f"received '{source}', a file without the name of the factory in it.",
        f"Fix: name it after a colon, {source}:make; the file defines: make, Net",
    )
    assert main(["summary", f"{source}:make", "--input", "2x4"]) == 0


@pytest.mark.parametrize(
    ("target", "first_line"),
    [
        ("{nets}:Stack.of(6)", "Stack: input [2, 5] -> output [2, 6]"),  # a classmethod
        ("torch.nn:Linear(5, 4)", "Linear: input [2, 5] -> output [2, 4]"),  # a package's own
    ],
)
def test_a_target_may_be_an_attribute_or_a_packages_own(
    target: str, first_line: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    assert main(["summary", target.format(nets=nets), "--input", "2x5"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == first_line


# --- where the user's code raised it, and --traceback -----------------------------------------

WHERE = {
    "their forward raises": (
        "{nets}:Faulty",
        ["(ValueError: the faulty forward)", "(raised at {path}:{FAULTY} in forward; "],
    ),
    "their forward reads values": (
        "{nets}:Branchy",
        [
            "Tensor.item() cannot be called on meta tensors",
            "raised in torch, called at {path}:{BRANCHY} in forward",
            "Fix: the summary runs the forward on meta tensors, which have no values",
            "--traceback",
        ],
    ),
    "their factory raises": ("{nets}:raises", ["bad config (raised at {path}:{RAISES} in raises"]),
    "their file raises at import": (
        "{crashes}:make",
        ["fails at import (raised at {crashes}:1 in <module>"],
    ),
}


@pytest.mark.parametrize("case", list(WHERE))
def test_an_error_of_the_users_code_names_its_line(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    target, fragments = WHERE[case]
    crashes = nets.parent / "crashes.py"
    lines = {m: nets_line(m) for m in ("FAULTY", "BRANCHY", "RAISES")}
    code = main(["summary", target.format(nets=nets, crashes=crashes), "--input", "2x5"])
    out, err = capsys.readouterr()
    filled = [f.format(path=nets, crashes=crashes, **lines) for f in fragments]
    assert_one_line_error(code, out, err, *filled)
    assert "--input" not in err.split(" Fix: ")[-1] or case == "their forward raises"


def test_lazynns_own_refusal_names_no_line(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    code = main(["summary", f"{nets}:broken", "--input", "1x3x2x2"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "LazyConv2d at '0'")
    assert "raised" not in err


def test_traceback_shows_the_original_exception(
    capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    code = main(["summary", f"{nets}:Faulty", "--input", "2x5", "--traceback"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{nets}", line {nets_line("FAULTY")}, in forward' in err
    assert "ValueError: the faulty forward\n" in err  # the original, then what lazynn made of it
    assert "The above exception was the direct cause of the following exception" in err
    last = err.splitlines()[-1]
    assert last.startswith("lazynn: error: Faulty (root)")
    assert f"(raised at {nets}:{nets_line('FAULTY')} in forward)" in last


# --- the optimizer ---------------------------------------------------------------------------

OPTIMIZER_ERRORS = {
    "lbfgs": ["--optimizer LBFGS", "needs a closure", "adamw, asgd", "Fix: estimate with"],
    "SparseAdam": ["--optimizer SparseAdam", "sparse gradients", "adamw, asgd"],
    "adamm": ["--optimizer: expected", "received 'adamm' (did you mean 'adam'?)"],
}


@pytest.mark.parametrize("name", list(OPTIMIZER_ERRORS))
def test_an_optimizer_that_cannot_step_on_meta_is_refused_first(
    name: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    """Refused before the target is loaded (crashes.py would fail), with why and the names."""
    crashes = nets.parent / "crashes.py"
    code = main(["summary", f"{crashes}:make", "--input", "2x5", "--optimizer", name])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, *OPTIMIZER_ERRORS[name])
    listed = err.split("expected")[1]
    assert "lbfgs" not in listed
    assert "sparseadam" not in listed


@pytest.mark.parametrize("name", ["asgd", "adafactor"])
def test_optimizers_that_read_values_are_estimated(
    name: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    assert main(["summary", f"{nets}:tiny", "--input", "2x5", "--optimizer", name]) == 0
    out = capsys.readouterr().out
    assert f"Training memory ({'ASGD' if name == 'asgd' else 'Adafactor'}, on meta)" in out


def test_muon_says_it_takes_matrices(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    code = main(["summary", f"{nets}:tiny", "--input", "2x5", "--optimizer", "muon"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "Muon only supports 2D", "2-D parameters only")
    assert "optimizer=" not in err


# --- stdout holds the summary alone; view flags a format has no use for -------------------------


@pytest.mark.parametrize("form", ["json", "table"])
def test_the_users_prints_go_to_stderr(
    form: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    chatty = nets.parent / "chatty.py"
    assert main(["summary", f"{chatty}:make", "--input", "2x5", "--format", form]) == 0
    out, err = capsys.readouterr()
    if form == "json":
        assert json.loads(out)["total_parameters"] == 18
    else:
        assert out.splitlines()[0] == "Chatty: input [2, 5] -> output [2, 3]"
    for printed in ["the file prints at import", "the factory prints", "the forward prints"]:
        assert printed in err
        assert printed not in out


VIEW_REFUSALS = {
    "--depth with json": (["--format", "json", "--depth", "1"], ["--depth with --format json"]),
    "--width with json": (["--format", "json", "--width", "60"], ["--width with --format json"]),
    "--width with markdown": (["--format", "markdown", "--width", "60"], ["markdown is not cut"]),
    "--width with dot": (["--format", "dot", "--width", "60"], ["dot is not cut"]),
}


@pytest.mark.parametrize("case", list(VIEW_REFUSALS))
def test_view_flags_a_format_ignores_are_refused(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    flags, fragments = VIEW_REFUSALS[case]
    code = main(["summary", f"{nets}:blocks", "--input", "2x5", *flags])
    assert_one_line_error(code, *capsys.readouterr(), *fragments, "Fix: drop --")


def test_expand_with_json_is_json(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    """The JSON lists every block: --expand asks for what it has."""
    argv = ["summary", f"{nets}:blocks", "--input", "2x5", "--format", "json"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--expand"]) == 0
    assert capsys.readouterr().out == plain
    assert len(json.loads(plain)["rows"]) == 1 + 4 * 3


# --- nested inputs: a tuple argument ------------------------------------------------------------


def test_a_tuple_argument_is_a_parenthesized_group(
    capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    """An LSTM language model's forward(tokens, (h0, c0))."""
    argv = ["summary", f"{nets}:LanguageModel", "--width", "0", "--input", "4x16:long"]
    assert main([*argv, "--input", "(2x4x32, 2x4x32)"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[0] == (
        "LanguageModel: input [4, 16] int64, [2, 4, 32], [2, 4, 32] "
        "-> output [4, 16, 50], [2, 4, 32], [2, 4, 32]"
    )
    factory = runpy.run_path(str(nets), run_name="nets_test")["LanguageModel"]
    tokens, state = lazynn.Spec((4, 16), torch.long), (torch.zeros(2, 4, 32),) * 2
    assert total_line(built_total(factory, tokens, state)) in out.splitlines()
    spec = lazynn.Spec((2, 4, 32))
    assert out == lazynn.summary(factory(), tokens, (spec, spec)).render(width=None) + "\n"
    code = main([*argv, "--input", "2x4x32"])  # the state as one tensor: the LSTM says so
    assert_one_line_error(code, *capsys.readouterr(), "LazyLSTM at 'lstm'")


def test_a_half_ported_line_is_named_by_its_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A refusal of the arguments the user's line gave lazynn (an input size left in) names
    that line, as an error of the user's own code does."""
    source = tmp_path / "half.py"
    source.write_text(
        "import lazynn\nfrom torch import nn\n\n\ndef make():\n"
        "    return nn.Sequential(lazynn.LazyLinear(768, 3072))\n"
    )
    code = main(["summary", f"{source}:make", "--input", "2x768"])
    assert_one_line_error(
        code,
        *capsys.readouterr(),
        "LazyLinear(768, 3072) reads as out_features=768, bias=3072",
        "raised in lazynn, called at ",
        "half.py:6 in make",
        "Fix: delete the input size, which lazynn infers: LazyLinear(3072)",
    )


@pytest.mark.parametrize(
    "words",
    [
        ["--input", "(2, 5)"],  # Python's syntax for a shape: a group of two 1-D inputs
        ["--input", "( 2,5 )"],
        ["--input-size", "2", "5"],  # torchinfo's name
        ["--input-size", "(2, 5)"],
        ["--input_size=(2, 5)"],
    ],
)
def test_a_shape_in_another_syntax_is_refused_with_the_shape_to_write(
    capsys: pytest.CaptureFixture[str], nets: Path, words: list[str]
) -> None:
    code = main(["summary", f"{nets}:sized(6)", *words])
    assert_one_line_error(code, *capsys.readouterr(), "Fix: write --input 2x5")
    assert main(["summary", f"{nets}:sized(6)", "--input", "2x5"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "Sequential: input [2, 5] -> output [2, 6]"


@pytest.mark.parametrize(("text", "shape"), [("(None, 5)", "Bx5"), ("(B, 5)", "Bx5")])
def test_a_keras_shape_on_the_command_line_is_refused_with_the_batch_named(
    capsys: pytest.CaptureFixture[str], nets: Path, text: str, shape: str
) -> None:
    code = main(["summary", f"{nets}:sized(6)", "--input", text])
    assert_one_line_error(code, *capsys.readouterr(), f"Fix: write --input {shape};", "'(5:float32")
    assert main(["summary", f"{nets}:sized(6)", "--input", shape]) == 0


def test_a_group_of_one_dimensional_inputs_with_dtypes_is_a_tuple_argument() -> None:
    from lazynn._cli.input_flags import parse_input

    value = parse_input("(2:float32, 5:float32)").value
    assert value == (lazynn.Spec((2,), torch.float32), lazynn.Spec((5,), torch.float32))
    assert parse_input("(5,)").value == (lazynn.Spec((5,)),)  # (a 1-tuple, as in Python)


# --- the console script -----------------------------------------------------------------------


@pytest.mark.slow
def test_console_script(nets: Path) -> None:
    """`lazynn` (pyproject's [project.scripts]) runs the same command as `python -m lazynn`."""
    script = shutil.which("lazynn", path=str(Path(sys.executable).parent)) or shutil.which("lazynn")
    if script is None:
        pytest.skip("the lazynn script is not installed: pip install --no-deps -e .")
    done = subprocess.run(
        [script, "summary", f"{nets}:sized(6)", "--input", "2x5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "Sequential: input [2, 5] -> output [2, 6]"
    assert total_line(36) in done.stdout.splitlines()
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0
    assert version.stdout.startswith(f"lazynn {lazynn.__version__} ")
    failed = subprocess.run(
        [script, "summary", f"{nets}:nope", "--input", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(failed.returncode, failed.stdout, failed.stderr, "two_inputs")


# --- fixes come from each error's fix key, never from its text ---------------------------------


@pytest.mark.parametrize("key", list(Fix))
def test_every_fix_key_has_the_command_lines_own_words(key: Fix) -> None:
    # a Python-API error reworded at will: the command line still says its own fix
    value = {
        Fix.INPUT_DTYPE: torch.float16,
        Fix.OPTIMIZER_NAME: "nope",
        Fix.OPTIMIZER_REFUSED: "LBFGS",
        Fix.OPTIMIZER_FAILED: ("Adafactor", ("adamw", "sgd"), ""),
    }.get(key)
    error = LazynnError(message("anywhere", "what", "other", "reworded fix", key=key, value=value))
    line = cli_line(error, [("2x5:half", "half")])
    assert "reworded fix" not in str(line)
    assert line.fix
    assert line.fix in one_line(line)


def test_an_error_without_a_fix_key_keeps_its_fix_and_loses_its_outcome() -> None:
    error = LazynnError(message("here", "a", "b", "do this", outcome="the model is unchanged"))
    assert str(error).endswith("Fix: do this; the model is unchanged")
    assert one_line(cli_line(error, [])).endswith("Fix: do this")


def test_an_error_keeps_its_parts_through_a_pickle_and_a_note() -> None:
    import pickle

    error = lazynn.InferenceError(message("w", "e", "r", "f", key=Fix.INPUT_LAYOUT))
    copied = pickle.loads(pickle.dumps(error))
    assert copied.parts == error.parts
    assert str(copied) == str(error)
    noted = with_note(error, "an earlier layer read (3,) as one sample")
    assert noted.parts.key is Fix.INPUT_LAYOUT  # type: ignore[attr-defined]
    assert "Note: an earlier layer read (3,) as one sample. Fix: f" in str(noted)


@pytest.mark.parametrize("name", ["qint8", "floot"])
def test_dtype_names_are_read_in_one_place_for_spec_parse_and_the_command_line(
    name: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    with pytest.raises(lazynn.InferenceError) as caught:
        lazynn.Spec.parse("2x5", name)
    main(["summary", f"{nets}:tiny", "--input", f"2x5:{name}"])
    line = capsys.readouterr().err
    assert caught.value.parts is not None
    assert caught.value.parts.received in line
