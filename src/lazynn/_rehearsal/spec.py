"""Example inputs given by shape and dtype: :class:`Spec`, and :func:`as_meta`, which turns
examples (tensors, Specs, shapes, and structures of them) into the meta tensors a rehearsal
runs on.

>>> as_meta((Spec((2, 3)), torch.Size([4])))
(tensor(..., device='meta', size=(2, 3)), tensor(..., device='meta', size=(4,)))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import InferenceError, message
from .._module.tensors import meta_like

__all__ = ["Spec", "as_meta"]


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
        resolved = None
        if dtype is not None:
            resolved = getattr(torch, dtype, None)
            if not isinstance(resolved, torch.dtype):
                raise InferenceError(
                    message(
                        "--dtype",
                        "a torch dtype name such as float32, float16, bfloat16 or long",
                        repr(dtype),
                        "use one of torch's dtype names",
                    )
                )
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
        if named:
            raise InferenceError(
                message(
                    f"Spec{example.shape}",
                    "sizes: a build needs every dimension",
                    f"the symbolic dimension {named[0]!r} (only lazynn.summary takes one)",
                    "give the batch as a number: Spec((8, 3, 224, 224))",
                )
            )
        return torch.empty(example.shape, dtype=example.dtype, device="meta")  # type: ignore[arg-type]
    if isinstance(example, torch.Size) or (_is_shape(example) and len(example) > 0):
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
