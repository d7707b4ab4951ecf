"""Every ```python block of README.md and docs/*.md runs, two ways: alone, in a fresh
namespace, as a reader who copies that one block runs it; and in page order, in one
namespace, as the page reads. A block of ``>>>`` lines is a doctest (its outputs compared as
pytest compares them, with the ini's ``doctest_optionflags``); any other block is executed.

A block that needs an earlier one (the page's shared model) says so twice, just before its
fence: in the visible prose (the paragraph before it contains "continu": "Continuing the
model above:"), and in a marker, an HTML comment that GitHub does not show::

    <!-- block: NAME -->        names the block whose fence follows
    <!-- continues: NAME -->    this block runs after block NAME (and what NAME continues)

Run alone, a continuing block runs after the blocks it continues, in page order. Each run
starts with no process group (a distributed snippet makes its own) in the repository's folder.
Runs that call torch.compile or torch.export are marked ``compile`` (slow), as other tests are.
"""

from __future__ import annotations

import doctest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from doc_pages import PAGES, Block, blocks
from paths import ROOT

BLOCKS = [block for page in PAGES for block in blocks(page)]


def chain(block: Block) -> list[Block]:
    """The blocks to run for ``block`` alone: those it continues (transitively), then it."""
    named = {b.name: b for b in blocks(block.page) if b.name}
    needed = [block]
    while needed[0].continues:
        needed.insert(0, named[needed[0].continues])
    return needed


def _marks(text: str) -> list[pytest.MarkDecorator]:
    marks = []
    if "torch.compile(" in text or "torch.export" in text:
        marks.append(pytest.mark.compile)
    return marks


def _block_param(block: Block) -> Any:
    return pytest.param(block, id=block.id, marks=_marks("".join(b.text for b in chain(block))))


def _page_param(page: Path) -> Any:
    text = "".join(b.text for b in blocks(page))
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=_marks(text))


def _optionflags(config: pytest.Config) -> int:
    flags = 0
    for name in config.getini("doctest_optionflags"):
        flags |= doctest.OPTIONFLAGS_BY_NAME[name]
    return flags


def run(block: Block, namespace: dict[str, Any], optionflags: int) -> None:
    """Run one block in ``namespace``: its doctest's outputs must match; failures raise."""
    filename = str(block.page)
    if block.doctest:
        test = doctest.DocTestParser().get_doctest(
            block.text, namespace, block.id, filename, block.line
        )
        test.globs = namespace  # (get_doctest copies it: run in it, as exec does)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=optionflags)
        result = runner.run(test, out=report.append, clear_globs=False)
        assert result.failed == 0, "".join(report)
    else:
        # padded so that a traceback gives the page's line numbers
        exec(compile("\n" * block.line + block.text, filename, "exec"), namespace)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each run starts as a new ``python`` would: no process group (so a block that needs
    one must make it), the repository as the working directory; the random state and
    default dtype are put back after."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    monkeypatch.chdir(ROOT)
    dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        yield
    torch.set_default_dtype(dtype)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("block", [_block_param(b) for b in BLOCKS])
def test_block_runs_alone(block: Block, pytestconfig: pytest.Config) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for needed in chain(block):
        run(needed, namespace, _optionflags(pytestconfig))


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if blocks(p)])
def test_page_runs_in_order(page: Path, pytestconfig: pytest.Config) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in blocks(page):
        run(block, namespace, _optionflags(pytestconfig))


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_a_continuing_block_says_so_and_names_an_earlier_block(block: Block) -> None:
    names = [b.name for b in blocks(block.page) if b.name]
    assert len(names) == len(set(names)), f"{block.page.name}: a block name given twice"
    if block.continues is None:
        return
    earlier = [b.name for b in blocks(block.page) if b.number < block.number]
    assert block.continues in earlier, f"{block.id}: no earlier block {block.continues!r}"
    assert "continu" in block.prose.lower(), f"{block.id}: say in the prose what it continues"


def test_the_harness_finds_every_kind_of_block(tmp_path: Path) -> None:
    """The parser: markers before a fence, the paragraph before them, non-python fences
    skipped; and a failing doctest or block fails its run."""
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n<!-- block: setup -->\n```python\n>>> x = 1\n\n```\n\n```bash\nls\n```\n\n"
        "Continuing the setup above:\n<!-- continues: setup -->\n```python\n>>> x + 1\n3\n\n```\n"
        "\n```python\nraise ValueError('no')\n```\n"
    )
    first, second, third = blocks(page)
    assert (first.name, first.continues, first.doctest, first.prose) == (
        "setup",
        None,
        True,
        "Intro.",
    )
    assert (second.name, second.continues, second.prose) == (
        None,
        "setup",
        "Continuing the setup above:",
    )
    assert not third.doctest
    assert chain(second) == [first, second]
    namespace: dict[str, Any] = {}
    run(first, namespace, 0)
    with pytest.raises(AssertionError, match=r"(?s)line 16, .*Expected:\s+3\s+Got:\s+2"):
        run(second, namespace, 0)
    with pytest.raises(ValueError, match="no"):
        run(third, {}, 0)
