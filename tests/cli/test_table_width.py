"""``lazynn summary``'s table width: the terminal's when stdout is a terminal (at least 80),
100 when it is not (a file, a pipe: the text does not depend on who runs it), ``--width N`` as
given, ``--width 0`` no limit."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

import lazynn
from lazynn._cli.main import main

NETS = """\
import lazynn
from torch import nn


def encoders():
    return nn.Sequential(
        nn.Linear(32, 32),
        lazynn.LazyTransformerEncoderLayer(4, dim_feedforward=64, batch_first=True),
    )
"""
ARGV = ["--input", "2x5x32"]


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("width") / "nets.py"
    path.write_text(NETS)
    return path


def rendered(nets: Path, width: int | None) -> str:
    factory = runpy.run_path(str(nets), run_name="nets_test")["encoders"]
    return lazynn.summary(factory(), (2, 5, 32)).render(width=width) + "\n"


@pytest.mark.parametrize(
    ("terminal", "flags", "width"),
    [
        (None, [], 100),  # (not a terminal)
        ("160", [], 160),
        ("40", [], 80),
        ("160", ["--width", "90"], 90),
        (None, ["--width", "120"], 120),
        ("90", ["--width", "0"], None),
    ],
)
def test_the_table_fits_the_terminal_or_the_width_given(
    terminal: str | None,
    flags: list[str],
    width: int | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
) -> None:
    monkeypatch.setenv("COLUMNS", terminal or "160")  # (read only where stdout is a terminal)
    if terminal is not None:
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main([f"{nets}:encoders", *ARGV, *flags]) == 0
    out = capsys.readouterr().out
    assert out == rendered(nets, width)
    assert rendered(nets, None) != rendered(nets, 100)  # (the model's table is wider than 100)


def test_the_help_says_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["summary", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: the terminal's width, at least 80, or 100 when not printing to a" in text
