"""The API reference (docs/api.md), built by docs/build_api.py with pdoc from the docstrings:
every name of ``lazynn.__all__`` has a docstring whose example runs, and is in the reference
with its signature; the build fails on a warning, a missing docstring or a reference to
nothing."""

from __future__ import annotations

import doctest
import html
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import lazynn
from paths import ROOT

pytest.importorskip("pdoc", reason="pdoc (the dev extra) builds the API reference")


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_api", ROOT / "docs" / "build_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_api = _builder()
NAMES = sorted(lazynn.__all__)


def own_docstring(name: str) -> str:
    """The docstring the reference shows for ``lazynn.<name>``, its own (not inherited)."""
    obj = getattr(lazynn, name)
    if inspect.isclass(obj):
        return inspect.cleandoc(obj.__dict__.get("__doc__") or "")
    if callable(obj):
        return inspect.cleandoc(obj.__doc__ or "")
    return str(build_api._literal_after(name, lazynn))  # data: the literal after it


def collected(name: str) -> bool:
    """Whether pytest's doctest collection (``--doctest-modules`` over src/lazynn) runs the
    examples of ``lazynn.<name>``'s docstring."""
    obj = getattr(lazynn, name)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return False  # data: doctest reads no docstring of its own
    module = sys.modules[obj.__module__]
    tests = doctest.DocTestFinder().find(module)
    return any(t.name == f"{module.__name__}.{obj.__qualname__}" and t.examples for t in tests)


@pytest.mark.parametrize("name", NAMES)
def test_each_public_name_has_a_docstring_with_an_example_that_runs(name: str) -> None:
    docstring = own_docstring(name)
    assert docstring, f"lazynn.{name}: no docstring of its own"
    examples = doctest.DocTestParser().get_examples(docstring)
    assert examples, f"lazynn.{name}: no >>> example in its docstring"
    if collected(name):
        return  # it runs with the doctests of its module
    test = doctest.DocTestParser().get_doctest(docstring, {}, f"lazynn.{name}", None, 0)
    report: list[str] = []
    result = doctest.DocTestRunner().run(test, out=report.append)
    assert result.failed == 0, "".join(report)


# --- the reference, built -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The reference, built as docs/api.md says, and the problems the build found."""
    output = tmp_path_factory.mktemp("api")
    return output, build_api.build(output)


def as_shown(docstring: str) -> str:
    """Docstring text as the reference shows it: reST roles as pdoc renders them
    (``:func:`f``` as ``f()``), no backticks, spaces collapsed."""
    call = r"(?::py)?:(?:func|meth):`~?([^`]+)`"
    docstring = re.sub(call, lambda m: m[1].removesuffix("()") + "()", docstring)
    docstring = re.sub(r"(?::py)?:\w+:`~?([^`]+)`", r"\1", docstring)
    return " ".join(docstring.replace("`", "").split())


def text(fragment: str) -> str:
    """A piece of the reference's HTML as the text a reader sees, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}">')
    return page[start : page.index("</section>", start)]


def signature_shown(part: str) -> str:
    """The first signature in a section of the reference (a function's, or a class's
    constructor's), as text."""
    found = re.search(r'<span class="signature[^"]*">(.*?)</span>\s*</div>', part, re.DOTALL)
    assert found is not None, "no signature"
    return text(found[1])


def documented_arguments(docstring: str) -> list[str]:
    """The names an ``Args:`` section lists (``*example_inputs, **example_kwargs:`` gives
    both)."""
    if "Args:" not in docstring:
        return []
    block = docstring.split("Args:", 1)[1]
    names = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break  # the section's end: a line not indented
        entry = re.match(r"^    (\**\w+(?:, \**\w+)*):", line)
        if entry:
            names += [n.strip().lstrip("*") for n in entry[1].split(",")]
    return names


@pytest.mark.slow
def test_the_reference_builds_with_no_problem(reference: tuple[Path, list[str]]) -> None:
    output, problems = reference
    assert problems == []
    assert sorted(p.name for p in output.iterdir()) == ["index.html", "lazynn.html", "search.js"]
    assert "lazynn.html" in (output / "index.html").read_text()


@pytest.mark.slow
def test_the_front_page_is_the_package_docstring(reference: tuple[Path, list[str]]) -> None:
    page = (reference[0] / "lazynn.html").read_text()
    front = page[page.index('<section class="module-info">') :]
    front = text(front[: front.index("</section>")])
    assert lazynn.__doc__ is not None
    for paragraph in lazynn.__doc__.split("\n\n"):
        if not paragraph.startswith((">>>", "- ")):
            assert as_shown(paragraph) in front


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_each_public_name_is_in_the_reference_with_its_signature_and_docstring(
    name: str, reference: tuple[Path, list[str]]
) -> None:
    page = (reference[0] / "lazynn.html").read_text()
    part = section(page, name)
    assert as_shown(own_docstring(name).split("\n\n")[0]) in text(part)
    obj: Any = getattr(lazynn, name)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # data, or a warning class: torch's own (*args)
        assert not callable(obj) or issubclass(obj, Warning)
        return
    shown = signature_shown(part)
    for parameter in signature.parameters:
        assert re.search(rf"\b{parameter}\b", shown), f"{parameter!r} not in {shown}"
    for argument in documented_arguments(own_docstring(name)):
        assert argument in signature.parameters, f"{name}: documents {argument!r}, takes none"


def test_the_build_fails_on_a_missing_docstring_a_broken_reference_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "refpkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A package."""\n\n__all__ = ["Good", "bare", "broken"]\n\n\n'
        "class Good:\n"
        '    """Good; see :meth:`Good.run` and ``refpkg.broken``."""\n\n'
        "    def run(self) -> None:\n"
        '        """Runs."""\n\n'
        "    def stop(self) -> None:\n"
        "        pass\n\n\n"
        "def bare() -> None:\n"
        "    pass\n\n\n"
        "def broken() -> None:\n"
        '    """Calls :func:`nowhere` and ``refpkg.Good.missing``."""\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert build_api.build(tmp_path / "out", "refpkg") == [
        "refpkg.Good.stop: no docstring",
        "refpkg.bare: no docstring",
        "refpkg.broken: 'nowhere' is nothing the reference shows",
        "refpkg.broken: 'refpkg.Good.missing' is nothing the reference shows",
    ]
    (package / "__init__.py").write_text('"""A package."""\n\n__all__ = ["gone"]\n')
    monkeypatch.delitem(sys.modules, "refpkg")
    with pytest.raises(UserWarning, match="gone"):  # pdoc's warning: not listed, raised
        build_api.build(tmp_path / "out", "refpkg")
