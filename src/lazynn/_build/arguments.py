"""The arguments ``build`` and ``materialize`` take besides the model, checked at the door.

>>> import torch
>>> check_dtype("bfloat16", "lazynn.build"), check_dtype(torch.float64, "lazynn.build")
(torch.bfloat16, torch.float64)
>>> check_threads(2, "lazynn.build")
2
"""

from __future__ import annotations

import torch

from .._errors import ArgumentError, message
from .._rehearsal.spec import dtype_named, near_miss

__all__ = ["check_dtype", "check_threads"]


def check_threads(threads: object, where: str) -> int:
    """``threads`` as a count of threads, or an :class:`~lazynn.ArgumentError` naming
    ``where``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ArgumentError(
            message(
                where,
                "threads: a number of threads of 1 or more (1 draws serially)",
                f"threads={threads!r}",
                "pass threads=1, or os.cpu_count() to draw large random fills in parallel",
            )
        )
    return threads


def check_dtype(dtype: object, where: str) -> torch.dtype | None:
    """``dtype`` as a floating-point ``torch.dtype`` (a string names one as torch does:
    ``"bfloat16"``, ``"half"``, ``"torch.float16"``), None as None; else an
    :class:`~lazynn.ArgumentError` naming ``where``."""
    if dtype is None:
        return None
    found = dtype_named(dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    if isinstance(found, torch.dtype) and found.is_floating_point:
        return found
    miss = near_miss(dtype.removeprefix("torch.")) if isinstance(dtype, str) else ""
    raise ArgumentError(
        message(
            where,
            "dtype: a floating-point torch.dtype for the new parameters (torch.bfloat16, "
            "or its name, 'bfloat16')",
            f"dtype={dtype!r}{miss}",
            "pass torch.float32, torch.float16, torch.bfloat16 or torch.float64 (or None: as "
            "declared)",
        )
    )
