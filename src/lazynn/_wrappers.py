"""Which torch.distributed wrapper is being constructed around an unbuilt model, if any.

``DistributedDataParallel(model)`` and ``fully_shard(model)`` cannot take an unbuilt model:
every rank must hold the built parameters before the wrapper registers, shards or broadcasts
them. torch words its refusals for its own lazy modules ("Run a dummy forward pass", or a
shape error that blames ``load_state_dict``); lazynn's placeholders see the wrapper's first
look at them and refuse with lazynn's own message, naming every unbuilt parameter and the
recipe (build, then wrap). Nothing of torch is patched: the placeholder reads the call stack
when it is asked for ``requires_grad`` (DDP's first question) or its shape (FSDP2's).

>>> wrapper_refusal("the 'weight' of LazyLinear") is None  # no wrapper on the stack here
True
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from torch import nn

from ._errors import UnbuiltError, message

__all__ = ["wrapper_refusal"]

#: (function name, file path suffix) of the frames that construct each wrapper. These are
#: torch internals: tests/test_distributed.py checks that both refusals still fire.
_WRAPPERS = {
    "DistributedDataParallel": ("__init__", os.path.join("nn", "parallel", "distributed.py")),
    "fully_shard": ("fully_shard", os.path.join("fsdp", "_fully_shard", "_fully_shard.py")),
}
#: How far up the stack a wrapper's constructor may be from the placeholder's method.
_DEPTH = 16


def _find_wrapper() -> tuple[str, Any] | None:
    """(wrapper name, the module being wrapped) if a wrapper constructor is on the stack."""
    frame: FrameType | None = sys._getframe(2)  # sys._getframe: CPython's (documented) frame access
    for _ in range(_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        for name, (function, path) in _WRAPPERS.items():
            if code.co_name == function and code.co_filename.endswith(path):
                return name, frame.f_locals.get("module")
        frame = frame.f_back
    return None


def _refusal(wrapper: str, model: Any, fallback: str) -> UnbuiltError | None:
    modules = model if isinstance(model, (list, tuple)) else [model]
    if not all(isinstance(m, nn.Module) for m in modules):
        return None
    from ._placeholder import is_placeholder

    paths = [name for m in modules for name, p in m.named_parameters() if is_placeholder(p)] or [
        fallback
    ]
    shown = ", ".join(f"'{p}'" for p in paths[:8]) + (
        f" and {len(paths) - 8} more" if len(paths) > 8 else ""
    )
    if wrapper == "fully_shard":
        fix = (
            "build it first on every rank under the same seed, allocating nothing: "
            "lazynn.build(model, example, device='meta'); then fully_shard each block and the "
            "root; then lazynn.materialize(model, device) allocates each rank's shards only"
        )
    else:
        fix = (
            "build it first on every rank under the same seed: lazynn.build(model, example) "
            "(or one forward call), then wrap it in DistributedDataParallel"
        )
    return UnbuiltError(
        message(
            f"{wrapper}({type(modules[0]).__name__})",
            "a built model",
            f"unbuilt lazy parameters {shown}",
            fix,
        )
    )


def wrapper_refusal(fallback: str) -> UnbuiltError | None:
    """The error to raise if a torch.distributed wrapper is being built around a placeholder.

    ``fallback`` names the placeholder, for a wrapped object that is not a module.
    """
    found = _find_wrapper()
    if found is None:
        return None
    return _refusal(found[0], found[1], fallback)
