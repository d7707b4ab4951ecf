"""``lazynn TARGET ...`` is ``lazynn summary TARGET ...``: the command word may be left out.

lazynn's own options (``--help``, ``-h``, ``--version``, and the prefixes argparse takes for
them) keep their meaning; a first word that looks like a mistyped command (a near miss of
``summary``, or a word followed by a target) is answered with the command to type, which runs.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lazynn._cli.main import main
from paths import ROOT

NETS = """\
import lazynn
from torch import nn


def tiny():
    return nn.Sequential(lazynn.LazyLinear(3))


def sized(width, name="a:b"):
    return nn.Sequential(lazynn.LazyLinear(width))
"""


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("default_command") / "nets.py"
    path.write_text(NETS)
    return path


def fill(args: list[str], nets: Path) -> list[str]:
    return [a.format(nets=nets) for a in args]


#: command lines without the command word (each also run with it, the same)
FORMS = {
    "a target first": ["{nets}:tiny", "--input", "2x5"],
    "an option first": ["--input", "2x5", "{nets}:tiny"],
    "--input=, then the target": ["--input=2x5", "{nets}:tiny", "--format", "json"],
    "factory arguments": ["{nets}:sized(4, name='c:d')", "--input", "2x5", "--depth", "0"],
    "a flag first": ["--eval", "{nets}:tiny", "--input", "2x5", "--format", "markdown"],
    "an error: no such factory": ["{nets}:nope", "--input", "2x5"],
    "an error: no factory name": ["{nets}", "--input", "2x5"],
    "the command's help": ["{nets}:tiny", "-h"],
}


@pytest.mark.parametrize("case", list(FORMS))
def test_the_command_word_may_be_left_out(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    args = fill(FORMS[case], nets)

    def run(argv: list[str]) -> tuple[int | str | None, str, str]:
        try:
            code: int | str | None = main(argv)
        except SystemExit as exit_:  # (--help)
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    with_word = run(["summary", *args])
    assert run(args) == with_word
    if case.startswith("an error"):
        assert with_word[0] == 2
        assert with_word[2].startswith("lazynn: error: ")
    elif case.endswith("help"):
        assert "--input SHAPE[:DTYPE]" in with_word[1]
    else:
        assert with_word[0] == 0


@pytest.mark.parametrize("flag", ["--help", "-h", "--he", "--h"])
def test_lazynns_own_help_is_kept(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m lazynn [-h] [--version] [summary] TARGET --input")
    assert "summary, may be left out" in out
    assert "'python -m lazynn summary --help' for its options" in out


@pytest.mark.parametrize("flag", ["--version", "--vers"])
def test_lazynns_own_version_is_kept(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("lazynn ")


def test_no_arguments_names_what_the_command_needs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        "python -m lazynn summary: error: the following arguments are required: TARGET, --input"
    )


#: first words that look like a mistyped command: the fragments of the error
MISTYPED = {
    "near miss": (["sumary", "{nets}:tiny", "--input", "2x5"], "followed by the target"),
    "near miss, capitalized": (["Summary", "{nets}:tiny", "--input", "2x5"], "'Summary'"),
    "a longer word": (["summarize", "{nets}:tiny", "--input", "2x5"], "'summarize'"),
    "another word before a target": (["show", "{nets}:sized(4)", "--input", "2x5"], "'show'"),
    "near miss, the target last": (["summry", "--input", "2x5:float32", "{nets}:tiny"], "summry"),
    "near miss, no target": (["sumary", "--help"], "received 'sumary'."),
}


@pytest.mark.parametrize("case", list(MISTYPED))
def test_a_mistyped_command_is_answered_with_the_command_to_type(
    case: str, capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    args, fragment = MISTYPED[case]
    code = main(fill(args, nets))
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("lazynn: error: ")
    assert "is not a command: expected summary (which may be left out)" in line
    assert fragment in line
    fix = line.split(" Fix: run python -m lazynn ")[1]
    words = shlex.split(fix)
    assert words == ["summary", *fill(args, nets)[1:]]
    if "--help" in words:  # the command it gives runs
        with pytest.raises(SystemExit) as exit_:
            main(words)
        assert exit_.value.code == 0
    else:
        assert main(words) == 0


@pytest.mark.slow
def test_the_module_runs_without_the_command_word(nets: Path) -> None:
    """`python -m lazynn nets.py:Net --input 2x3x32x32`, as the issue typed it."""
    done = subprocess.run(
        [sys.executable, "-m", "lazynn", f"{nets}:tiny", "--input", "2x5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "Sequential: input [2, 5] -> output [2, 3]"
