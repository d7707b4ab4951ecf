"""The package's folders are its architecture: one wing per phase of a lazy module's life.

``src/lazynn`` holds the error family (``_errors.py``), the package's ``__init__`` (re-exports
only) and one subpackage, a *wing*, per phase (``WINGS``, lowest first). A module imports only
from its own wing or a lower one, at module top, and within a wing the imports form no cycle.
Each wing has a README listing its files and the wings it may import, which these tests hold
against the code; docs/design.md's table lists exactly the wings. No module is over 500 lines.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
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
    "_materialize",
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
