"""``--format dot``, ``svg`` and ``png``: the summary's graph, and the images Graphviz's ``dot``
draws of it.

The plumbing (the DOT piped to ``dot -Tsvg``, its output printed; the errors) is tested with a
stand-in ``dot`` on PATH, a shell script, so that it needs no Graphviz; Graphviz itself draws
in the tests that skip where it is not installed.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest

import lazynn
from dot_graph import has_dot, parse, path_through, svg_of, svg_texts
from lazynn._cli.main import main

NETS = """\
import lazynn
from torch import nn

print("the file prints at import")


def cnn():
    return nn.Sequential(
        lazynn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), lazynn.LazyLinear(10)
    )


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(16)

    def forward(self, x):
        x = self.ln1(x)
        return self.ln2(x + self.attn(x, x, x)[0])
"""
INPUT = ["--input", "2x3x8x8"]
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="a shell script as the stand-in dot")
GRAPHVIZ = pytest.mark.skipif(not has_dot(), reason="Graphviz's dot is not installed")


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pictures") / "nets.py"
    path.write_text(NETS)
    return path


def dot_text(nets: Path) -> str:
    factory = runpy.run_path(str(nets), run_name="nets_test")["cnn"]
    return lazynn.summary(factory(), (2, 3, 8, 8)).render(format="dot")


def stand_in(folder: Path, script: str) -> Path:
    """A ``dot`` program in ``folder`` (put first on PATH): the shell ``script``."""
    folder.mkdir(exist_ok=True)
    path = folder / "dot"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> str:
    assert code == 2
    assert out == ""
    (line,) = err.splitlines()  # (nothing else: the model's file was not even loaded)
    assert line.startswith("lazynn: error: ")
    for fragment in fragments:
        assert fragment in line
    return line


def test_dot_is_the_graph_render_gives(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    assert main([f"{nets}:cnn", *INPUT, "--format", "dot"]) == 0
    out, err = capsys.readouterr()
    assert err == "the file prints at import\n"  # (stdout holds the graph alone)
    assert out == dot_text(nets) + "\n"
    graph = parse(out)
    assert [a["label"] for _, _, a in graph.edges] == [
        "[2, 3, 8, 8]",
        "[2, 4, 6, 6]",
        "[2, 4, 6, 6]",
        "[2, 144]",
        "[2, 10]",
    ]


@pytest.mark.parametrize("depth", [[], ["--depth", "1"], ["--depth", "2"]])
def test_attention_is_on_the_path_at_every_depth(
    depth: list[str], capsys: pytest.CaptureFixture[str], nets: Path
) -> None:
    """nn.MultiheadAttention, whose forward calls none of its modules (its out_proj): one box
    on the path from ln1 to ln2 at the default depth as at --depth 2."""
    assert main([f"{nets}:Attend", "--input", "2x5x16", "--format", "dot", *depth]) == 0
    graph = parse(capsys.readouterr().out)
    path = [graph.nodes[n]["tooltip"] for n in path_through(graph)[1:-1]]
    assert path == ["ln1", "attn", "ln2"]


@POSIX
def test_svg_is_the_graph_through_dot(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
    tmp_path: Path,
) -> None:
    received = tmp_path / "received.dot"
    stand_in(tmp_path / "bin", f'cat > {received}; echo "<svg args=\\"$*\\"/>"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main([f"{nets}:cnn", *INPUT, "--format", "svg"]) == 0
    out, _ = capsys.readouterr()
    assert out == '<svg args="-Tsvg"/>\n'
    assert received.read_text() == dot_text(nets)


@POSIX
def test_png_is_the_graph_through_dot_as_bytes(
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
    tmp_path: Path,
) -> None:
    stand_in(tmp_path / "bin", "cat > /dev/null; printf '\\211PNG\\r\\n\\032\\n%s' \"$*\"")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main([f"{nets}:cnn", *INPUT, "--format", "png"]) == 0
    assert capsysbinary.readouterr().out == b"\x89PNG\r\n\x1a\n-Tpng"  # as it is: no line end


@pytest.mark.parametrize("format", ["svg", "png"])
def test_without_graphviz_an_image_is_refused_first_with_the_ways_around(
    format: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # (no dot there)
    code = main([f"{nets}:cnn", *INPUT, "--format", format])
    line = assert_one_line_error(
        code,
        *capsys.readouterr(),
        f"--format {format}: expected Graphviz's dot program on PATH",
        "received no dot program. Fix: install Graphviz (apt install graphviz, brew install "
        "graphviz",
        f"or use --format dot and draw it where Graphviz is: --format dot > model.dot, then "
        f"dot -T{format} model.dot -o model.{format}",
    )
    assert "prints at import" not in line


@POSIX
def test_a_png_to_a_terminal_is_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
    tmp_path: Path,
) -> None:
    stand_in(tmp_path / "bin", "cat > /dev/null; echo drawn")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code = main([f"{nets}:cnn", *INPUT, "--format", "png"])
    assert_one_line_error(
        code,
        *capsys.readouterr(),
        "--format png: expected stdout sent to a file (a PNG is binary), received a terminal",
        "Fix: add > model.png to the command, or use --format svg",
    )


@POSIX
def test_a_failure_of_dot_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    nets: Path,
    tmp_path: Path,
) -> None:
    stand_in(tmp_path / "bin", "cat > /dev/null; echo 'Error: out of memory' >&2; exit 3")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code = main([f"{nets}:cnn", *INPUT, "--format", "svg"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.splitlines()[-1] == (
        "lazynn: error: --format svg: expected Graphviz's dot to draw the summary's graph, "
        "received exit status 3 (Error: out of memory). Fix: use --format dot and draw it "
        "with dot -Tsvg yourself to see dot's messages"
    )


@GRAPHVIZ
def test_graphviz_draws_the_svg(capsys: pytest.CaptureFixture[str], nets: Path) -> None:
    assert main([f"{nets}:cnn", *INPUT, "--format", "svg", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert out == svg_of(dot_text(nets)).rstrip("\n") + "\n"
    shown = svg_texts(out)
    assert "0 (LazyConv2d -> Conv2d)" in shown
    assert "[2, 144]" in shown


@GRAPHVIZ
def test_graphviz_draws_the_png(capsysbinary: pytest.CaptureFixture[bytes], nets: Path) -> None:
    assert main([f"{nets}:cnn", *INPUT, "--format", "png"]) == 0
    image = capsysbinary.readouterr().out
    assert image.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(image) > 5000
