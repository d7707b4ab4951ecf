"""The command line's TARGET: ``FILE.py:NAME`` or ``package.module:NAME``, with literal
arguments in Python call syntax (``FILE.py:NAME(2, width=64)``), parsed with ``ast`` (nothing
is evaluated), loaded, and called to construct the model on the meta device.

>>> target = parse_target("examples/models.py:lazy_llama(2, 64, n_heads=4)")
>>> target.source, target.name, target.args, target.kwargs
('examples/models.py', 'lazy_llama', (2, 64), (('n_heads', 4),))
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import os
import re
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from .._errors import LazynnError, a_or_an, first_line

__all__ = ["CommandError", "Target", "construct", "load_factory", "parse_target"]

_RUN_NAME = "__lazynn_summary__"
#: how many of a file's callables a "no callable" error lists
_LIST_AT_MOST = 20
_LITERALS = "numbers, strings, True, False, None, and tuples, lists or dicts of them"


class CommandError(Exception):
    """A user error on the command line: printed as one line, ``head`` then, when it has one,
    ``Fix: fix`` (kept apart, so that where the user's code raised it goes between them)."""

    def __init__(self, head: str, fix: str = "") -> None:
        super().__init__(f"{head} Fix: {fix}" if fix else head)
        self.head, self.fix = head, fix

    @classmethod
    def of(
        cls, error: LazynnError, where: str | None = None, fix: str | None = None
    ) -> CommandError:
        """``error`` as a command-line error (its parts; ``where`` and ``fix`` replace its
        own, and its outcome, "the model is unchanged", is left out)."""
        parts = error.parts
        if parts is None:
            return cls(str(error))
        if where is not None:
            parts = dataclasses.replace(parts, where=where)
        return cls(parts.head(), parts.fix if fix is None else fix)


# --- the target ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A parsed TARGET: where the factory lives, its name, and the arguments to call it with."""

    text: str
    source: str  # a file path or a module name
    name: str  # NAME, or NAME.attr...
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    called: bool = False  # written with parentheses


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names, else None (read without recursion)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _shown(node: ast.expr) -> str:
    """``node`` as source text for an error, cut short (a deep one without recursion)."""
    try:
        text = ast.unparse(node)
    except (RecursionError, MemoryError):
        return "(an expression nested too deeply to show)"
    return _cut(text, 60)


def _literal(node: ast.expr, text: str, what: str) -> Any:
    """The value of a literal argument ``node``; anything else is a one-line error."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
        raise CommandError(
            f"{_cut(text)!r}: the factory's arguments must be Python literals ({_LITERALS}), "
            f"received {_shown(node)!r} for {what}"
        ) from error


def _parse_call(source: str, call: str, text: str) -> Target | None:
    """``NAME`` or ``NAME(literal, key=literal)`` after the colon, or None if it is not."""
    try:
        tree = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        return None
    except (RecursionError, MemoryError) as error:  # (thousands of nested - or not)
        raise CommandError(
            f"{_cut(text)!r}: the target nests too deeply for Python's parser "
            f"({type(error).__name__}: {error}).",
            "write the factory's arguments as plain literals",
        ) from error
    name = _dotted(tree)
    if name is not None:
        return Target(text, source, name)
    if not isinstance(tree, ast.Call) or (name := _dotted(tree.func)) is None:
        return None
    args = []
    for index, node in enumerate(tree.args):
        if isinstance(node, ast.Starred):
            raise CommandError(f"{text!r}: *arguments are not supported; write each one")
        args.append(_literal(node, text, f"argument {index + 1}"))
    kwargs: list[tuple[str, Any]] = []
    for keyword in tree.keywords:
        if keyword.arg is None:
            raise CommandError(f"{text!r}: **arguments are not supported; write each one")
        if any(keyword.arg == k for k, _ in kwargs):  # (ast takes it; Python refuses it)
            raise CommandError(f"{text!r}: keyword argument repeated: {keyword.arg}")
        kwargs.append((keyword.arg, _literal(keyword.value, text, keyword.arg)))
    return Target(text, source, name, tuple(args), tuple(kwargs), called=True)


def parse_target(text: str) -> Target:
    """Split TARGET at the first colon after which a factory name (or call) follows, so that
    colons in a Windows path (``C:\\...``) or in string arguments are left alone."""
    for match in re.finditer(":", text):
        source, call = text[: match.start()], text[match.end() :]
        if source and call.strip():
            target = _parse_call(source, call, text)
            if target is not None:
                return target
    head = (
        f"expected TARGET as FILE.py:NAME or MODULE:NAME, optionally with literal arguments "
        f"NAME(...), received {_cut(text)!r}"
    )
    if text.endswith(".py") and Path(text).is_file():  # (the file alone: what does it define?)
        namespace, module_name = _run_file(text)
        defined = _defined(namespace, module_name)
        if defined:
            raise CommandError(
                f"{head}, a file without the name of the factory in it.",
                f"name it after a colon, {text}:{defined[0]}; the file defines: "
                + _listed(namespace, module_name),
            )
    raise CommandError(head)


def _cut(text: str, most: int = 100) -> str:
    """A long text (a TARGET, an argument), cut for an error message."""
    return text if len(text) <= most else f"{text[: most - 3]}..."


def _run_file(source: str) -> tuple[dict[str, Any], str]:
    """Run a Python file: its namespace, and the ``__module__`` of what it defines."""
    path = Path(source)
    if not path.is_file():
        raise CommandError(f"no such file: {source}")
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # so the file can import its neighbours, as `python FILE` can
    try:
        namespace = runpy.run_path(str(path), run_name=_RUN_NAME)
    except Exception as error:
        raise _failed(f"{source} failed to run", error) from error
    finally:
        sys.path.remove(folder)
    return namespace, _RUN_NAME


def _failed(what: str, error: Exception) -> CommandError:
    """An error the user's file raised as it ran (its own code's: a lazynn error there keeps
    its parts and its own fix, which is about that code, not the command's arguments)."""
    parts = error.parts if isinstance(error, LazynnError) else None
    if parts is not None:
        return CommandError(f"{what}: {type(error).__name__}: {parts.head()}", parts.fix)
    return CommandError(f"{what}: {type(error).__name__}: {first_line(error)}")


def _import_module(source: str) -> tuple[dict[str, Any], str]:
    """Import a module: its namespace, and its name (the ``__module__`` of what it defines)."""
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:  # as `python -m lazynn` sees the current folder, so does the `lazynn` script
        sys.path.insert(0, os.getcwd())
    try:
        module: ModuleType = importlib.import_module(source)
    except ModuleNotFoundError as error:
        if error.name == source or source.startswith(f"{error.name}."):
            raise CommandError(
                f"no such file or module: {source} (as a module: no module named "
                f"{error.name!r}; a file path must exist or end in .py)"
            ) from error
        raise CommandError(f"{source} failed to import: ModuleNotFoundError: {error}") from error
    except Exception as error:
        raise _failed(f"{source} failed to import", error) from error
    finally:
        if added:
            sys.path.remove(os.getcwd())
    return vars(module), module.__name__


def _own(value: Any, module_name: str) -> bool:
    """Whether ``value`` is a function or class the file or module ``module_name`` defines (a
    package: itself or one of its submodules), not one it imports."""
    owner = getattr(value, "__module__", None)
    return (
        (inspect.isfunction(value) or inspect.isclass(value))
        and isinstance(owner, str)
        and (owner == module_name or owner.startswith(f"{module_name}."))
    )


def _defined(namespace: dict[str, Any], module_name: str) -> list[str]:
    """The public functions, then classes, defined in the file or module (not those it
    imports), in the order of their definition."""
    own = {
        key: value
        for key, value in namespace.items()
        if not key.startswith("_") and _own(value, module_name)
    }
    return [k for k, v in own.items() if inspect.isfunction(v)] + [
        k for k, v in own.items() if inspect.isclass(v)
    ]


def _listed(namespace: dict[str, Any], module_name: str) -> str:
    """What an error says the file or module defines: at most 20 names."""
    defined = _defined(namespace, module_name)
    listed = ", ".join(defined[:_LIST_AT_MOST])
    if len(defined) > _LIST_AT_MOST:
        listed += f", ... ({len(defined) - _LIST_AT_MOST} more)"
    return listed or "no public function or class"


def _imported(
    target: Target, value: Any, namespace: dict[str, Any], module_name: str
) -> CommandError:
    """The refusal of a TARGET whose first name the file or module imports (a module, a
    function of another module...) rather than defines: a target runs what the file defines."""
    head = target.name.split(".")[0]
    owner, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if inspect.ismodule(value):
        what = f"the module {value.__name__}, which it imports"
    elif isinstance(owner, str) and isinstance(qualname, str) and callable(value):
        what = f"{owner}.{qualname}, which it imports (to summarize it: {owner}:{qualname})"
    else:
        what = f"{a_or_an(type(value).__name__)} object, not a function or class"
    text = (
        f"{target.source}: {head!r} is {what}; a target names a function or class that "
        f"{target.source} defines itself, or an attribute of one (Net.from_config); it "
        "defines: " + _listed(namespace, module_name)
    )
    if isinstance(value, nn.Module):  # (a model the file makes as it runs: say how to name it)
        return CommandError(
            text + ".",
            f"name a function that makes the model, def make_{head}(): return "
            f"{type(value).__name__}(...), then {target.source}:make_{head} (the summary makes "
            "it on meta, allocating nothing)",
        )
    return CommandError(text)


def load_factory(target: Target) -> Callable[..., Any]:
    """The callable TARGET names, from its file or module: a function or class the file or
    module defines (or an attribute of one), never a name it imports."""
    source = target.source  # a file if it exists or is written as a path (a missing file)
    if Path(source).is_file() or source.endswith(".py") or "/" in source or os.sep in source:
        namespace, module_name = _run_file(target.source)
    else:
        namespace, module_name = _import_module(target.source)
    head, *rest = target.name.split(".")
    factory: object = namespace.get(head)
    if head in namespace and not _own(factory, module_name):
        raise _imported(target, factory, namespace, module_name)
    dunder = [a for a in rest if a.startswith("__") and a.endswith("__")]
    if dunder:
        raise CommandError(
            f"{_cut(target.text)!r}: a target names a function or class, or a public attribute "
            f"of one, not {dunder[0]!r}"
        )
    for attribute in rest:
        factory = getattr(factory, attribute, None)
    if callable(factory):
        return factory
    close = difflib.get_close_matches(head, _defined(namespace, module_name), n=1)
    hint = f"did you mean {close[0]!r}? " if close and not rest else ""
    raise CommandError(
        f"{target.source} has no callable {target.name!r}; {hint}it defines: "
        + _listed(namespace, module_name)
    )


def construct(target: Target, factory: Callable[..., nn.Module]) -> Callable[[], nn.Module]:
    """The factory with TARGET's arguments, called with none (``lazynn.summary`` runs it as
    ``lazynn.build``'s factory form does: its ``__init__`` code runs with every size known);
    an exception it raises becomes the command's error, naming the call."""
    kwargs = dict(target.kwargs)
    text = f"{target.text}{'' if target.called else '()'}"

    def made() -> nn.Module:
        try:
            return factory(*target.args, **kwargs)
        except LazynnError:
            raise
        except Exception as error:
            failed = f"{text} failed: {type(error).__name__}: {first_line(error)}"
            fix = ""
            if isinstance(error, TypeError) and not _binds(factory, target.args, kwargs):
                failed += "."
                fix = (
                    f"pass its arguments in the target, in Python call syntax: "
                    f"'{target.source}:{target.name}(...)'; its signature: "
                    f"{target.name}{_signature(factory)}"
                )
            raise CommandError(failed, fix) from error

    made.__qualname__ = made.__name__ = text  # (what errors name: the target's call)
    return made


def _signature(factory: Callable[..., Any]) -> str:
    """``(a, b=1)``: the factory's signature as the error shows it."""
    try:
        return str(inspect.signature(factory))
    except (TypeError, ValueError):
        return "(...)"


def _binds(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments fit the factory's signature (a TypeError is then its own)."""
    try:
        inspect.signature(factory).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to check against
        return True
    return True
