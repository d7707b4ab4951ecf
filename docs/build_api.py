"""Build lazynn's API reference, HTML generated from the docstrings by pdoc, and fail on what
would make it wrong: any warning, a public name without a docstring, a cross-reference that
points at nothing in the reference.

    python -W error docs/build_api.py OUTPUT_DIR

writes ``OUTPUT_DIR/lazynn.html`` (the reference: the package docstring as its front page,
then every name of ``lazynn.__all__`` with its signature and docstring), ``index.html`` and
``search.js``; or prints each problem and exits with 1. docs/api.md says why pdoc and what
it reads. pdoc has no warnings-as-errors switch and links a reference it can resolve, leaving
one it cannot as plain code, silently; this script adds the checks:

- every warning raised while rendering is an error (``-W error`` extends it to the imports);
- every public name, and every method or property the reference shows, has a docstring;
- every cross-reference (``:class:`X```, ``:func:`lazynn.x```, ``:meth:`X.y```..., and a
  code span naming ``lazynn.x``) resolves to something the reference shows.

What it adds to pdoc's reading of the code, so the reference shows what a reader can use:

- a public dataclass shows the fields and methods it inherits from a private one
  (``Summary`` has ``Report``'s: pdoc leaves out members of classes it does not render);
- a class shows its constructor even when a base class defines it (``LazyConv2d``'s is its
  private base's; pdoc lists it with the base's members, which it leaves out when it does not
  render the base), and a constructor that inherits ``nn.Module.__init__``'s docstring shows
  none (as pdoc does for ``object.__init__``'s);
- a role's ``~`` is dropped (pdoc shows it as written: ``~lazynn.Summary``);
- a public name that is data (``UNKNOWN``, ``__version__``) shows the string literal written
  just after the statement that makes it, in ``lazynn/__init__.py`` or in the module that
  defines its type (pdoc reads those after plain assignments in the module it renders only).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import itertools
import re
import sys
import warnings
from pathlib import Path
from typing import Any

try:
    import pdoc
    import pdoc.doc
    import pdoc.render
except ModuleNotFoundError:  # (the dev extra's; said in one line, not a traceback)
    sys.exit(
        "docs/build_api.py: expected pdoc, which builds the reference, received no module "
        "named 'pdoc'. Fix: pip install -e '.[dev]' (or pip install 'pdoc>=16')"
    )
from torch import nn

PACKAGE = "lazynn"
#: pdoc's reading of the docstrings: Google sections (Args:, Attributes:) and reST roles
DOCFORMAT = "google"
#: reST roles, ``:class:`~lazynn.Summary``` (pdoc renders them as code, linked if it can)
ROLE = re.compile(r"(?::py)?:(?:mod|func|data|const|class|meth|attr|exc|obj):`([^`]+)`")
#: a role's ``~`` (Sphinx's "show the last name only"), which pdoc would show as written
TILDE = re.compile(r"(:(?:mod|func|data|const|class|meth|attr|exc|obj):`)~")
#: a warning pdoc raises for torch's classes, not lazynn's: ``torch.Tensor`` annotates
#: ``_is_param`` without defining it, so pdoc cannot say where the placeholders' (private,
#: never shown) ``_is_param`` comes from
TORCH_QUIRK = r"Cannot determine where lazynn\.Uninitialized\w+\._is_param is taken from"


def reference(package: str = PACKAGE) -> pdoc.doc.Module:
    """pdoc's documentation of ``package``, with the adjustments the module docstring lists."""
    pdoc.render.configure(docformat=DOCFORMAT, show_source=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=TORCH_QUIRK)
        module = pdoc.doc.Module(importlib.import_module(package))
        for doc in module.members.values():
            if isinstance(doc, pdoc.doc.Class):
                _inherit_private_fields(doc)
                _own_constructor(doc)
                for member in doc.own_members:
                    if member.name == "__init__" and member.docstring == nn.Module.__init__.__doc__:
                        member.docstring = ""
            elif isinstance(doc, pdoc.doc.Variable) and not doc.docstring:
                doc.docstring = _literal_after(doc.name, module.obj)
        for doc in [module, *shown(module).values()]:
            doc.docstring = TILDE.sub(r"\1", doc.docstring)
    return module


def shown(module: pdoc.doc.Module) -> dict[str, pdoc.doc.Doc[Any]]:
    """What the reference shows, by qualified name: each public name, and each public member
    of a public class."""
    out: dict[str, pdoc.doc.Doc[Any]] = {}
    for name in module.obj.__all__:
        doc = module.members[name]
        out[name] = doc
        if isinstance(doc, pdoc.doc.Class):
            for member in doc.own_members:
                if not member.name.startswith("_") or (
                    member.name == "__init__" and member.docstring
                ):
                    out[member.qualname] = member
    return out


def problems(module: pdoc.doc.Module) -> list[str]:
    """Every public name or shown method without a docstring, and every cross-reference that
    does not resolve to something the reference shows."""
    docs = shown(module)
    package = module.modulename
    found = []
    for qualname, doc in docs.items():
        needs_docstring = "." not in qualname or isinstance(doc, pdoc.doc.Function)
        if needs_docstring and not doc.docstring.strip():
            found.append(f"{package}.{qualname}: no docstring")
        scope = qualname if isinstance(doc, pdoc.doc.Class) else qualname.rpartition(".")[0]
        for target in _references(doc.docstring, package):
            if _resolve(target, scope, docs, package) is None:
                found.append(f"{package}.{qualname}: {target!r} is nothing the reference shows")
    return found


def build(output: Path, package: str = PACKAGE) -> list[str]:
    """Write the reference of ``package`` into ``output``; return its problems (none: it is
    right). A warning raised on the way is raised as an error."""
    module = reference(package)
    found = problems(module)
    output.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=TORCH_QUIRK)
        everything = {package: module}
        (output / f"{package}.html").write_text(pdoc.render.html_module(module, everything))
        (output / "index.html").write_text(pdoc.render.html_index(everything))
        (output / "search.js").write_text(pdoc.render.search_index(everything))
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    found = build(Path(argv[0]))
    for problem in found:
        print(f"docs/build_api.py: {problem}", file=sys.stderr)
    return 1 if found else 0


# --- the adjustments ----------------------------------------------------------------------------


def _inherit_private_fields(doc: pdoc.doc.Class) -> None:
    """Show in a public dataclass the members of its private dataclass bases."""
    if not dataclasses.is_dataclass(doc.obj):
        return
    names = {m.name for m in doc.own_members}
    for (modulename, qualname), members in doc.inherited_members.items():
        base = pdoc.doc.Module.from_name(modulename).get(qualname)
        private = any(part.startswith("_") for part in f"{modulename}.{qualname}".split("."))
        if base is None or not private or not dataclasses.is_dataclass(base.obj):
            continue
        for member in members:
            if member.name not in names:
                doc.own_members.append(member)
                names.add(member.name)


def _own_constructor(doc: pdoc.doc.Class) -> None:
    """Show a class's constructor even when a base class defines it (``LazyConv2d``'s is its
    private base's): its signature is the class's."""
    init = doc.members.get("__init__")
    if init is not None and init not in doc.own_members:
        doc.own_members.insert(0, init)


def _literal_after(name: str, package: Any) -> str:
    """The string literal written just after the top-level statement that makes ``name``."""
    value = getattr(package, name)
    for where in (package, sys.modules.get(type(value).__module__)):
        if where is None or not getattr(where, "__file__", None):
            continue
        body = ast.parse(Path(where.__file__).read_text()).body
        for statement, following in itertools.pairwise(body):
            text = _string(following)
            if text is not None and name in _names_made(statement):
                return inspect.cleandoc(text)
    return ""


def _names_made(statement: ast.stmt) -> set[str]:
    if isinstance(statement, ast.ImportFrom):
        return {alias.asname or alias.name for alias in statement.names}
    return {
        node.id
        for node in ast.walk(statement)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }


def _string(statement: ast.stmt) -> str | None:
    """The text of a statement that is a string literal alone, else None."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        value = statement.value.value
        return value if isinstance(value, str) else None
    return None


# --- the cross-references -----------------------------------------------------------------------


def _references(docstring: str, package: str) -> list[str]:
    """The targets of the roles of ``docstring``, and of its code spans naming something of
    ``package`` (``lazynn.build``, ``lazynn.Summary.render()``), each once."""
    roles = [match[1] for match in ROLE.finditer(docstring)]
    named = re.findall(rf"``?({package}(?:\.\w+)+)(?:\(\))?``?", docstring)
    return list(dict.fromkeys([*roles, *named]))


def _resolve(
    target: str, scope: str, docs: dict[str, pdoc.doc.Doc[Any]], package: str
) -> str | None:
    """The qualified name ``target`` names in the reference, read as pdoc reads it: absolute
    (``lazynn.Summary.render``), or relative to the class it is written in, or to the
    package; None if the reference shows no such thing."""
    name = target.lstrip("~").removesuffix("()")
    if name.startswith(f"{package}."):
        name = name.removeprefix(f"{package}.")
        return name if name in docs else None
    candidates = [f"{scope}.{name}"] if scope else []
    return next((c for c in [*candidates, name] if c in docs), None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
