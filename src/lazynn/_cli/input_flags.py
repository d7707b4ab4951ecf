"""The command line's example inputs and dtypes, read from ``--input`` and ``--dtype``.

An ``--input`` value is a shape with an optional dtype, ``1x3x224x224`` or ``1x16:long``, or a
parenthesized, comma-separated group of such values, which becomes a tuple argument (nesting
allowed): ``(2x4x32, 2x4x32)`` for an LSTM's ``(h0, c0)``. Dtype names are checked here, with
a suggestion for a near miss, so that no unknown name (and no warning) reaches torch.

>>> parse_input("4x16:long")
Input(value=Spec(shape=(4, 16), dtype=torch.int64), leaves=(('4x16:long', 'long'),))
>>> parse_input("(2x4x32, 2x4x32)").value
(Spec(shape=(2, 4, 32), dtype=None), Spec(shape=(2, 4, 32), dtype=None))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import InferenceError
from .._rehearsal.spec import Spec, dtype_named, input_dtype, near_miss
from .targets import CommandError

__all__ = ["MODEL_DTYPES", "Input", "check_bytes", "model_dtype", "parse_input"]

#: what ``--dtype`` takes: the dtypes torch.set_default_dtype takes, and their aliases
MODEL_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
_MODEL_DTYPES_TEXT = "float32 (float), float64 (double), float16 (half), bfloat16"
#: how deeply groups may nest: an argument of tuples of tuples is deep already
_MAX_NESTING = 8


def model_dtype(name: str | None) -> torch.dtype | None:
    """The ``--dtype`` value: a dtype torch can make the default (``torch.set_default_dtype``
    takes float32, float64, float16 and bfloat16 only), or None."""
    if name is None:
        return None
    if name in MODEL_DTYPES:
        return MODEL_DTYPES[name]
    known = dtype_named(name)
    why = ""
    if known is not None:  # a torch dtype, but not one a model can be constructed in
        why = (
            f" ({name} is a torch dtype, but torch.set_default_dtype, which --dtype sets, takes "
            "only these floating-point ones)"
        )
    raise CommandError(
        f"--dtype: expected one of {_MODEL_DTYPES_TEXT}, received {name!r}{why}"
        + (near_miss(name, list(MODEL_DTYPES)) if known is None else "")
    )


@dataclass(frozen=True)
class Input:
    """One ``--input`` value: a Spec or a tuple of them (nested), and its leaves' texts with
    their dtype names (for the fixes that name them)."""

    value: Any
    leaves: tuple[tuple[str, str], ...]


def _leaf(text: str, whole: str) -> tuple[Spec, tuple[str, str]]:
    """One ``SHAPE[:DTYPE]`` of the --input value ``whole``: its Spec, its text and dtype name."""
    shape, _, dtype = text.strip().partition(":")
    if not shape.strip():
        raise CommandError(f"--input {whole!r}: expected a shape such as 2x3, received {text!r}")
    try:
        resolved = input_dtype(dtype.strip(), text.strip()) if dtype else None
    except InferenceError as error:
        raise CommandError.of(error) from error
    try:
        spec = Spec.parse(shape.strip())
    except InferenceError as error:
        raise CommandError.of(error, where=f"--input {whole!r}") from error
    return Spec(spec.shape, resolved), (text.strip(), dtype.strip())


def parse_input(text: str) -> Input:
    """An ``--input`` value: ``SHAPE[:DTYPE]``, or ``(ITEM, ITEM...)`` for a tuple, as in
    Python (``(2x3,)`` is a 1-tuple, ``(2x3)`` is 2x3), read without recursion."""
    if not text.lstrip().startswith("("):  # a shape (its dimensions may be split by commas)
        spec, leaf = _leaf(text, text)
        return Input(spec, (leaf,))

    def refuse(what: str) -> CommandError:
        return CommandError(
            f"--input {text!r}: {what}; a group is written (2x4x32, 2x4x32), items separated "
            "by commas, nested groups allowed"
        )

    leaves: list[tuple[str, str]] = []
    stack: list[list[Any]] = [[]]
    commas = [False]  # whether each open group has a comma (a tuple, as in Python)
    last = ""  # the last item read: "", "(", ")", "," or "shape"
    for token in re.split(r"([(),])", text):
        if token not in ("(", ")", ","):
            if token.strip():
                if last in (")", "shape") or len(stack) == 1:
                    raise refuse(f"expected ',' or ')' before {token.strip()!r}")
                spec, leaf = _leaf(token, text)
                stack[-1].append(spec)
                leaves.append(leaf)
                last = "shape"
            continue
        if token == "(":
            if last in (")", "shape") or (len(stack) == 1 and stack[0]):
                raise refuse("expected ',' before '('")
            if len(stack) > _MAX_NESTING:
                raise refuse(f"expected groups nested {_MAX_NESTING} deep at most")
            stack.append([])
            commas.append(False)
        elif len(stack) == 1:
            raise refuse(f"a {token!r} outside the parentheses (one --input per argument)")
        elif token == "," and last not in (")", "shape"):
            raise refuse("expected a shape or a group before ','")
        elif token == ",":
            commas[-1] = True
        else:
            group, comma = stack.pop(), commas.pop()
            stack[-1].append(group[0] if len(group) == 1 and not comma else tuple(group))
        last = token
    if len(stack) > 1:
        raise refuse("a '(' is not closed by a ')'")
    _check_python_shape(text, stack[0][0], leaves)
    return Input(stack[0][0], tuple(leaves))


def _check_python_shape(text: str, value: Any, leaves: list[tuple[str, str]]) -> None:
    """Refuse a group of bare sizes, ``(2, 3, 16, 16)``: a shape written as Python writes it,
    which the group syntax reads as four 1-D inputs (a tuple of 1-D inputs gives each a
    dtype, ``(2:float32, 3:float32)``)."""
    words = [leaf.strip() for leaf, _ in leaves]
    batch = bool(words) and re.fullmatch(r"None|[A-Za-z]+", words[0]) is not None  # (Keras's)
    bare = all(re.fullmatch(r"\d+", w) for w in words[1 if batch else 0 :])
    flat = isinstance(value, tuple) and all(isinstance(v, Spec) for v in value)
    if flat and bare and len(leaves) > 1:
        sizes = "x".join(["B" if w == "None" else w for w in words])
        raise CommandError(
            f"--input {text!r}: expected a shape written with x, such as {sizes}, received a "
            f"group of {len(leaves)} one-dimensional inputs (a shape in Python's syntax)",
            f"write --input {sizes}; a tuple argument of 1-D inputs gives each its dtype, "
            f"'({words[1] if batch else words[0]}:float32, ...)'",
        )


def check_bytes(specs: list[Any], default: torch.dtype) -> None:
    """Refuse an input whose bytes torch cannot count (``numel * itemsize`` of 2**63 or more:
    torch's "Storage size calculation overflowed")."""
    for spec in _flat(specs):
        sizes = [d for d in spec.shape if isinstance(d, int)]
        itemsize = (spec.dtype or default).itemsize
        if math.prod(sizes) * itemsize >= 2**63:
            shape = "x".join(map(str, spec.shape))
            raise CommandError(
                f"--input: expected shapes whose bytes are below 2**63 (torch counts bytes in "
                f"int64), received {shape} of {itemsize}-byte elements, "
                f"{math.prod(sizes) * itemsize:.3g} bytes.",
                "give smaller dimensions",
            )


def _flat(value: Any) -> list[Spec]:
    if isinstance(value, Spec):
        return [value]
    return [s for v in value for s in _flat(v)] if isinstance(value, (tuple, list)) else []
