"""Example inputs given by shape and dtype: :class:`Spec`; dtype names, read in one place for
the Python API and the command line (:func:`dtype_named`, :func:`input_dtype`); and
:func:`as_meta`, which turns examples (tensors, Specs, shapes, and structures of them) into the
meta tensors a rehearsal runs on.

>>> as_meta((Spec((2, 3)), torch.Size([4])))
(tensor(..., device='meta', size=(2, 3)), tensor(..., device='meta', size=(4,)))
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import ArgumentError, InferenceError, message
from .._module.tensors import meta_like

__all__ = ["Spec", "as_meta", "dtype_named", "input_dtype", "near_miss"]

#: the usual input dtype names, listed by an error (any torch dtype name is taken)
_USUAL = "float32, float16, bfloat16, float64, long (int64), int32, int8, uint8, bool"
_QUANTIZED = (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4)


@functools.cache
def _dtype_names() -> dict[str, torch.dtype]:
    """Every name torch has for a dtype (``float16``, ``half``...), read from the module's
    own dict: no deprecated attribute's ``__getattr__`` runs, so nothing warns (and no
    warning filter, which is the process's, is changed)."""
    return {
        name: value
        for name, value in vars(torch).items()
        if isinstance(value, torch.dtype) and not name.startswith("_")
    }


def dtype_named(name: str) -> torch.dtype | None:
    """The dtype torch names ``name`` (any of its names: ``float16``, ``half``), or None.

    >>> dtype_named("half"), dtype_named("halff")
    (torch.float16, None)
    """
    return _dtype_names().get(name.removeprefix("torch."))


def near_miss(name: str, names: list[str] | None = None) -> str:
    """``"; did you mean 'float16'?"`` for a name close to one of ``names`` (default: torch's
    dtype names), else ``""``."""
    close = difflib.get_close_matches(name.lower(), names or list(_dtype_names()), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def input_dtype(name: str, text: str) -> torch.dtype:
    """The dtype of an example input named ``name``, as ``--input`` and :meth:`Spec.parse`
    take it (``text``: the input as written, for errors): any of torch's dtype names but the
    quantized ones, which torch deprecates (a quantized model takes float input)."""
    dtype = dtype_named(name)
    if dtype is None:
        raise InferenceError(
            message(
                f"--input {text!r}",
                f"a torch dtype name after ':' ({_USUAL}...)",
                f"{name!r}{near_miss(name)}",
                "use one of torch's dtype names",
            )
        )
    if dtype in _QUANTIZED:
        raise InferenceError(
            message(
                f"--input {text!r}",
                "a dtype torch computes in",
                f"a quantized dtype ({name}): torch deprecates quantized tensors, and a "
                "quantized model takes float input (its QuantStub quantizes it)",
                f"drop ':{name}' from --input",
            )
        )
    return dtype


@dataclass(frozen=True)
class Spec:
    """An example input given by shape and dtype only.

    Args:
        shape: the input's shape.
        dtype: its dtype. Default: the current default dtype (``torch.long`` for token ids
            must be given).

    >>> Spec((1, 3, 224, 224))
    Spec(shape=(1, 3, 224, 224), dtype=None)
    >>> Spec.parse("8x128", "long")
    Spec(shape=(8, 128), dtype=torch.int64)
    """

    #: sizes; ``lazynn.summary`` also takes a name ("B") for a symbolic batch dimension
    shape: tuple[int | str, ...]
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        """Refuse what is not a shape and a dtype (a dtype's name is taken, as torch names
        it: ``"long"``), at the Spec, not deep in a build."""
        shape, dtype = self.shape, self.dtype
        sizes = isinstance(shape, (tuple, list, torch.Size)) and all(
            (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or isinstance(d, str)
            for d in shape  # (a name elsewhere than first: the summary says why not)
        )
        if not sizes:
            raise ArgumentError(
                message(
                    "lazynn.Spec",
                    "shape: a tuple of sizes, each an int of 0 or more (the first may be a "
                    "name: a symbolic batch, 'B')",
                    f"shape={shape!r}",
                    "pass a tuple: Spec((4, 16)), Spec(('B', 3, 224, 224))",
                )
            )
        object.__setattr__(self, "shape", tuple(shape))
        found = dtype_named(dtype) if isinstance(dtype, str) else dtype
        if dtype is not None and not isinstance(found, torch.dtype):
            raise ArgumentError(
                message(
                    "lazynn.Spec",
                    "dtype: a torch.dtype or its name (torch.long, 'long'), or None (the "
                    "default dtype)",
                    f"dtype={dtype!r}" + (near_miss(dtype) if isinstance(dtype, str) else ""),
                    "pass torch.long for token ids, or leave it out",
                )
            )
        object.__setattr__(self, "dtype", found)

    @classmethod
    def parse(cls, text: str, dtype: str | None = None) -> Spec:
        """``"1x3x224x224"`` (and a dtype name such as ``"float16"``) as a Spec: the command
        line's ``--input``. Sizes are at least 1 (a summary of an empty batch counts nothing);
        the first dimension may be a name of letters, ``"Bx3x224x224"`` or ``"batchx16"``: a
        symbolic batch, for ``lazynn.summary``."""
        parts = re.split(r"[xX,]", text)
        try:
            shape = tuple(p if p.isalpha() and i == 0 else int(p) for i, p in enumerate(parts))
        except ValueError:
            raise InferenceError(
                message(
                    "--input",
                    "a shape such as 1x3x224x224 (or Bx3x224x224: a symbolic batch, named by "
                    "letters, first)",
                    repr(text),
                    "write the dimensions as integers separated by x",
                )
            ) from None
        bad = [d for d in shape if isinstance(d, int) and d < 1]
        if bad:
            raise InferenceError(
                message(
                    "--input",
                    "dimensions that are sizes (integers >= 1: an empty batch or feature "
                    "leaves nothing to infer or count)",
                    f"{text!r}, with {', '.join(map(str, bad))}",
                    "give --input no 0 or negative dimension: sizes such as 1x3x224x224, or "
                    "for a symbolic batch a name: Bx3x224x224",
                )
            )
        sizes = [d for d in shape if isinstance(d, int)]
        if max(sizes, default=0) >= 2**63 or math.prod(sizes) >= 2**63:
            raise InferenceError(  # (torch's sizes and numel are int64: C++ errors otherwise)
                message(
                    "--input",
                    "dimensions below 2**63 whose product (the number of elements) is below "
                    "2**63 too: torch's sizes are int64",
                    f"{text!r}, of {math.prod(sizes):.3g} elements",
                    "give smaller dimensions",
                )
            )
        resolved = input_dtype(dtype, f"{text}:{dtype}") if dtype is not None else None
        return cls(shape, resolved)


def _is_shape(obj: object) -> bool:
    return isinstance(obj, (tuple, list)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in obj
    )


def as_meta(example: Any) -> Any:
    """Example inputs as meta tensors: tensors, Specs, shapes (``torch.Size`` / tuples of
    ints), and structures of them; anything else is passed through."""
    if isinstance(example, Spec):
        named = [d for d in example.shape if isinstance(d, str)]
        sizes = tuple(d for d in example.shape if not isinstance(d, str))
        if named:
            raise InferenceError(
                message(
                    f"Spec{example.shape}",
                    "sizes: a meta tensor needs every dimension (a free batch is given a "
                    "number before: batch.py)",
                    f"the symbolic dimension {named[0]!r}",
                    "give the batch as a number: Spec((8, 3, 224, 224))",
                )
            )
        return torch.empty(sizes, dtype=example.dtype, device="meta")
    if isinstance(example, torch.Size) or (_is_shape(example) and len(example) > 0):
        if any(d < 0 for d in example):
            raise ArgumentError(
                message(
                    "an example shape",
                    "sizes of 0 or more",
                    repr(tuple(example)),
                    "give each dimension's size; for a batch left free, None or a name as "
                    "the first: (None, 3)",
                )
            )
        return torch.empty(tuple(example), device="meta")
    if isinstance(example, torch.Tensor):
        return meta_like(example)
    # (not map_tensors: a tuple of ints is a shape here, a leaf)
    if isinstance(example, tuple) and hasattr(example, "_fields"):
        return type(example)(*(as_meta(v) for v in example))
    if isinstance(example, (tuple, list)):
        return type(example)(as_meta(v) for v in example)
    if isinstance(example, dict):
        return {k: as_meta(v) for k, v in example.items()}
    return example
