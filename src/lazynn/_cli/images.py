"""``--format svg`` and ``--format png``: the summary's DOT graph drawn by Graphviz's ``dot``
program, which lazynn does not ship (``apt install graphviz``, ``brew install graphviz``).
Without it, the error says so before the model is loaded, with the way around: ``--format
dot``, drawn where Graphviz is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from .targets import CommandError

__all__ = ["IMAGES", "check_image", "draw"]

#: the image formats, drawn by dot
IMAGES = ("svg", "png")
_INSTALL = (
    "install Graphviz (apt install graphviz, brew install graphviz, conda install graphviz, "
    "or graphviz.org/download), or use --format dot and draw it where Graphviz is: "
    "--format dot > model.dot, then dot -T{0} model.dot -o model.{0}"
)


def check_image(format: str) -> None:
    """Refuse an image format that cannot be written, before anything runs: no ``dot``
    program, or a PNG (binary) to a terminal."""
    if format not in IMAGES:
        return
    if shutil.which("dot") is None:
        raise CommandError(
            f"--format {format}: expected Graphviz's dot program on PATH (it draws the "
            f"summary's graph as {format}), received no dot program.",
            _INSTALL.format(format),
        )
    if format == "png" and sys.stdout.isatty():
        raise CommandError(
            "--format png: expected stdout sent to a file (a PNG is binary), received a terminal.",
            "add > model.png to the command, or use --format svg",
        )


def draw(graph: str, format: str) -> bytes:
    """``graph`` (DOT) drawn as ``format`` by ``dot``."""
    try:
        done = subprocess.run(
            ["dot", f"-T{format}"], input=graph.encode(), capture_output=True, check=False
        )
    except OSError as error:  # (removed since check_image, or not executable)
        raise CommandError(
            f"--format {format}: expected Graphviz's dot program to run, received "
            f"{type(error).__name__}: {error}.",
            _INSTALL.format(format),
        ) from error
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise CommandError(
            f"--format {format}: expected Graphviz's dot to draw the summary's graph, received "
            f"exit status {done.returncode} ({said[0] if said else 'no message'}).",
            f"use --format dot and draw it with dot -T{format} yourself to see dot's messages",
        )
    return done.stdout
