"""Which torch tool is asking an unbuilt placeholder, to word the refusal with its recipe.

``DistributedDataParallel(model)`` and ``fully_shard(model)`` cannot take an unbuilt model:
every rank must hold the built parameters before the wrapper registers, shards or broadcasts
them. torch words its refusals for its own lazy modules ("Run a dummy forward pass", or a
shape error that blames ``load_state_dict``); lazynn's placeholders see the wrapper's first
look at them and refuse with lazynn's own message, naming every unbuilt parameter and the
recipe (build, then wrap). Nothing of torch is patched: the placeholder reads the call stack
when it is asked for ``requires_grad`` (DDP's first question) or its shape (FSDP2's).

Tools that work on a module right after its construction (``torch.nn.init``,
parametrizations, pruning, ``AveragedModel``) and tools that need a built model (export,
TorchScript) get the same treatment without a wrapper: :func:`tool_fix` finds the tool on the
stack when a placeholder refuses, and the message's fix names ``lazynn.on_build`` or
``lazynn.build``.

>>> wrapper_refusal("the 'weight' of LazyLinear") is None  # no wrapper on the stack here
True
>>> tool_fix() is None
True
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from torch import nn

from ._errors import UnbuiltError, message

__all__ = ["tool_fix", "under_dynamo", "wrapper_refusal"]

#: wrapper -> (function name, file path suffix, the local naming the module) of the frame that
#: constructs it. These are torch internals: tests/test_distributed.py (DDP, fully_shard) and
#: tests/test_compile.py (torch.jit.trace) check that each refusal still fires.
_WRAPPERS = {
    "DistributedDataParallel": (
        "__init__",
        os.path.join("nn", "parallel", "distributed.py"),
        "module",
    ),
    "fully_shard": (
        "fully_shard",
        os.path.join("fsdp", "_fully_shard", "_fully_shard.py"),
        "module",
    ),
    # TracedModule.__init__, once per submodule: the outermost one holds the model
    "torch.jit.trace": ("__init__", os.path.join("torch", "jit", "_trace.py"), "orig"),
}
#: Per thread: whether a refusal is being worded.
_WORDING = threading.local()
#: How far up the stack to look for a wrapper's constructor.
_DEPTH = 64


def _frames(skip: int = 3) -> Iterator[FrameType]:
    """The calling frames, innermost first (sys._getframe: CPython's documented access)."""
    frame: FrameType | None = sys._getframe(skip)
    for _ in range(_DEPTH):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


def _find_wrapper() -> tuple[str, Any] | None:
    """(wrapper, the module being wrapped) of the outermost wrapper constructor on the stack."""
    found = None
    for frame in _frames():
        code = frame.f_code
        for name, (function, path, local) in _WRAPPERS.items():
            if code.co_name == function and code.co_filename.endswith(path):
                found = name, frame.f_locals.get(local)
    return found


def _undo_registration(modules: list[nn.Module]) -> None:
    """Take back what torch's ``contract`` wrapper registered on each module before calling
    ``fully_shard`` (``fully_shard`` can be applied once: a refused call must not count).

    ``torch.distributed._composable.contract`` is private; tests/test_distributed.py applies
    fully_shard after a refusal, which fails if this stops undoing it.
    """
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY

    for module in modules:
        for key in (STATE_KEY, REGISTRY_KEY):
            entries = module.__dict__.get(key)
            if not isinstance(entries, dict):
                continue
            for entry in [e for e in entries if getattr(e, "__name__", e) == "fully_shard"]:
                del entries[entry]
            if not entries:
                del module.__dict__[key]


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
        _undo_registration(list(modules))
        fix = (
            "build it first on every rank under the same seed, allocating nothing: "
            "lazynn.build(model, example, device='meta'); then fully_shard each block and the "
            "root; then lazynn.materialize(model, device) allocates each rank's shards only"
        )
    elif wrapper == "torch.jit.trace":
        fix = "build it first: lazynn.build(model, example), then trace it"
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
    if getattr(_WORDING, "active", False):
        return None  # wording a refusal hashes placeholders (named_parameters): not again
    found = _find_wrapper()
    if found is None:
        return None
    _WORDING.active = True
    try:
        return _refusal(found[0], found[1], fallback)
    finally:
        _WORDING.active = False


_QUEUE_IT = (
    "queue it until the build: lazynn.on_build(module, fn) runs fn(module) once the module "
    "is built (by lazynn.build, materialize, a checkpoint or its first call); or build first "
    "with lazynn.build(model, example)"
)
#: (file path fragment, function name or "", what the tool is, the fix); first match wins.
#: Paths are torch's layout (internal): tests/test_deferred.py checks every message, so a
#: move fails a test.
_TOOLS = (
    (os.path.join("torch", "nn", "init.py"), "", "torch.nn.init", _QUEUE_IT),
    (os.path.join("nn", "utils", "parametriz"), "", "a parametrization", _QUEUE_IT),
    (os.path.join("nn", "utils", "weight_norm.py"), "", "weight_norm", _QUEUE_IT),
    (os.path.join("nn", "utils", "spectral_norm.py"), "", "spectral_norm", _QUEUE_IT),
    (os.path.join("nn", "utils", "prune.py"), "", "pruning", _QUEUE_IT),
    (
        os.path.join("nn", "modules", "batchnorm.py"),
        "convert_sync_batchnorm",
        "SyncBatchNorm.convert_sync_batchnorm",
        "declare lazynn.LazySyncBatchNorm layers instead, or convert after the build: "
        "lazynn.on_build(model, torch.nn.SyncBatchNorm.convert_sync_batchnorm); the model is "
        "unchanged",
    ),
    (
        os.path.join("torch", "optim", "swa_utils.py"),
        "",
        "AveragedModel",
        "make the AveragedModel after the build: lazynn.build(model, example) first, or "
        "lazynn.on_build(model, lambda m: ...) to create it then",
    ),
    (
        os.path.join("torch", "ao", "quantization"),
        "",
        "quantization",
        "build the model first: lazynn.build(model, example), then quantize it (an unbuilt "
        "lazy layer is not of the exact class quantize_dynamic swaps, so it would be skipped)",
    ),
    (
        os.path.join("torch", "export"),
        "",
        "torch.export",
        "build the model first: lazynn.build(model, example), then export it",
    ),
    (
        os.path.join("torch", "jit"),
        "",
        "TorchScript",
        "build the model first: lazynn.build(model, example), then script or trace it",
    ),
)


def tool_fix() -> tuple[str, str] | None:
    """(tool, fix) for the innermost known torch tool on the call stack, or None.

    A refused pruning is also taken back (see :func:`_undo_pruning`).
    """
    for frame in _frames():
        code = frame.f_code
        for fragment, function, tool, fix in _TOOLS:
            if fragment in code.co_filename and function in ("", code.co_name):
                if tool == "pruning":
                    _undo_pruning(frame)
                return tool, fix
    return None


def _undo_pruning(frame: FrameType) -> None:
    """Put back the parameter torch's pruning moved before it touched the placeholder.

    ``BasePruningMethod.apply`` registers ``{name}_orig`` and deletes ``{name}`` before
    ``torch.ones_like(orig)``, outside its own rollback. Restore the parameter in its place
    (a lazy layer records its construction order). torch internals: tests/test_deferred.py
    checks that a refused pruning leaves the layer as it was.
    """
    while frame is not None and not (
        frame.f_code.co_name == "apply" and {"module", "name", "orig"} <= frame.f_locals.keys()
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return
    module, name, orig = (frame.f_locals[k] for k in ("module", "name", "orig"))
    params = getattr(module, "_parameters", None)
    if not isinstance(params, dict) or params.get(f"{name}_orig") is not orig or name in params:
        return
    order = [key for (path, key) in getattr(module, "_lazynn_placeholders", {}) if not path]
    names = [k for k in params if k != f"{name}_orig"]
    later = order[order.index(name) + 1 :] if name in order else []
    at = next((i for i, k in enumerate(names) if k in later), len(names))
    names.insert(at, name)
    restored = {k: orig if k == name else params[k] for k in names}
    params.clear()
    params.update(restored)


_DYNAMO = os.path.join("torch", "_dynamo")


def under_dynamo() -> bool:
    """Whether torch.compile (dynamo's lazy-module protocol) is building a module right now:
    dynamo calls ``initialize_lazy_module`` itself. torch internals: tests/test_compile.py
    compiles an unbuilt rank-agnostic layer, which must give lazynn's refusal."""
    return any(
        frame.f_code.co_name == "initialize_lazy_module" and _DYNAMO in frame.f_code.co_filename
        for frame in _frames(2)
    )
