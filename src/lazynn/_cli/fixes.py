"""A command-line error as one line: its fix in the command's terms, where the user's code
raised it, and no C++ stack.

* :func:`cli_line`: an error's fix (``x.to(dtype)``, ``lazynn.summary(..., mode='eval')``)
  replaced, by its fix key, with one the command's user can follow, naming its flags;
* :func:`user_frame`: the innermost frame of the user's own code (their file at import, their
  factory, their forward) in the traceback of the original exception, for ``(raised at
  nets.py:42 in forward)``;
* :func:`one_line`: the message printed, on one line, without torch's C++ frames.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

from .._errors import ArgumentError, Fix, LazynnError
from .._module.callers import LAZYNN_FOLDER, is_users
from .._rehearsal.spec import dtype_named
from .._summary.report import dtype_name
from .input_flags import MODEL_DTYPES
from .targets import CommandError

__all__ = ["cli_line", "one_line", "user_frame", "user_line"]

_WITH_VALUES = (
    "the summary runs the forward on meta tensors, which have no values: a forward that reads "
    "them (if on a tensor, .item(), .tolist(), a shape computed from values) cannot be "
    "summarized; make that code depend on shapes only (rerun with --traceback to see where "
    "it reads values)"
)
#: an error's fix, by its key, as the command line says it
_FIXES = {
    Fix.ON_BUILD: "apply that step to the layer at its build, in the factory: "
    "lazynn.on_build(layer, fn) (weight_norm, a parametrization) runs fn where the layer is "
    "built",
    Fix.INPUT_LAYOUT: "change the --input shape so that this layer receives one of the "
    "accepted layouts",
    Fix.INPUT_NONEMPTY: "give --input no 0 dimension",
    Fix.INPUT_TENSOR: "give one --input per tensor argument of the model's forward, in order "
    "(a parenthesized group, '(2x4, 2x4)', for a tuple of tensors)",
    Fix.INPUT_SHAPES: "check the --input shapes (and dtypes: ':long' for token ids) and the "
    "layers before this one",
    Fix.INPUT_ARGUMENTS: "give one --input per argument of the model's forward, in order",
    Fix.INPUT_DEVICE: "construct the model without a device in the factory (the command "
    "constructs and runs it on meta)",
    Fix.TOKEN_IDS: "pass token ids as integers: add ':long' to their --input",
    Fix.LAYER_ARGUMENTS: "check the --input shapes and the layer's arguments in the factory",
    Fix.VALID_INPUT: "check the --input shapes and dtypes",
    Fix.BATCH_OF_MORE: "give --input a batch of more than one, or pass --eval",
    Fix.NEEDS_VALUES: _WITH_VALUES,
    Fix.NOT_IMPLEMENTED: "the module does not implement this call (its forward is not written, "
    "or it does not support inputs of these shapes): write its forward, or check the --input "
    "shapes and the layers before it",
    Fix.NUMERIC_BATCH: "give the batch as a number in --input (8x... rather than Bx...)",
    Fix.SYMBOLIC_FIRST: "give the other dimensions as numbers: --input Bx3x224x224",
    Fix.OPTIMIZER_NAME: "pass one of these names to --optimizer (any case)",
    Fix.OPTIMIZER_REFUSED: "estimate with another optimizer: one of these names to --optimizer",
}


def _dtype_fix(received: torch.dtype, leaves: Sequence[tuple[str, str]]) -> str:
    """The fix for a layer given an input of dtype ``received`` that it does not take;
    ``leaves``: each --input shape's text and dtype name."""
    name = dtype_name(received)
    given = [(text, n) for text, n in leaves if n and dtype_named(n) == received]
    drop = " or ".join(f"drop ':{n}' from --input {text}" for text, n in given)
    if received in MODEL_DTYPES.values():
        fix = f"pass --dtype {name} (to construct the model in {name})"
        return f"{fix} or {drop}" if drop else fix
    if received.is_floating_point:  # float8...: a storage type, not one a model computes in
        why = (
            f"this layer computes in the model's dtype, and --dtype takes float32, float64, "
            f"float16 or bfloat16, not {name}"
        )
        return f"{why}: {drop}" if drop else f"{why}: check the --input dtypes"
    floating = "this layer takes floating-point input (token ids go to an nn.Embedding first)"
    return f"{floating}: {drop}" if drop else f"{floating}: check the --input dtypes"


def _optimizer_failed(value: tuple[str, tuple[str, ...], str]) -> str:
    """The fix for an optimizer that failed on meta, naming --optimizer."""
    _, others, limit = value
    fix = f"estimate with another optimizer: --optimizer {others[0]} (or {', '.join(others[1:])})"
    return f"{limit}: {fix}" if limit else fix


def cli_line(error: LazynnError, leaves: Sequence[tuple[str, str]]) -> CommandError:
    """``error`` as the command line says it: its fix in the command's terms, by its fix key
    (an error without a key keeps its fix, without its outcome). ``leaves``: each --input
    shape's text and dtype name (``("2x5:half", "half")``)."""
    parts = error.parts
    if parts is None or parts.key is None:
        return CommandError.of(error)
    where = None
    fix = _FIXES.get(parts.key, parts.fix)
    if parts.key is Fix.INPUT_DTYPE:
        fix = _dtype_fix(parts.value, leaves)
    elif parts.key is Fix.OPTIMIZER_NAME:
        where = "--optimizer"
    elif parts.key is Fix.OPTIMIZER_REFUSED:
        where = f"--optimizer {parts.value}"
    elif parts.key is Fix.OPTIMIZER_FAILED:
        where, fix = f"--optimizer {parts.value[0]}", _optimizer_failed(parts.value)
    return CommandError.of(error, where, fix)


# --- where the user's code raised it -------------------------------------------------------


def _original(error: BaseException) -> BaseException:
    """The exception ``error`` was raised from (its cause, or the one being handled), and so
    on down to the first."""
    seen = {id(error)}
    while (below := error.__cause__ or error.__context__) is not None and id(below) not in seen:
        seen.add(id(below))
        error = below
    return error


def _shown(filename: str) -> str:
    """A file as an error names it: relative to the current folder when it is inside it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def _frames(error: BaseException) -> tuple[str, str | None] | None:
    """The innermost frame of the user's code in the traceback of the exception ``error`` was
    raised from (``nets.py:42 in forward``), and the library that raised it below that frame
    (None: their own line raised it)."""
    original = _original(error)
    if isinstance(original, CommandError) or (
        isinstance(original, LazynnError) and not isinstance(original, ArgumentError)
    ):
        return None  # (an ArgumentError, a call the user's line made wrongly, names no module)
    frames = traceback.extract_tb(original.__traceback__)
    users = [f for f in frames if is_users(f.filename)]
    if not users:
        return None
    frame = users[-1]
    at = f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}"
    return at, None if frame is frames[-1] else _library(frames[-1].filename)


def user_frame(error: BaseException) -> str | None:
    """Where the user's own code (their file at import, their factory, their forward) raised
    ``error`` or the exception it was raised from: ``raised at nets.py:42 in forward``, or
    ``raised in torch, called at nets.py:42 in forward`` when their line called into a
    library; None when no frame is theirs, or when the original exception is one of lazynn's
    own refusals (which name the module), but for an ArgumentError: a call of lazynn's the
    user's line made with arguments it refuses (``LazyLinear(768, 3072)``), which names the
    call, not where it is."""
    found = _frames(error)
    if found is None:
        return None
    at, library = found
    return f"raised at {at}" if library is None else f"raised in {library}, called at {at}"


def user_line(error: BaseException) -> str | None:
    """The line of the user's code ``error`` came through, ``nets.py:42 in forward``."""
    found = _frames(error)
    return None if found is None else found[0]


def _library(filename: str) -> str:
    """The library of a frame's file, for ``raised in torch``."""
    path = Path(os.path.realpath(filename))
    for root in ("site-packages", "dist-packages"):
        if root in path.parts[:-1]:
            return Path(path.parts[path.parts.index(root) + 1]).stem
    for name, folder in (("torch", os.path.dirname(torch.__file__)), ("lazynn", LAZYNN_FOLDER)):
        if path.is_relative_to(os.path.realpath(folder)):
            return name
    return path.stem  # a module of Python's


def one_line(error: BaseException, hint: bool = True) -> str:
    """The message of ``error`` as printed: where the user's code raised it (before the fix;
    ``hint``: with a pointer to --traceback), torch's C++ frames dropped, on one line."""
    if isinstance(error, CommandError):
        line = error
    else:
        line = cli_line(error, ()) if isinstance(error, LazynnError) else CommandError(str(error))
    head, fix = line.head, line.fix
    cut = head.find("Exception raised from ")  # torch's C++ errors carry their stack
    if cut >= 0:
        head = head[:cut]
    where = user_frame(error)
    if where is not None:
        hint = hint and "--traceback" not in fix  # (the fix for values names it already)
        head = f"{head.rstrip()} ({where}{'; --traceback shows the stack' if hint else ''})"
    text = f"{head.rstrip()} Fix: {fix}" if fix else head
    return " ".join(text.split())
