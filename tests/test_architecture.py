"""The package's layout stays the architecture docs/design.md describes.

Each private module holds one concept and imports only the layers below it (``LAYERS``, lowest
first), at module top; no module is over 500 lines; ``__init__`` only re-exports, each public
name once; docs/design.md's module table lists exactly the modules there are.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lazynn

PACKAGE = Path(lazynn.__file__).parent
ROOT = PACKAGE.parent.parent

#: Every module of the package, lowest layer first: a module may import only those before it.
LAYERS = [
    "_errors",
    "_tensors",
    "_state",
    "_callers",
    "_refusals",
    "_deferred",
    "_placeholder",
    "_registries",
    "_snapshot",
    "_writes",
    "_mixin",
    "_infer",
    "_construct",
    "_checkpoint",
    "_inputs",
    "_spec",
    "_layout",
    "_layer",
    "_lazy",
    "_layers",
    "_layers.activation",
    "_layers.agnostic",
    "_layers.attention",
    "_layers.conv",
    "_layers.linear",
    "_layers.loss",
    "_layers.norm",
    "_layers.recurrent",
    "_layers.transformer",
    "_memo",
    "_meta_device",
    "_twin",
    "_rehearse",
    "_queue",
    "_replay",
    "_sharded",
    "_progress",
    "_factory",
    "_build",
    "_adopt",
    "_materialize",
    "_on_build",
    "_memory",
    "_report",
    "_summary",
    "_targets",
    "_shapes",
    "_fixes",
    "_cli",
    "__main__",
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _name(p): p for p in sorted(PACKAGE.rglob("*.py")) if _name(p)
}  # (the package's own __init__ is checked apart)


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
            else:  # `from . import _x`: the modules named
                found += [(".".join([*base, a.name]), id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lazynn."):
            found.append((node.module.removeprefix("lazynn."), id(node) in top))  # type: ignore[union-attr]
    return found


def test_every_module_has_its_place_in_the_layers() -> None:
    assert sorted(MODULES) == sorted(LAYERS)


@pytest.mark.parametrize("module", LAYERS)
def test_a_module_imports_only_lower_layers_at_its_top(module: str) -> None:
    below = set(LAYERS[: LAYERS.index(module)])
    for target, at_top in _imports(MODULES[module]):
        assert at_top, f"{module} imports {target} inside a function"
        assert target in below, f"{module} imports {target}, which is not below it"


@pytest.mark.parametrize("module", LAYERS)
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


def test_design_doc_lists_exactly_the_modules() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    rows = [line.split("|")[1] for line in design.splitlines() if line.startswith("| `_")]
    listed = {
        name.replace("/", ".").removesuffix(".py")
        for row in rows
        for name in re.findall(r"`([\w/]+\.py)`", row)
    }
    assert listed == {m for m in MODULES if m != "_layers"}
