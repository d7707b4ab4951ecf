"""The command line: ``python -m lazynn summary FILE.py:FACTORY --input 1x3x224x224``.

The factory (a function or class in the file, called with no arguments) is constructed on
the meta device, so even a 70B-parameter model costs no memory; the summary is computed on
meta too. Errors print one line (what, where, the fix) and exit with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._errors import LazynnError
from ._rehearse import Spec
from ._summary import summary

__all__ = ["main"]

_USAGE_EXAMPLE = "python -m lazynn summary examples/models.py:resnet50 --input 1x3x224x224"


class CommandError(Exception):
    """A user error on the command line: printed as one line."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lazynn",
        description="Shape-inferring (lazy) layers for PyTorch.",
        epilog=f"example: {_USAGE_EXAMPLE}",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser(
        "summary",
        help="print a model's layers, shapes and parameter counts, computed on meta",
        description="Print the summary table of a model built from example input shapes. "
        "Nothing is allocated: the model is constructed and run on the meta device.",
    )
    cmd.add_argument(
        "target",
        metavar="FILE.py:FACTORY",
        help="a Python file and the name of a function or class in it that returns the model "
        "when called with no arguments",
    )
    cmd.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SHAPE[:DTYPE]",
        help="an example input shape such as 1x3x224x224, or 1x1024:long for token ids; "
        "repeat for several inputs",
    )
    cmd.add_argument(
        "--dtype",
        default=None,
        help="the model's floating-point dtype (float32, float16, bfloat16...): sets the "
        "default dtype while the model is constructed and summarized",
    )
    return parser


def _load_factory(target: str) -> Callable[[], Any]:
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise CommandError(f"expected FILE.py:FACTORY, received {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise CommandError(f"no such file: {path_text}")
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # so the file can import its neighbours, as `python FILE` can
    try:
        namespace = runpy.run_path(str(path), run_name="__lazynn_summary__")
    except Exception as error:
        raise CommandError(f"{path_text} failed to run: {type(error).__name__}: {error}") from None
    finally:
        sys.path.remove(folder)
    factory = namespace.get(name)
    if not callable(factory):
        found = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("_"))
        raise CommandError(
            f"{path_text} has no callable {name!r}; it defines: {', '.join(found[:12])}"
        )
    return factory  # type: ignore[no-any-return]


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CommandError(f"--dtype: expected a floating-point dtype name, received {name!r}")
    return dtype


def _summary(args: argparse.Namespace) -> str:
    specs = []
    for text in args.input:
        shape, _, dtype = text.partition(":")
        if dtype and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise CommandError(
                f"--input {text!r}: expected a dtype name after ':' (long, float16...), "
                f"received {dtype!r}"
            )
        specs.append(Spec.parse(shape, dtype or None))
    factory = _load_factory(args.target)
    model_dtype = _dtype(args.dtype)
    previous = torch.get_default_dtype()
    try:
        if model_dtype is not None:
            torch.set_default_dtype(model_dtype)
        with torch.device("meta"):
            try:
                model = factory()
            except Exception as error:
                raise CommandError(
                    f"{args.target}() failed: {type(error).__name__}: {error}"
                ) from None
        if not isinstance(model, nn.Module):
            raise CommandError(
                f"{args.target}() returned {type(model).__name__}, expected an nn.Module"
            )
        try:
            return str(summary(model, *specs))
        except (LazynnError, CommandError):
            raise
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
