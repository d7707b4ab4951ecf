"""The command line: ``lazynn summary TARGET --input 1x3x224x224`` (or ``python -m lazynn``).

``TARGET`` names a model factory: ``FILE.py:NAME`` (a function or class in a Python file) or
``package.module:NAME`` (in an importable module), optionally with literal arguments in
Python call syntax, ``FILE.py:NAME(2, width=64)``. The factory is called on the meta device,
so even a 70B-parameter model costs no memory; the summary is computed on meta too. Errors
print one line (what, where, the fix, naming this command's flags) and exit with status 2,
no traceback.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import os
import re
import runpy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import torch
from torch import nn

from ._errors import LazynnError
from ._rehearse import Spec
from ._summary import summary

__all__ = ["console", "main"]

_USAGE_EXAMPLE = "lazynn summary examples/models.py:resnet50 --input 1x3x224x224"
#: the name the factories of a file run by the command line see as ``__name__``
_RUN_NAME = "__lazynn_summary__"
#: how many of a file's callables a "no callable" error lists
_LIST_AT_MOST = 20
_FORMATS = ("table", "markdown", "json")
_LITERALS = "numbers, strings, True, False, None, and tuples, lists or dicts of them"


class CommandError(Exception):
    """A user error on the command line: printed as one line."""


def _version() -> str:
    """What --version prints: lazynn's version and torch's."""
    try:  # (as lazynn.__version__: the installed distribution's)
        version = metadata.version("lazynn")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"lazynn {version} (torch {torch.__version__})"


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments, with their help texts."""
    parser = argparse.ArgumentParser(
        prog="lazynn" if Path(sys.argv[0]).stem == "lazynn" else "python -m lazynn",
        description="Shape-inferring (lazy) layers for PyTorch.",
        epilog=f"example: {_USAGE_EXAMPLE}",
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd = commands.add_parser(
        "summary",
        help="print a model's layers, shapes and parameter counts, computed on meta",
        description="Print the summary table of a model built from example input shapes.\n"
        "Nothing is allocated: the model is constructed and run on the meta device.",
        epilog="examples:\n"
        "  lazynn summary examples/models.py:resnet50 --input 1x3x224x224\n"
        "  lazynn summary 'examples/models.py:lazy_llama(2, 64, 4, 128, 1000)' "
        "--input 1x16:long\n"
        "  lazynn summary examples.models:gpt2_medium --input 1x1024:long",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "target",
        metavar="TARGET",
        help="the model's factory: FILE.py:NAME (a function or class in a Python file) or "
        "MODULE:NAME (in an importable module such as pkg.models), called with no arguments, "
        "or with literal arguments in Python call syntax: 'FILE.py:NAME(2, width=64)' "
        "(quote it for the shell)",
    )
    cmd.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SHAPE[:DTYPE]",
        help="an example input shape such as 1x3x224x224, or 1x1024:long for token ids "
        "(without a dtype: the model's, see --dtype); repeat for several inputs, in the "
        "order of forward's arguments",
    )
    cmd.add_argument(
        "--dtype",
        default=None,
        help="the model's floating-point dtype (float32, float16, bfloat16...): sets the "
        "default dtype while the model is constructed and summarized (default: float32)",
    )
    view = cmd.add_argument_group("the view")
    view.add_argument(
        "--depth",
        type=_count(0),
        default=None,
        metavar="N",
        help="show modules down to nesting level N (0: the model alone; default: the "
        "deepest level whose table fits a screen)",
    )
    view.add_argument(
        "--expand",
        action="store_true",
        help="show every repeated block (default: one row for a run of identical "
        "consecutive blocks)",
    )
    view.add_argument(
        "--format",
        choices=_FORMATS,
        default="table",
        help="table (text, the default), markdown, or json (every figure, for scripts)",
    )
    view.add_argument(
        "--width",
        type=_count(0),
        default=100,
        metavar="N",
        help="the table's widest line, in characters (long names and shapes are cut "
        "with ...; default: 100; 0: no limit)",
    )
    run = cmd.add_argument_group("the run")
    run.add_argument(
        "--eval",
        action="store_true",
        help="run the example in eval mode (default: train mode, as a first training step)",
    )
    run.add_argument(
        "--training",
        action="store_true",
        help="add an estimate of one training step's memory: parameters, gradients, "
        "optimizer states, activations",
    )
    run.add_argument(
        "--optimizer",
        default=None,
        metavar="NAME",
        help="the optimizer of the --training estimate, a torch.optim name in any case "
        "(adamw, the default, sgd, adam...); implies --training",
    )
    return parser


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, received {text!r}")
        return value

    return parse


# --- the target ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """A parsed TARGET: where the factory lives, its name, and the arguments to call it with."""

    text: str
    source: str  # a file path or a module name
    name: str  # NAME, or NAME.attr...
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    called: bool = False  # written with parentheses


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr, text: str, what: str) -> Any:
    """The value of a literal argument ``node``; anything else is a one-line error."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CommandError(
            f"{text!r}: the factory's arguments must be Python literals ({_LITERALS}), "
            f"received {ast.unparse(node)!r} for {what}"
        ) from None


def _parse_call(source: str, call: str, text: str) -> _Target | None:
    """``NAME`` or ``NAME(literal, key=literal)`` after the colon, or None if it is not."""
    try:
        tree = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        return None
    name = _dotted(tree)
    if name is not None:
        return _Target(text, source, name)
    if not isinstance(tree, ast.Call) or (name := _dotted(tree.func)) is None:
        return None
    args = []
    for index, node in enumerate(tree.args):
        if isinstance(node, ast.Starred):
            raise CommandError(f"{text!r}: *arguments are not supported; write each one")
        args.append(_literal(node, text, f"argument {index + 1}"))
    kwargs = []
    for keyword in tree.keywords:
        if keyword.arg is None:
            raise CommandError(f"{text!r}: **arguments are not supported; write each one")
        kwargs.append((keyword.arg, _literal(keyword.value, text, keyword.arg)))
    return _Target(text, source, name, tuple(args), tuple(kwargs), called=True)


def _parse_target(text: str) -> _Target:
    """Split TARGET at the first colon after which a factory name (or call) follows, so that
    colons in a Windows path (``C:\\...``) or in string arguments are left alone."""
    for match in re.finditer(":", text):
        source, call = text[: match.start()], text[match.end() :]
        if source and call.strip():
            target = _parse_call(source, call, text)
            if target is not None:
                return target
    raise CommandError(
        f"expected TARGET as FILE.py:NAME or MODULE:NAME, optionally with literal arguments "
        f"NAME(...), received {text!r}"
    )


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
        raise CommandError(f"{source} failed to run: {type(error).__name__}: {error}") from None
    finally:
        sys.path.remove(folder)
    return namespace, _RUN_NAME


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
            ) from None
        raise CommandError(f"{source} failed to import: ModuleNotFoundError: {error}") from None
    except Exception as error:
        raise CommandError(f"{source} failed to import: {type(error).__name__}: {error}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    return vars(module), module.__name__


def _defined(namespace: dict[str, Any], module_name: str) -> list[str]:
    """The public functions, then classes, defined in the file or module (not those it
    imports), in the order of their definition."""
    own = {
        key: value
        for key, value in namespace.items()
        if not key.startswith("_") and getattr(value, "__module__", None) == module_name
    }
    return [k for k, v in own.items() if inspect.isfunction(v)] + [
        k for k, v in own.items() if inspect.isclass(v)
    ]


def _load_factory(target: _Target) -> Callable[..., Any]:
    """The callable TARGET names, from its file or module."""
    source = target.source  # a file if it exists or is written as a path (a missing file)
    if Path(source).is_file() or source.endswith(".py") or "/" in source or os.sep in source:
        namespace, module_name = _run_file(target.source)
    else:
        namespace, module_name = _import_module(target.source)
    head, *rest = target.name.split(".")
    factory = namespace.get(head)
    for attribute in rest:
        factory = getattr(factory, attribute, None)
    if callable(factory):
        return factory  # type: ignore[no-any-return]
    defined = _defined(namespace, module_name)
    close = difflib.get_close_matches(head, defined, n=1)
    hint = f"did you mean {close[0]!r}? " if close and not rest else ""
    listed = ", ".join(defined[:_LIST_AT_MOST])
    if len(defined) > _LIST_AT_MOST:
        listed += f", ... ({len(defined) - _LIST_AT_MOST} more)"
    raise CommandError(
        f"{target.source} has no callable {target.name!r}; {hint}it defines: "
        + (listed or "no public function or class")
    )


def _construct(target: _Target, factory: Callable[..., Any]) -> nn.Module:
    """Call the factory with TARGET's arguments on the meta device: the model."""
    kwargs = dict(target.kwargs)
    with torch.device("meta"):
        try:
            model = factory(*target.args, **kwargs)
        except Exception as error:
            text = f"{target.text}{'' if target.called else '()'} failed: "
            text += f"{type(error).__name__}: {error}"
            if isinstance(error, TypeError) and not _binds(factory, target.args, kwargs):
                text += (
                    f". Fix: pass its arguments in the target, in Python call syntax: "
                    f"'{target.source}:{target.name}(...)'; its signature: "
                    f"{target.name}{_signature(factory)}"
                )
            raise CommandError(text) from None
    if not isinstance(model, nn.Module):
        raise CommandError(f"{target.text} returned {type(model).__name__}, expected an nn.Module")
    return model


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


# --- fixes in the command line's terms ----------------------------------------------------

_DTYPE_MISMATCH = re.compile(
    r"expected a torch\.(\w+) input \(the layer's dtype\), received a torch\.(\w+) input"
)
#: the Python API's fix (its start) -> the command line's
_FIXES = {
    "reshape the input": "change the --input shape so that this layer receives one of the "
    "accepted layouts",
    "call the layer with a non-empty input": "give --input no 0 dimension",
    "check the example inputs' shapes": "check the --input shapes (and dtypes: ':long' for "
    "token ids) and the layers before this one",
    "check the example inputs": "give one --input per argument of the model's forward, in order",
    "check the input's layout": "check the --input shapes and the layer's arguments in the factory",
    "call it with a valid input": "check the --input shapes and dtypes",
    "give a batch of more than one": "give --input a batch of more than one, or pass --eval",
}


def _dtype_fix(expected: str, received: str, inputs: Sequence[str]) -> str:
    """The fix for a layer of dtype ``expected`` given an input of dtype ``received``."""
    given = [
        (text, text.partition(":")[2])
        for text in inputs
        if (suffix := text.partition(":")[2])
        and getattr(torch, suffix, None) == getattr(torch, received, None)
    ]
    drop = " or ".join(f"drop ':{suffix}' from --input {text}" for text, suffix in given)
    if getattr(torch, received).is_floating_point:
        fix = f"pass --dtype {received} (to construct the model in {received})"
        return f"{fix} or {drop}" if drop else fix
    floating = "this layer takes floating-point input (token ids go to an nn.Embedding first)"
    return f"{floating}: {drop}" if drop else f"{floating}: check the --input dtypes"


def _cli_fix(text: str, inputs: Sequence[str]) -> str:
    """``text`` with its Python-API fix (``x.to(dtype)``...) replaced by one that names this
    command's flags, when one applies; otherwise ``text`` unchanged."""
    head, sep, fix = text.rpartition(" Fix: ")
    if not sep:
        return text
    if (mismatch := _DTYPE_MISMATCH.search(head)) and "x.to(dtype)" in fix:
        return f"{head} Fix: {_dtype_fix(mismatch[1], mismatch[2], inputs)}"
    if re.search(r"forward\(\) (takes|missing)", head):  # as many inputs as arguments
        return f"{head} Fix: give one --input per argument of the model's forward, in order"
    if "'indices'" in head and "Long" in head:  # an nn.Embedding given floats
        return f"{head} Fix: pass token ids as integers: add ':long' to their --input"
    if head.startswith("training_memory(optimizer=...)"):
        head = "--optimizer" + head.removeprefix("training_memory(optimizer=...)")
        return f"{head} Fix: pass one of these names to --optimizer (any case)"
    for python, cli in _FIXES.items():
        if fix.startswith(python):
            return f"{head} Fix: {cli}"
    return text


# --- the command --------------------------------------------------------------------------


def _dtype(name: str | None) -> torch.dtype | None:
    """The --dtype value: a floating-point torch dtype, or None."""
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CommandError(f"--dtype: expected a floating-point dtype name, received {name!r}")
    return dtype


def _specs(inputs: Sequence[str]) -> list[Spec]:
    """The --input values as Specs (the shape's syntax is :meth:`Spec.parse`'s)."""
    specs = []
    for text in inputs:
        shape, _, dtype = text.partition(":")
        if dtype and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise CommandError(
                f"--input {text!r}: expected a dtype name after ':' (long, float16...), "
                f"received {dtype!r}"
            )
        specs.append(Spec.parse(shape, dtype or None))
    return specs


def _summary(args: argparse.Namespace) -> str:
    """The ``summary`` command: what it prints."""
    specs = _specs(args.input)
    target = _parse_target(args.target)
    model_dtype = _dtype(args.dtype)
    factory = _load_factory(target)
    previous = torch.get_default_dtype()
    try:
        if model_dtype is not None:
            torch.set_default_dtype(model_dtype)
        model = _construct(target, factory)
        try:
            result = summary(
                model,
                *specs,
                mode="eval" if args.eval else "train",
                training=args.training or args.optimizer is not None,  # --optimizer implies it
                optimizer=args.optimizer or "adamw",
            )
            return result.render(
                format=args.format,
                depth=args.depth,
                expand=args.expand,
                width=args.width or None,
            )
        except LazynnError as error:
            raise CommandError(_cli_fix(str(error), args.input)) from None
        except Exception as error:  # e.g. a shape too large for torch to describe
            raise CommandError(f"{type(error).__name__}: {error}") from None
    finally:
        torch.set_default_dtype(previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 on an error)."""
    args = _parser().parse_args(argv)
    try:
        print(_summary(args))
    except (CommandError, LazynnError) as error:
        text = " ".join(str(error).split())  # one line, whatever the error's own layout
        print(f"lazynn: error: {text}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        sys.stderr.close()
    except KeyboardInterrupt:
        print("lazynn: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exit_:  # the user's file or model called sys.exit()
        print(f"lazynn: error: {args.target} exited ({exit_.code})", file=sys.stderr)
        return 2
    return 0


def console() -> NoReturn:
    """The ``lazynn`` console script (``[project.scripts]``)."""
    sys.exit(main())
