"""The text table's width and notes: the terminal's width when it prints to one (at least 80),
100 otherwise, ``width=`` as given; shapes shortened before names, each cut label keeping its
name and marks, a note when something was cut; notes that differ only by their module's path
written once."""

from __future__ import annotations

import io
import re
import sys

import pytest
import torch
from torch import nn

import lazynn
from golden_models import Blocks


class Stem(nn.Module):
    """A convolution stem and attention over its pixels (issue 38's table: ``bn1 (LazyBatch
    Norm2d -> Bat...`` beside ``[2, 64, 64], [2, 64, 64], [2, ...``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = lazynn.LazyConv2d(64, 7, stride=2, padding=3)
        self.bn1 = lazynn.LazyBatchNorm2d()
        self.relu = nn.ReLU()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.relu(self.bn1(self.conv1(x))).flatten(2).transpose(1, 2)
        return self.attn(tokens, tokens, tokens)[0]


def encoders() -> nn.Sequential:
    """Two lazy encoder layers: names of 60 characters (``  1 (LazyTransformerEncoderLayer ->
    TransformerEncoderLayer)``) that no 100 columns hold beside the shapes."""
    return nn.Sequential(
        nn.Linear(32, 32),
        lazynn.LazyTransformerEncoderLayer(4, dim_feedforward=64, batch_first=True),
        lazynn.LazyTransformerEncoderLayer(4, dim_feedforward=48, batch_first=True),
    )


class Terminal(io.StringIO):
    """Standard output as a terminal (``shutil.get_terminal_size`` reads ``COLUMNS``)."""

    def isatty(self) -> bool:
        return True


def table_rows(text: str) -> list[tuple[str, str, str]]:
    """(label, input shapes, output shapes) of each row of a table of the default columns."""
    lines = text.splitlines()
    header = lines[2]
    inputs, outputs = header.index("Input shape"), header.index("Output shape")
    body = lines[4 : lines.index(lines[1], 4)]
    return [
        (
            line[:inputs].rstrip(),
            line[inputs:outputs].strip(),
            line[outputs:].split("  ")[0],
        )
        for line in body
    ]


# --- the width --------------------------------------------------------------------------------


def test_a_terminal_gets_a_table_as_wide_as_it(monkeypatch: pytest.MonkeyPatch) -> None:
    report = lazynn.summary(encoders(), (2, 5, 32))
    whole = report.render(width=None)
    assert 100 < max(map(len, whole.splitlines())) <= 150  # (so 100 columns cut it)
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("COLUMNS", "150")
    assert str(report) == repr(report) == whole
    assert "..." not in whole


@pytest.mark.parametrize(("columns", "width"), [("40", 80), ("90", 90), ("200", 200)])
def test_a_terminal_narrower_than_80_columns_gets_80(
    columns: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = lazynn.summary(encoders(), (2, 5, 32))
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("COLUMNS", columns)
    assert str(report) == report.render(width=width)


def test_anything_but_a_terminal_gets_100_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file, a pipe, a doctest, pytest's capture: the text is the same wherever it runs."""
    report = lazynn.summary(encoders(), (2, 5, 32))
    monkeypatch.setenv("COLUMNS", "200")  # (the environment alone is not a terminal)
    assert str(report) == repr(report) == report.render(width=100)
    assert max(map(len, str(report).splitlines())) == 100
    monkeypatch.setattr(sys, "stdout", None)  # (pythonw: no stdout at all)
    assert str(report) == report.render(width=100)


def test_a_width_given_is_kept_at_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    report = lazynn.summary(encoders(), (2, 5, 32))
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("COLUMNS", "200")
    assert max(map(len, report.render(width=90).splitlines())) <= 90
    assert report.render(width=None) == report.render(width="auto")


@pytest.mark.parametrize("width", [0, -5, "wide", True, 80.5])
def test_a_width_that_is_not_one_is_refused(width: object) -> None:
    report = lazynn.summary(Blocks(), (4, 6))
    with pytest.raises(lazynn.LazynnError, match="expected width: a number of characters") as e:
        report.render(width=width)  # type: ignore[arg-type]
    assert "Fix: pass one of them: width=None for no limit" in str(e.value)


# --- what is cut, and the note that says so ---------------------------------------------------


def test_at_100_columns_shapes_are_written_shorter_and_names_whole() -> None:
    """Identical shapes once each, with their count: nothing lost, so no note."""
    report = lazynn.summary(Stem(), (2, 3, 16, 16))
    whole = table_rows(report.render(width=None))
    assert whole[-2][1:] == ("[2, 64, 64], [2, 64, 64], [2, 64, 64]", "[2, 64, 64], [2, 64, 64]")
    text = report.render(width=100)
    rows = table_rows(text)
    assert [label for label, _, _ in rows] == [label for label, _, _ in whole]
    assert rows[-2][1:] == ("[2, 64, 64] x3", "[2, 64, 64] x2")
    assert "cut to fit" not in text
    assert max(map(len, text.splitlines())) <= 100


@pytest.mark.parametrize("width", range(60, 141, 8))
def test_names_are_cut_only_once_shapes_are_at_12_characters(width: int) -> None:
    for model, example in ((Stem(), (2, 3, 16, 16)), (encoders(), (2, 5, 32))):
        report = lazynn.summary(model, example)
        whole = table_rows(report.render(width=None))
        text = report.render(width=width)
        rows = table_rows(text)
        assert max(map(len, text.splitlines())) <= max(width, 80)
        if any(row[0] != full[0] for row, full in zip(rows, whole, strict=True)):
            assert all(len(cell) <= 12 for row in rows for cell in row[1:])
            assert re.search(r"\.\.\.: names (and shapes )?cut to fit", text)


def test_the_note_says_what_was_cut_and_how_to_see_it_whole() -> None:
    report = lazynn.summary(encoders(), (2, 5, 32))
    assert report.render(width=100).splitlines()[-2] == (
        "...: names and shapes cut to fit 100 columns; width= / --width N for more (None / 0: no "
        "limit)"
    )
    assert "cut to fit" not in report.render(width=None)
    assert "..." not in report.render(width=None)


class Marked(nn.Module):
    """A convolution of a channels-last image (marked ``!``) and a layer called three times."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = lazynn.LazyConv2d(4, 3)
        self.shared = lazynn.LazyLinear(120)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(1)
        for _ in range(3):
            h = self.shared(h)
        return h


def test_a_cut_label_keeps_its_name_and_marks() -> None:
    """The type is cut, not the module's name nor what its marks say."""
    text = lazynn.summary(Marked(), (1, 32, 32, 3)).render(width=70)
    assert [label for label, _, _ in table_rows(text)] == [
        "Marked",
        "  conv (LazyConv2d -...) !",
        "  shared (La...) [3 calls]",
    ]


# --- notes ------------------------------------------------------------------------------------


class Branches(nn.Module):
    """Three convolutions of the same channels-last image (one note, three paths) and a fourth
    of another (its own note)."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(lazynn.LazyConv2d(4, 3) for _ in range(3))
        self.other = lazynn.LazyConv2d(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [branch(x) for branch in self.branches] + [self.other(y)]


def test_notes_that_differ_only_by_path_are_one_naming_each() -> None:
    report = lazynn.summary(Branches(), (1, 32, 32, 3), (1, 16, 16, 3))
    one = (
        "LazyConv2d at 'branches.0', 'branches.1' and 'branches.2' reads in_channels=32 from "
        "dimension 1 of (1, 32, 32, 3), which looks like images stored channels-last"
    )
    other = "LazyConv2d at 'other' reads in_channels=16 from dimension 1 of (1, 16, 16, 3)"
    text = report.render(width=None)
    notes = text.split("\n! ")[1:]  # (each note's lines, then the rule)
    assert len(notes) == 2
    assert " ".join(notes[0].split()).startswith(one)
    assert " ".join(notes[1].split()).startswith(other)
    assert sum(label.endswith(" !") for label, _, _ in table_rows(text)) == 4  # (each row's mark)
    markdown = report.render(format="markdown").splitlines()
    assert [line[: len(other) + 2] for line in markdown if line.startswith("- LazyConv2d")] == [
        f"- {one}"[: len(other) + 2],
        f"- {other}",
    ]
