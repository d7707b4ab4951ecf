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
import re
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import torch

from ._errors import LazynnError
from ._rehearse import Spec
from ._summary import summary
from ._targets import CommandError, construct, load_factory, parse_target

__all__ = ["console", "main"]

_USAGE_EXAMPLE = "lazynn summary examples/models.py:resnet50 --input 1x3x224x224"
#: the name the factories of a file run by the command line see as ``__name__``
_FORMATS = ("table", "markdown", "json")


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
        "with ..., each column keeping 12; default: 100; 0: no limit)",
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
    if head.startswith("training_memory(optimizer="):  # one that cannot step on meta
        head = re.sub(r"^training_memory\(optimizer='(\w+)'\)", r"--optimizer \1", head)
        return f"{head} Fix: " + fix.replace("optimizer=", "--optimizer ").replace("'", "")
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
    target = parse_target(args.target)
    model_dtype = _dtype(args.dtype)
    factory = load_factory(target)
    previous = torch.get_default_dtype()
    try:
        if model_dtype is not None:
            torch.set_default_dtype(model_dtype)
        model = construct(target, factory)
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
