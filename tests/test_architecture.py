"""The package's folders are its architecture: one wing per phase of a lazy module's life.

``src/lazynn`` holds the error family (``_errors.py``), the package's ``__init__`` (re-exports
only) and one subpackage, a *wing*, per phase (``WINGS``, lowest first). A module imports only
from its own wing or a lower one, at module top, and within a wing the imports form no cycle.
Each wing has a README listing its files and the wings it may import, which these tests hold
against the code; docs/design.md's table lists exactly the wings. No module is over 500 lines.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import shutil
import subprocess
import tokenize
from pathlib import Path

import pytest

import lazynn

PACKAGE = Path(lazynn.__file__).parent
ROOT = PACKAGE.parent.parent

#: The wings, lowest first: a module may import from its own wing or one before it.
WINGS = [
    "_errors",
    "_module",
    "_program",
    "_layer",
    "_nn",
    "_rehearsal",
    "_build",
    "_summary",
    "_cli",
    "__main__",
]
#: wings that are subpackages (with a README)
FOLDERS = [w for w in WINGS if (PACKAGE / w).is_dir()]


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


#: every module of the package but its own __init__ (checked apart)
MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if _name(p)}


def _wing(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(lazynn module imported, whether at module top) for each import of the package."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    package = _name(path).split(".")[:-1] if path.name != "__init__.py" else _name(path).split(".")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            if node.module:
                found.append((".".join([*base, node.module]), id(node) in top))
            else:  # `from . import x`: the modules named
                found += [(".".join([*base, a.name]), id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lazynn."):
            found.append((node.module.removeprefix("lazynn."), id(node) in top))  # type: ignore[union-attr]
    return found


def test_every_module_is_in_a_wing() -> None:
    assert {_wing(m) for m in MODULES} == set(WINGS)
    top = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "__main__.py", "_errors.py"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_from_its_own_wing_or_a_lower_one_at_its_top(module: str) -> None:
    allowed = set(WINGS[: WINGS.index(_wing(module)) + 1])
    for target, at_top in _imports(MODULES[module]):
        assert at_top, f"{module} imports {target} inside a function"
        assert _wing(target) in allowed, f"{module} imports {target}, from a higher wing"


@pytest.mark.parametrize("wing", FOLDERS)
def test_the_imports_inside_a_wing_form_no_cycle(wing: str) -> None:
    inside = {m for m in MODULES if _wing(m) == wing and m != wing}
    edges = {m: {t for t, _ in _imports(MODULES[m]) if t in inside} for m in inside}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in edges[module]:
            visit(target, (*path, module))
        done.add(module)

    for module in sorted(inside):
        visit(module, ())


def _readme(wing: str) -> str:
    return (PACKAGE / wing / "README.md").read_text()


@pytest.mark.parametrize("wing", FOLDERS)
def test_a_wing_readme_lists_exactly_its_files(wing: str) -> None:
    listed = re.findall(r"^\| `(\w+\.py)` \|", _readme(wing), re.M)
    files = sorted(p.name for p in (PACKAGE / wing).glob("*.py") if p.name != "__init__.py")
    assert sorted(listed) == files
    assert len(listed) == len(set(listed))


@pytest.mark.parametrize("wing", FOLDERS)
def test_a_wing_readme_says_which_wings_it_may_import_and_the_code_keeps_to_it(
    wing: str,
) -> None:
    (line,) = [x for x in _readme(wing).splitlines() if x.startswith("May import:")]
    declared = set(re.findall(r"`(\w+)`", line))
    assert declared <= set(WINGS[: WINGS.index(wing)]), "a wing may import only lower ones"
    used = {
        _wing(target)
        for module, path in MODULES.items()
        if _wing(module) == wing
        for target, _ in _imports(path)
    } - {wing}
    assert used <= declared, f"{wing} imports {sorted(used - declared)}, not in its README"


def test_a_wing_init_holds_nothing_but_its_docstring() -> None:
    for wing in FOLDERS:
        tree = ast.parse((PACKAGE / wing / "__init__.py").read_text())
        assert [type(node) for node in tree.body] == [ast.Expr], wing


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_500_lines(module: str) -> None:
    assert len(MODULES[module].read_text().splitlines()) <= 500


def test_the_package_init_only_re_exports_each_public_name_once() -> None:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            assert node.level == 1 or node.module == "importlib.metadata"
            for alias in node.names:
                if node.level == 1:
                    assert alias.asname == alias.name, "re-export as `from .x import N as N`"
                    exported.append(alias.name)
        elif isinstance(node, ast.Assign):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            assert target.id == "__all__"
        elif isinstance(node, ast.Try):  # __version__ from the metadata (or "0+unknown")
            assert ast.unparse(node).startswith("try:\n    __version__ = _version('lazynn')")
        else:
            assert isinstance(node, ast.Expr)  # the docstring
            assert isinstance(node.value, ast.Constant)
    assert len(exported) == len(set(exported))
    assert sorted(lazynn.__all__) == sorted([*exported, "__version__"])
    assert len(lazynn.__all__) == len(set(lazynn.__all__))


def test_the_version_is_the_package_metadata() -> None:
    from importlib.metadata import version

    assert lazynn.__version__ == version("lazynn")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{lazynn.__version__}"' in pyproject


def test_design_doc_lists_exactly_the_wings_and_points_at_their_readmes() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    listed = re.findall(r"^\| \[?`(_\w+)(?:/|\.py)`", design, re.M)
    assert sorted(listed) == sorted(w for w in WINGS if w != "__main__")
    for wing in FOLDERS:
        assert f"(../src/lazynn/{wing}/README.md)" in design, wing


def test_ruff_reads_every_module_of_the_package() -> None:
    """Its default excludes skip any folder named ``_build``: pyproject.toml lists them without
    it, and this checks ruff's own list of the files it reads against the tree."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff (the dev extra) is not installed")
    listed = subprocess.run(
        [ruff, "check", "--show-files", str(PACKAGE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    seen = {Path(line).resolve() for line in listed if line.endswith(".py")}
    assert {p.resolve() for p in PACKAGE.rglob("*.py")} <= seen


# --- the names in words ---------------------------------------------------------------------

#: the pages that name modules: the README, docs/, each wing's README, the tests' README
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *(PACKAGE / wing / "README.md" for wing in FOLDERS),
    ROOT / "tests" / "README.md",
]
#: the folders of the repository a path written from its root starts with
TOP = ("src", "tests", "docs", "examples", "benchmarks")
#: files a page names that are no file of the repository (Sphinx's, in docs/api.md)
NOT_OURS = {"conf.py"}
#: every file name of the repository (a page outside the wings may name one bare)
FILE_NAMES = {
    p.name
    for p in [*ROOT.iterdir(), *(q for top in TOP for q in (ROOT / top).rglob("*"))]
    if p.is_file() and "__pycache__" not in p.parts
}
#: ``lazynn._module.state.Context``: a module of the package, then its attributes
_DOTTED = re.compile(r"(?<![\w.])lazynn\._\w+(?:\.\w+)*")
#: ``_build/queue.py``, ``tests/cli/``, ``../src/lazynn/_nn/README.md``: a path to a folder or
#: a file (paths of other projects, ``torch/nn/init.py``, are not checked)
_PATH = re.compile(r"(?<![\w/.-])((?:\.\.?/)*(?:[A-Za-z_][\w-]*/)+(?:[\w-]+\.(?:py|md)\b)?)")
#: a code span: ``queue.py`` (a file of the wing that names it), ``_layer.infer.ambiguity``
_SPAN = re.compile(r"`+([^`\s]+)`+")
#: ``_mixin.py``: a module of the package named as in its flat layout, before the wings
_FLAT = re.compile(r"(?<![\w/.-])(_[a-z]\w*\.py)\b")


def _words(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a file says in words: a page, whole; a module's docstrings (and
    other string statements) and comments."""
    text = path.read_text()
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    lines = tokenize.generate_tokens(io.StringIO(text).readline)
    found = [(token.start[0], token.string) for token in lines if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            said = node.value.value
            if isinstance(said, str):
                found += [(node.lineno + i, line) for i, line in enumerate(said.splitlines())]
    return found


def _exists(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or an attribute (to any depth) of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(value, attr):
                return False
            value = getattr(value, attr)
        return True
    return False


def _missing(path: Path) -> list[str]:
    """The modules, files and folders ``path`` names in words that do not exist."""
    inside = path.relative_to(PACKAGE).parts[0] if path.is_relative_to(PACKAGE) else None
    wing = PACKAGE / inside if inside in FOLDERS else None
    missing = []
    for line, text in _words(path):
        named = [m.group() for m in _DOTTED.finditer(text) if not _exists(m.group())]
        for name in (m.group(1) for m in _PATH.finditer(text)):
            first = name.split("/")[0]
            if first in (".", ".."):
                base = path.parent
            elif first in TOP:
                base = ROOT
            elif first == "lazynn":
                base = PACKAGE.parent
            elif re.fullmatch(r"_[a-z]\w*", first):  # a wing: _build/queue.py
                base = PACKAGE
            else:
                continue
            target = base / name
            if not (target.is_dir() if name.endswith("/") else target.is_file()):
                named.append(name)
        for span in (m.group(1).removesuffix("()") for m in _SPAN.finditer(text)):
            if re.fullmatch(r"_[a-z]\w*(?:\.[A-Za-z_]\w*)+", span) and span[-3:] != ".py":
                if not _exists(f"lazynn.{span}"):  # _layer.infer.ambiguity
                    named.append(span)
            elif re.fullmatch(r"[\w-]+\.py", span):  # a bare file name
                if wing is not None:  # in a wing: one of its own, or a test
                    found = (wing / span).is_file() or (
                        span.startswith("test_") and span in FILE_NAMES
                    )
                else:
                    found = span in FILE_NAMES or span in NOT_OURS
                if not found:
                    named.append(span)
        named += [m.group(1) for m in _FLAT.finditer(text) if not (PACKAGE / m.group(1)).is_file()]
        missing += [f"{path.relative_to(ROOT)}:{line}: {name}" for name in dict.fromkeys(named)]
    return missing


@pytest.mark.parametrize(
    "path",
    [*PAGES, *sorted(PACKAGE.rglob("*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_module_a_page_or_a_comment_names_exists(path: Path) -> None:
    """A module, file or folder named in the README, docs/, a wing's README, the tests'
    README, or a docstring or comment of the package, by its dotted name
    (``lazynn._module.state``), its path (``_build/queue.py``, ``tests/cli/``), or bare in a
    code span (in a wing: one of the wing's own files), exists."""
    missing = _missing(path)
    assert not missing, "named, and missing:\n" + "\n".join(missing)


# --- the tests' folders ------------------------------------------------------------------------

#: each wing's tests: a folder named for the wing without its underscore, but ``building/`` for
#: ``_build/`` (pytest skips folders named ``build``)
TEST_FOLDERS = {wing: "building" if wing == "_build" else wing[1:] for wing in FOLDERS}
#: the tests' folders that are no wing's (tests/README.md): what lazynn meets outside itself
#: and the documentation, in its table; the helpers' published models and golden files
NOT_WINGS = {"ecosystem": True, "docs": True, "real_models": False, "golden": False}


def test_the_tests_have_a_folder_per_wing_and_no_other_but_the_few_named() -> None:
    tests = ROOT / "tests"
    folders = [p.name for p in tests.iterdir() if p.is_dir() and p.name[0] not in "._"]
    assert sorted(folders) == sorted([*TEST_FOLDERS.values(), *NOT_WINGS])
    table = re.findall(
        r"^\| `(\w+)/` \| (?:`(_\w+)/`)? ?\|", (tests / "README.md").read_text(), re.M
    )
    wings = {folder: wing for wing, folder in TEST_FOLDERS.items()}
    assert dict(table) == wings | {folder: "" for folder, listed in NOT_WINGS.items() if listed}
    assert len(table) == len(dict(table))
