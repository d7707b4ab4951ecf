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
TorchScript) get the same treatment without a wrapper: :func:`find_tool` finds the tool on
the stack when a placeholder refuses, and the message's fix names ``lazynn.on_build`` or
``lazynn.build``.

Finding is a query and changes nothing. Two refusals must also take back what the tool did
before it asked: a refused ``fully_shard`` has registered itself on the module
(:func:`undo_wrapper`), a refused pruning has moved the parameter (:func:`undo_pruning`); the
placeholder's refusal calls them.

>>> find_wrapper() is None  # no wrapper on the stack here
True
>>> find_tool() is None
True
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import nn

from ._errors import (
    BUILD,
    CALL_NOT_FORWARD,
    INIT_FIX,
    QUEUE_IT,
    InferenceError,
    UnbuiltError,
    frame_locals,
    message,
    module_path,
    torch_phrase,
)
from ._state import WAITING, context, find_state
from ._tensors import is_placeholder

__all__ = [
    "Tool",
    "Wrapper",
    "distributed",
    "find_tool",
    "find_wrapper",
    "refusal",
    "refuse_under_export",
    "refuse_under_functorch",
    "scripted_path",
    "under_dynamo",
    "undo_pruning",
    "undo_wrapper",
    "untraced",
    "warn_compiled_queue",
    "wrapper_error",
    "wrapper_refusal",
]

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


@dataclass(frozen=True)
class Wrapper:
    """A torch wrapper being constructed around a model that holds placeholders."""

    name: str
    #: the module (or modules) being wrapped
    target: Any

    @property
    def modules(self) -> list[nn.Module]:
        """The wrapped modules, or [] when the target is not modules."""
        found = self.target if isinstance(self.target, (list, tuple)) else [self.target]
        return list(found) if all(isinstance(m, nn.Module) for m in found) else []


def find_wrapper() -> Wrapper | None:
    """The outermost wrapper constructor on the stack (DDP, ``fully_shard``,
    ``torch.jit.trace``), or None. (None while a refusal is being worded: wording it hashes
    placeholders.)"""
    if context().wording:
        return None
    found = None
    for frame in _frames():
        code = frame.f_code
        for name, (function, path, local) in _WRAPPERS.items():
            if code.co_name == function and code.co_filename.endswith(path):
                found = Wrapper(name, frame_locals(frame, (local,)).get(local))
    return found


def wrapper_error(wrapper: Wrapper, fallback: str) -> UnbuiltError | None:
    """The refusal of a wrapper around a model with placeholders, naming every unbuilt
    parameter and the recipe; None when what it wraps is not modules. ``fallback`` names the
    placeholder that was asked, when no parameter is found."""
    modules = wrapper.modules
    if not modules:
        return None
    context().wording = True
    try:
        found = [n for m in modules for n, p in m.named_parameters() if is_placeholder(p)]
    finally:
        context().wording = False
    paths = found or [fallback]
    shown = ", ".join(f"'{p}'" for p in paths[:8]) + (
        f" and {len(paths) - 8} more" if len(paths) > 8 else ""
    )
    if wrapper.name == "fully_shard":
        fix = (
            "build it first on every rank under the same seed, allocating nothing: "
            "lazynn.build(model, example, device='meta'); then fully_shard each block and the "
            "root; then lazynn.materialize(model, device) allocates each rank's shards only"
        )
    elif wrapper.name == "torch.jit.trace":
        fix = f"build it first: {BUILD}, then trace it"
    else:
        fix = (
            f"build it first on every rank under the same seed: {BUILD} "
            "(or one forward call), then wrap it in DistributedDataParallel"
        )
    return UnbuiltError(
        message(
            f"{wrapper.name}({type(modules[0]).__name__})",
            "a built model",
            f"unbuilt lazy parameters {shown}",
            fix,
        )
    )


def undo_wrapper(wrapper: Wrapper) -> None:
    """Take back what the wrapper did to the modules before it asked the placeholder: torch's
    ``contract`` registers ``fully_shard`` on each module first, and it can be applied once,
    so a refused call must not count.

    ``torch.distributed._composable.contract`` is private; tests/test_distributed.py applies
    fully_shard after a refusal, which fails if this stops undoing it. (Imported here: only a
    process that is constructing ``fully_shard`` gets here.)
    """
    if wrapper.name != "fully_shard":
        return
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY

    for module in wrapper.modules:
        for key in (STATE_KEY, REGISTRY_KEY):
            entries = module.__dict__.get(key)
            if not isinstance(entries, dict):
                continue
            for entry in [e for e in entries if getattr(e, "__name__", e) == "fully_shard"]:
                del entries[entry]
            if not entries:
                del module.__dict__[key]


@dataclass(frozen=True)
class Tool:
    """A torch tool that asked an unbuilt placeholder (or size): what it is, and the fix."""

    name: str
    fix: str


#: (file path fragment, function name or "", what the tool is, the fix); first match wins.
#: Paths are torch's layout (internal): tests/test_deferred.py checks every message, so a
#: move fails a test.
_TOOLS = (
    (os.path.join("torch", "nn", "init.py"), "", "torch.nn.init", INIT_FIX),
    (os.path.join("nn", "utils", "parametriz"), "", "a parametrization", QUEUE_IT),
    (os.path.join("nn", "utils", "weight_norm.py"), "", "weight_norm", QUEUE_IT),
    (os.path.join("nn", "utils", "spectral_norm.py"), "", "spectral_norm", QUEUE_IT),
    (os.path.join("nn", "utils", "prune.py"), "", "pruning", QUEUE_IT),
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
        f"make the AveragedModel after the build: {BUILD} first, or "
        "lazynn.on_build(model, lambda m: ...) to create it then",
    ),
    (
        os.path.join("torch", "ao", "quantization"),
        "",
        "quantization",
        f"build the model first: {BUILD}, then quantize it (an unbuilt "
        "lazy layer is not of the exact class quantize_dynamic swaps, so it would be skipped)",
    ),
    (
        os.path.join("torch", "export"),
        "",
        "torch.export",
        f"build the model first: {BUILD}, then export it",
    ),
    (
        os.path.join("torch", "jit"),
        "",
        "TorchScript",
        f"build the model first: {BUILD}, then script or trace it",
    ),
)


def find_tool() -> Tool | None:
    """The innermost known torch tool on the call stack, or None."""
    for frame in _frames():
        code = frame.f_code
        for fragment, function, tool, fix in _TOOLS:
            if fragment in code.co_filename and function in ("", code.co_name):
                return Tool(tool, fix)
    return None


def distributed() -> bool:
    """Whether a process group exists (DDP and fully_shard need one): only then do
    placeholders look for a wrapper being constructed around them."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def wrapper_refusal(owner: str) -> UnbuiltError | None:
    """The refusal of a torch wrapper being constructed around the model of a placeholder
    (``owner``: "the 'weight' of LazyLinear"), taking back what it registered; or None."""
    wrapper = find_wrapper()
    refused = wrapper_error(wrapper, owner) if wrapper is not None else None
    if wrapper is not None and refused is not None:
        undo_wrapper(wrapper)
    return refused


def refusal(owner: str, kind: str, what: str, checkpoint: str | None) -> UnbuiltError:
    """The error of a placeholder (``owner``, of class ``kind``) asked for ``what`` (a torch
    function's name), worded for whoever asked: a wrapper, a tool, or the user's own code;
    ``checkpoint``: the entry it was saved as, when it comes from an unbuilt checkpoint."""
    refused = wrapper_refusal(owner)  # fully_shard asks for the shape first
    if refused is not None:
        return refused
    phrase = torch_phrase(what)
    if checkpoint is not None:
        return UnbuiltError(
            message(
                f"checkpoint entry {checkpoint}",
                f"a built tensor for {what}",
                f"an unbuilt {kind}, which holds no values (saving the state_dict of an "
                "unbuilt model, or loading it into a built one, is the usual cause)",
                f"build the source model before taking its state_dict ({BUILD}), or drop "
                "the unbuilt entries: {k: v for k, v in sd.items() if not lazynn.is_lazy(v)} "
                "and load with strict=False",
                detail=phrase,
            )
        )
    tool = find_tool()
    if tool is not None:
        if tool.name == "pruning":
            undo_pruning()  # it moved the parameter before it asked
        return UnbuiltError(
            message(
                owner,
                f"a built tensor for {tool.name} ({what})",
                f"an unbuilt {kind}, whose shape the first input decides",
                tool.fix,
                detail=phrase,
            )
        )
    return UnbuiltError(
        message(
            owner,
            f"a built tensor for {what}",
            f"an unbuilt {kind}, whose shape the first input decides",
            f"build the module first: {BUILD}, or call the model on an example input "
            f"({CALL_NOT_FORWARD}) or load a built checkpoint with load_state_dict; then do "
            "this. Code in the model's __init__ that needs sizes: construct it with "
            "lazynn.build(Net, example) (the factory form), which runs __init__ with every "
            "size known. Optimizers that need shapes at construction (Adagrad) must be "
            "created after the build",
            detail=phrase,
        )
    )


def undo_pruning() -> None:
    """Put back the parameter torch's pruning moved before it touched the placeholder.

    ``BasePruningMethod.apply`` registers ``{name}_orig`` and deletes ``{name}`` before
    ``torch.ones_like(orig)``, outside its own rollback. Restore the parameter in its place
    (a lazy layer records its construction order). torch internals: tests/test_deferred.py
    checks that a refused pruning leaves the layer as it was.
    """
    keys = ("module", "name", "orig")
    found = next(
        (
            values
            for f in _frames()
            if f.f_code.co_name == "apply" and len(values := frame_locals(f, keys)) == len(keys)
        ),
        None,
    )
    if found is None:
        return
    module, name, orig = (found[k] for k in keys)
    params = getattr(module, "_parameters", None)
    if not isinstance(params, dict) or params.get(f"{name}_orig") is not orig or name in params:
        return
    state = find_state(module)
    order = [key for (path, key) in state.placeholders if not path] if state else []
    names = [k for k in params if k != f"{name}_orig"]
    later = order[order.index(name) + 1 :] if name in order else []
    at = next((i for i, k in enumerate(names) if k in later), len(names))
    names.insert(at, name)
    restored = {k: orig if k == name else params[k] for k in names}
    params.clear()
    params.update(restored)


_DYNAMO = os.path.join("torch", "_dynamo")


def untraced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a plain function), run by Python itself even where torch.compile traces its
    caller: after a graph break dynamo compiles every frame called, and lazynn's build
    machinery (snapshots, placeholders read without their ``__torch_function__``) is not
    traceable. Without torch._dynamo imported, ``fn`` itself (nothing is imported)."""
    if "torch._dynamo" not in sys.modules:
        return fn
    disabled = _DISABLED.get(fn)
    if disabled is None:  # (a plain dict: dynamo warns of traced functools caches)
        disabled = _DISABLED[fn] = torch.compiler.disable(fn, recursive=True)  # type: ignore[no-untyped-call]
    return disabled


#: function -> its dynamo-disabled wrapper
_DISABLED: dict[Callable[..., Any], Callable[..., Any]] = {}


def under_dynamo() -> bool:
    """Whether torch.compile (dynamo's lazy-module protocol) is building a module right now:
    dynamo calls ``initialize_lazy_module`` itself. torch internals: tests/test_compile.py
    compiles an unbuilt rank-agnostic layer, which must give lazynn's refusal."""
    if "torch._dynamo" not in sys.modules:
        return False  # (no stack walk on a plain first call)
    return any(
        frame.f_code.co_name == "initialize_lazy_module" and _DYNAMO in frame.f_code.co_filename
        for frame in _frames(2)
    )


def warn_compiled_queue(module: nn.Module) -> None:
    """torch.compile built ``module`` as it traced a call that its compiled wrapper did not
    see (a compiled function calling the model): work queued with ``lazynn.on_build`` on a
    module holding it cannot run before the traced forward. Say so (once per queue)."""
    for waiting in list(WAITING):
        if waiting.__dict__.get("_lazynn_compile_warned") or not any(
            m is module for m in waiting.modules()
        ):
            continue
        waiting.__dict__["_lazynn_compile_warned"] = True
        warnings.warn(
            f"lazynn.on_build: torch.compile is building {type(module).__name__} layer by layer "
            f"as it traces, inside {type(waiting).__name__}, whose queued work cannot run "
            "before the traced forward and waits: build the model before compiling a function "
            f"that calls it ({BUILD}), or compile the model itself (torch.compile(model): its "
            "first call builds the whole model and runs the queue before tracing)",
            stacklevel=2,
        )


def refuse_under_export(module: nn.Module) -> None:
    """torch.export (strict) traces with dynamo, whose lazy-module protocol would build the
    layer during the export: export must not change the model. Refuse with the fix."""
    if not under_dynamo():
        return
    found = find_tool()
    if found is not None and found.name == "torch.export":
        raise UnbuiltError(
            message(
                module_path(module),
                "a built model for torch.export (an export does not change the model)",
                "an unbuilt lazy layer",
                found.fix,
            )
        )


def refuse_under_functorch(module: nn.Module) -> None:
    # torch._C._functorch.peek_interpreter_stack is private; torch.func has no public "is a
    # transform active" query. Building under grad/vmap would materialize parameters inside
    # the transform (torch's own lazy modules crash the interpreter there).
    # tests/test_torch_internals.py checks it still exists.
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise InferenceError(
            message(
                module_path(module),
                "its first call outside torch.func transforms",
                "a first call inside torch.func.grad / vmap / jacrev (or functional_call "
                "under one)",
                "build the model first with a plain call, model(example), or "
                f"{BUILD}; then apply the transform",
            )
        )


def scripted_path(module: nn.Module) -> str | None:
    """The path of ``module`` in the model ``torch.jit.script`` was given (read off its
    frames, whose ``obj`` is that model; error path only), or None."""
    frame = sys._getframe(1)  # CPython frame access: only on the error path
    root = None
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("jit", "_script.py")):
            obj = frame_locals(frame, ("obj",)).get("obj")
            if isinstance(obj, nn.Module):
                root = obj  # the outermost one is the user's model
        frame = frame.f_back  # type: ignore[assignment]
    if root is None:
        return None
    if root is module:
        return ""
    found = next((path for path, m in root.named_modules() if m is module), None)
    return found
