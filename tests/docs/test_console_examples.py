"""Every console example of README.md and docs/*.md runs, as a reader types it, and prints
what the page shows.

A console example is a line ``$ lazynn ...`` or ``$ python -m lazynn ...`` in a ```console
block; the lines under it, up to the next ``$`` line or the block's end, are what it prints:
stdout, then stderr, as a terminal shows them. ``...`` stands for any text, as in a doctest
with ``ELLIPSIS`` (a line of ``...`` for lines left out). The command runs as written
(``lazynn``: the installed command; ``python -m lazynn``: this Python's), in a process of its
own, in the repository's folder, with stdout not a terminal (tables 100 columns wide), its
arguments split as a POSIX shell splits them (quotes, a ``# comment``); ``> FILE`` sends
stdout to a file (in a temporary folder), and the page shows nothing under it. The exit
status must be 2 where the page shows an error (``lazynn: error:``), 0 otherwise. An image
needs Graphviz's ``dot``: without it, that example is skipped.

Other ``$`` lines (not lazynn's) must be listed in :data:`NOT_RUN`, with why, so that no
console example of the pages goes unchecked.
"""

from __future__ import annotations

import doctest
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from doc_pages import PAGES
from dot_graph import has_dot
from paths import ROOT

#: ``$`` lines of the pages that are not lazynn's, and why they are not run
NOT_RUN = {
    "python -W error docs/build_api.py build/api": "needs pdoc; tests/docs/test_api_reference.py",
    "python -m webbrowser build/api/lazynn.html": "opens a browser",
}
_LAZYNN = (["lazynn"], ["python", "-m", "lazynn"])
_SHELL = {"|", "||", "&&", ";", "<", "2>", ">>", "&", "2>&1"}
_TIMEOUT = 300


@dataclass(frozen=True)
class Command:
    """One ``$`` line of a console block and what the page shows under it."""

    page: Path
    line: int  # 1-based, the ``$`` line's
    text: str  # after ``$ ``
    shown: str  # the lines under it, each with its line end

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def commands(page: Path) -> list[Command]:
    """The ``$`` lines of the page's ```console blocks, with the lines under each."""
    lines = page.read_text().splitlines()
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        starts = [j for j in range(i + 1, end) if lines[j].startswith("$ ")]
        for start, following in zip(starts, [*starts[1:], end], strict=True):
            shown = "".join(f"{line}\n" for line in lines[start + 1 : following])
            found.append(Command(page, start + 1, lines[start][2:], shown))
        i = end + 1
    return found


def argv(command: Command) -> tuple[list[str], str | None]:
    """The command's words (``lazynn`` or ``python -m lazynn``, then its arguments), and the
    file its stdout is sent to (``> FILE``), if any."""
    words = shlex.split(command.text, comments=True)
    target = None
    if ">" in words:
        at = words.index(">")
        assert len(words) == at + 2, f"{command.id}: '> FILE' ends a console example"
        words, target = words[:at], words[at + 1]
    shell = sorted(_SHELL.intersection(words))
    assert not shell, f"{command.id}: {shell} is shell syntax this harness does not run"
    if not any(words[: len(prefix)] == prefix for prefix in _LAZYNN):
        raise AssertionError(f"{command.id}: not a lazynn command: {command.text!r}")
    return words, target


def program(words: list[str]) -> list[str]:
    """The command to run for ``words``: ``lazynn``, the command installed beside this Python
    (or, where there is none, its entry point as the command runs it: the name it was called
    by is the one its fixes name); ``python -m lazynn``, this Python's."""
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    installed = Path(sys.executable).with_name("lazynn")
    if installed.exists():
        return [str(installed), *words[1:]]
    entry = "import sys; from lazynn._cli.main import console; sys.argv[0] = 'lazynn'; console()"
    return [sys.executable, "-c", entry, *words[1:]]


def run(command: Command, folder: Path) -> None:
    """Run ``command`` in the repository's folder: its output must be the page's, its exit
    status 2 after an error, 0 otherwise; failures raise, showing the difference."""
    words, target = argv(command)
    image = "--format" in words and words[words.index("--format") + 1] in ("svg", "png")
    if image and not has_dot():
        pytest.skip("Graphviz's dot is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out_file = folder / Path(target).name if target else None
    with open(out_file, "wb") if out_file else _null() as sink:
        done = subprocess.run(
            program(words),
            cwd=ROOT,
            env=env,
            stdout=sink if out_file else subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=_TIMEOUT,
        )
    printed = (done.stdout or b"").decode() + done.stderr.decode()
    checker = doctest.OutputChecker()
    if not checker.check_output(command.shown, printed, doctest.ELLIPSIS):
        example = doctest.Example(command.text, command.shown)
        difference = checker.output_difference(example, printed, doctest.ELLIPSIS)
        raise AssertionError(f"{command.id}: $ {command.text}\n{difference}")
    failed = "lazynn: error:" in command.shown
    assert done.returncode == (2 if failed else 0), f"{command.id}: exit status {done.returncode}"
    if out_file is not None:
        assert out_file.stat().st_size > 0, f"{command.id}: nothing written to {target}"


class _null:
    """A context that gives None (stdout to a pipe)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


COMMANDS = [c for page in PAGES for c in commands(page) if c.text not in NOT_RUN]


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param(c, id=c.id) for c in COMMANDS])
def test_a_console_example_prints_what_its_page_shows(command: Command, tmp_path: Path) -> None:
    run(command, tmp_path)


def test_every_console_example_is_lazynns_or_says_why_not() -> None:
    others = {c.text for page in PAGES for c in commands(page) if c.text in NOT_RUN}
    assert others == set(NOT_RUN)  # (a reason for a line no page has is stale)
    for command in COMMANDS:
        argv(command)  # (raises for another program, or shell syntax it cannot run)
    assert COMMANDS, "no console example found: the harness's parser is broken"


@pytest.mark.slow
def test_the_harness_reads_a_page_and_a_stale_output_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```console\n"
        "$ python -m lazynn --version  # the versions\nlazynn ... (torch ...)\n"
        "$ lazynn --version\nlazynn 0.0.0 (torch 1.0)\n"
        "$ lazynn summary 'a b.py:f(1, x=\"y\")' --input 2x3 > out.txt\n"
        "```\n\n```bash\n$ ls\n```\n"
    )
    first, second, third = commands(page)
    assert (first.line, first.text, first.shown) == (
        4,
        "python -m lazynn --version  # the versions",
        "lazynn ... (torch ...)\n",
    )
    assert argv(first) == (["python", "-m", "lazynn", "--version"], None)
    words, target = argv(third)
    assert (words[1:], target) == (["summary", 'a b.py:f(1, x="y")', "--input", "2x3"], "out.txt")
    run(first, tmp_path)
    with pytest.raises(AssertionError, match=re.escape("Expected:\n    lazynn 0.0.0 (torch 1.0)")):
        run(second, tmp_path)
