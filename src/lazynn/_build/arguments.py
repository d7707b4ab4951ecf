"""The arguments of lazynn's functions, checked at the door: each wrong one is an
:class:`~lazynn.ArgumentError` naming the function, what it takes and the fix, before
anything runs (the model and every generator untouched).

>>> import torch
>>> check_dtype("bfloat16", "lazynn.build"), check_dtype(torch.float64, "lazynn.build")
(torch.bfloat16, torch.float64)
>>> check_threads(2, "lazynn.build")
2
"""

from __future__ import annotations

import torch
from torch import nn

from .._errors import ArgumentError, message
from .._rehearsal.spec import dtype_named, near_miss

__all__ = [
    "check_device",
    "check_dtype",
    "check_model",
    "check_module",
    "check_progress",
    "check_threads",
]


#: device types that are accelerators (torch.accelerator): one this machine lacks is refused
_ACCELERATORS = ("cuda", "xpu", "mps", "mtia", "hpu")


def check_model(model: object, where: str) -> None:
    """``model`` is a model or its factory (callable): else an ArgumentError."""
    if not isinstance(model, nn.Module) and not callable(model):
        raise ArgumentError(
            message(
                where,
                "a model (an nn.Module) or its factory (a class, functools.partial(Net, "
                "config), a lambda)",
                f"{type(model).__name__} {_short(model)}",
                "pass the model, or what makes it: lazynn.build(Net, (4, 16))",
            )
        )


def check_module(module: object, where: str) -> None:
    """``module`` is an ``nn.Module``: else an ArgumentError."""
    if not isinstance(module, nn.Module):
        raise ArgumentError(
            message(
                where,
                "an nn.Module",
                f"{type(module).__name__} {_short(module)}",
                "pass the model (or the module) itself",
            )
        )


def check_device(device: object, where: str) -> torch.device | None:
    """``device`` as a ``torch.device`` (a name or index, as torch takes it), None as None;
    else an ArgumentError with torch's own words."""
    if device is None:
        return None
    try:
        if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
            raise TypeError(f"a {type(device).__name__} is not a device")
        found = torch.device(device)  # (an index with no accelerator: a CPU build refuses it)
        if found.type in _ACCELERATORS:  # (a CUDA build without a GPU takes cuda:3)
            here = torch.accelerator.current_accelerator()
            count = torch.accelerator.device_count() if here is not None else 0
            if here is None or here.type != found.type or (found.index or 0) >= count:
                raise RuntimeError(
                    f"this machine has no {found} (accelerator: {here or 'none'}, {count} devices)"
                )
        return found
    except (RuntimeError, TypeError, ValueError) as error:
        raise ArgumentError(
            message(
                where,
                "device: a torch.device or its name ('cpu', 'cuda:0', 'meta'), or None",
                f"device={_short(device)}",
                "pass a device this machine has: 'cpu', or 'meta' to allocate nothing",
                detail=str(error).splitlines()[0],
            )
        ) from error


def check_progress(progress: object, where: str) -> bool | None:
    """``progress`` as True, False or None (automatic); else an ArgumentError."""
    if progress is None or isinstance(progress, bool):
        return progress
    raise ArgumentError(
        message(
            where,
            "progress: True (a bar), False (none) or None (a bar for large models in a terminal)",
            f"progress={_short(progress)}",
            "pass progress=True or progress=False",
        )
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


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
    found = dtype_named(dtype) if isinstance(dtype, str) else dtype
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
