"""A command-line error as one line: its fix in the command's terms, where the user's code
raised it, and no C++ stack.

* :func:`cli_fix`: a Python-API fix (``x.to(dtype)``, ``lazynn.summary(..., mode='eval')``)
  replaced by one the command's user can follow, naming its flags;
* :func:`user_frame`: the innermost frame of the user's own code (their file at import, their
  factory, their forward) in the traceback of the original exception, for ``(raised at
  nets.py:42 in forward)``;
* :func:`one_line`: the message printed, on one line, without torch's C++ frames.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

from .._errors import LazynnError
from .._module.callers import LAZYNN_FOLDER, is_users
from .shapes import MODEL_DTYPES
from .targets import CommandError

__all__ = ["cli_fix", "one_line", "user_frame", "user_line"]

_DTYPE_MISMATCH = re.compile(
    r"expected a torch\.(\w+) input \(the layer's dtype\), received a torch\.(\w+) input"
)
_FLOAT_EXPECTED = re.compile(r"expected a floating-point input, received a torch\.(\w+) input")
_WITH_VALUES = (
    "the summary runs the forward on meta tensors, which have no values: a forward that reads "
    "them (if on a tensor, .item(), .tolist(), a shape computed from values) cannot be "
    "summarized; make that code depend on shapes only (rerun with --traceback to see where "
    "it reads values)"
)
#: the Python API's fix (its start) -> the command line's
_FIXES = {
    "reshape the input": "change the --input shape so that this layer receives one of the "
    "accepted layouts",
    "call the layer with a non-empty input": "give --input no 0 dimension",
    "call the layer with a tensor": "give one --input per tensor argument of the model's "
    "forward, in order (a parenthesized group, '(2x4, 2x4)', for a tuple of tensors)",
    "check the example inputs' shapes": "check the --input shapes (and dtypes: ':long' for "
    "token ids) and the layers before this one",
    "check the example inputs": "give one --input per argument of the model's forward, in order",
    "check the input's layout": "check the --input shapes and the layer's arguments in the factory",
    "call it with a valid input": "check the --input shapes and dtypes",
    "give a batch of more than one": "give --input a batch of more than one, or pass --eval",
    "build it with a real call": _WITH_VALUES,
    "the module does not implement this call": "the module does not implement this call (its "
    "forward is not written, or it does not support inputs of these shapes): write its "
    "forward, or check the --input shapes and the layers before it",
    "move the input": "construct the model without a device in the factory (the command "
    "constructs and runs it on meta)",
}
#: Python-API phrases inside a fix -> the command line's
_PHRASES = {
    "Spec(('B', 3, 224, 224)), or --input Bx3x224x224": "--input Bx3x224x224",
    "(Spec((8, ...)), or --input 8x...)": "(--input 8x... rather than Bx...)",
    "give the batch as a number (a layer": "give the batch as a number in --input (a layer",
    "; the model is unchanged": "",
    "; the layer is still unbuilt": "",
    "; nothing was built": "",
}


def _dtype_fix(received: str, leaves: Sequence[tuple[str, str]]) -> str:
    """The fix for a layer given an input of dtype ``received`` that it does not take;
    ``leaves``: each --input shape's text and dtype name."""
    given = [
        (text, name)
        for text, name in leaves
        if name and getattr(torch, name, None) == getattr(torch, received)
    ]
    drop = " or ".join(f"drop ':{name}' from --input {text}" for text, name in given)
    dtype = getattr(torch, received)
    if dtype in MODEL_DTYPES.values():
        fix = f"pass --dtype {received} (to construct the model in {received})"
        return f"{fix} or {drop}" if drop else fix
    if dtype.is_floating_point:  # float8...: a storage type, not one a model computes in
        why = (
            f"this layer computes in the model's dtype, and --dtype takes float32, float64, "
            f"float16 or bfloat16, not {received}"
        )
        return f"{why}: {drop}" if drop else f"{why}: check the --input dtypes"
    floating = "this layer takes floating-point input (token ids go to an nn.Embedding first)"
    return f"{floating}: {drop}" if drop else f"{floating}: check the --input dtypes"


def cli_fix(text: str, leaves: Sequence[tuple[str, str]]) -> str:
    """``text`` with its Python-API fix (``x.to(dtype)``...) replaced by one that names this
    command's flags, when one applies; otherwise ``text`` unchanged. ``leaves``: each --input
    shape's text and dtype name (``("2x5:half", "half")``)."""
    head, sep, fix = text.rpartition(" Fix: ")
    if not sep:
        return text
    mismatch = _DTYPE_MISMATCH.search(head) or _FLOAT_EXPECTED.search(head)
    if mismatch and "x.to(dtype)" in fix:
        return f"{head} Fix: {_dtype_fix(mismatch.groups()[-1], leaves)}"
    if re.search(r"forward\(\) (takes|missing)", head):  # as many inputs as arguments
        return f"{head} Fix: give one --input per argument of the model's forward, in order"
    if "'indices'" in head and "Long" in head:  # an nn.Embedding given floats
        return f"{head} Fix: pass token ids as integers: add ':long' to their --input"
    if head.startswith("training_memory(optimizer=...)"):
        head = "--optimizer" + head.removeprefix("training_memory(optimizer=...)")
        return f"{head} Fix: pass one of these names to --optimizer (any case)"
    if head.startswith("training_memory(optimizer="):  # one refused, or that failed on meta
        head = re.sub(r"^training_memory\(optimizer='(\w+)'\)", r"--optimizer \1", head)
        fix = fix.replace("optimizer=", "--optimizer ").replace("'", "")
        fix = fix.replace(" or a class", " to --optimizer")
        return f"{head} Fix: {fix.replace(', or other optimizer_kwargs', '')}"
    for python, cli in _FIXES.items():
        if fix.startswith(python):
            return f"{head} Fix: {cli}"
    for python, cli in _PHRASES.items():
        fix = fix.replace(python, cli)
    return f"{head} Fix: {fix}"


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
    if isinstance(original, (LazynnError, CommandError)):
        return None
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
    own refusals (which name the module)."""
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
    text = str(error)
    cut = text.find("Exception raised from ")  # torch's C++ errors carry their stack
    if cut >= 0:
        text = text[:cut]
    where = user_frame(error)
    if where is not None:
        hint = hint and "--traceback" not in text  # (the data-dependent fix names it)
        note = f" ({where}{'; --traceback shows the stack' if hint else ''})"
        head, sep, fix = text.rpartition(" Fix: ")
        text = f"{head.rstrip()}{note}{sep}{fix}" if sep else f"{text.rstrip()}{note}"
    return " ".join(text.split())
