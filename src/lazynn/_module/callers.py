"""Which torch tool is asking an unbuilt placeholder (the refusals are ``refusals.py``).

``DistributedDataParallel(model)`` and ``fully_shard(model)`` cannot take an unbuilt model:
every rank must hold the built parameters before the wrapper registers, shards or broadcasts
them. lazynn's placeholders see the wrapper's first look at them: the placeholder reads the
call stack when it is asked for ``requires_grad`` (DDP's first question) or its shape
(FSDP2's), and :func:`find_wrapper` names the wrapper. Nothing of torch is patched.

Tools that work on a module right after its construction (``torch.nn.init``,
parametrizations, pruning, ``AveragedModel``) and tools that need a built model (export,
TorchScript) are found the same way without a wrapper (:func:`find_tool`), with the fix their
refusal gives. Whether torch.compile is building (:func:`under_dynamo`), and running lazynn's
own machinery outside its traces (:func:`untraced`), are questions of the same kind. Finding
is a query and changes nothing.

>>> find_wrapper() is None  # no wrapper on the stack here
True
>>> find_tool() is None
True
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import nn

from .._errors import BUILD, INIT_FIX, QUEUE_IT, frame_locals
from .state import context

__all__ = [
    "LAZYNN_FOLDER",
    "Tool",
    "Wrapper",
    "code_site",
    "distributed",
    "find_tool",
    "find_wrapper",
    "frames",
    "in_checkpoint",
    "is_users",
    "scripted_path",
    "torch_only",
    "under_dynamo",
    "untraced",
    "user_stacklevel",
]

#: wrapper -> (function name, file path suffix, the local naming the module) of the frame that
#: constructs it. These are torch internals: tests/building/test_distributed.py (DDP,
#: fully_shard) and
#: tests/ecosystem/test_compile.py (torch.jit.trace) check that each refusal still fires.
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


def frames(skip: int = 3) -> Iterator[FrameType]:
    """The calling frames, innermost first (sys._getframe: CPython's documented access)."""
    frame: FrameType | None = sys._getframe(skip)
    for _ in range(_DEPTH):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


#: lazynn's own folder, the package root (this module is one wing below it)
LAZYNN_FOLDER = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
#: folders whose code is not the user's: lazynn's, torch's, Python's own
_NOT_USERS = tuple(
    os.path.realpath(folder)
    for folder in {
        LAZYNN_FOLDER,
        os.path.dirname(torch.__file__),
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
    }
)


def is_users(filename: str) -> bool:
    """Whether code of ``filename`` is the user's: not lazynn's, torch's, Python's, nor an
    installed package's (``site-packages``)."""
    if filename.startswith("<"):  # <frozen runpy>, <string>
        return False
    path = os.path.realpath(filename)
    if {"site-packages", "dist-packages"} & set(path.split(os.sep)):
        return False
    return not any(path == root or path.startswith(root + os.sep) for root in _NOT_USERS)


@functools.lru_cache(maxsize=1024)
def _not_users_code(filename: str) -> bool:
    """Whether ``filename`` is lazynn's, torch's or Python's own (an installed package's is
    not: its code constructs modules as the user's does)."""
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    return any(path == root or path.startswith(root + os.sep) for root in _NOT_USERS)


def code_site(skip: int = 2) -> tuple[str, int] | None:
    """The innermost line of the calling code that is neither lazynn's, torch's (a wrapper of
    dynamo's, say) nor Python's own: (file, line), or None."""
    for frame in frames(skip):
        if not _not_users_code(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
    return None


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller point at the user's line:
    the innermost frame of the user's code (:func:`is_users`; a first call's warning, raised
    under ``nn.Module.__call__`` and containers' forwards, names the model's code, not
    torch's). Only on the path of a warning: it resolves each frame's file."""
    frame: FrameType | None = sys._getframe(1)  # (CPython's documented frame access)
    level = 1
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


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
    for frame in frames():
        code = frame.f_code
        for name, (function, path, local) in _WRAPPERS.items():
            if code.co_name == function and code.co_filename.endswith(path):
                found = Wrapper(name, frame_locals(frame, (local,)).get(local))
    return found


@dataclass(frozen=True)
class Tool:
    """A torch tool that asked an unbuilt placeholder (or size): what it is, and the fix."""

    name: str
    fix: str


#: (file path fragment, function name or "", what the tool is, the fix); first match wins.
#: Paths are torch's layout (internal): tests/module/test_tools_on_unbuilt_models.py checks every
#: message, so a
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
    for frame in frames():
        code = frame.f_code
        for fragment, function, tool, fix in _TOOLS:
            if fragment in code.co_filename and function in ("", code.co_name):
                return Tool(tool, fix)
    return None


def distributed() -> bool:
    """Whether a process group exists (DDP and fully_shard need one): only then do
    placeholders look for a wrapper being constructed around them."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


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
        disabled = _DISABLED[fn] = torch.compiler.disable(fn, recursive=True)
    return disabled


#: function -> its dynamo-disabled wrapper
_DISABLED: dict[Callable[..., Any], Callable[..., Any]] = {}


_CHECKPOINT = os.path.join("torch", "utils", "checkpoint.py")
#: the innermost saved-tensors hooks (torch.autograd.graph.saved_tensors_hooks), or None
_SAVED_TENSORS_HOOKS = torch._C._autograd._top_saved_tensors_default_hooks


def in_checkpoint() -> Any:
    """If the call is inside ``torch.utils.checkpoint`` (either kind), whose backward
    recomputes the forward from the random state it saved at its start, what the builds
    there belong to: the outermost module being called (a model whose forward checkpoints
    block after block), else the checkpointed function; None outside. (A frame of torch's
    file on the stack, its local ``run_function`` (reentrant) or ``function``, and the frames'
    ``self``. tests/rehearsal/test_rehearsal.py checks the effects.)"""
    if torch.is_grad_enabled() and _SAVED_TENSORS_HOOKS(True) is None:
        # (a checkpoint's forward runs under no_grad, reentrant, or under its saved-tensors
        # hooks, non-reentrant, its recomputation too: neither here, so no frame walk)
        return None
    found = None
    frame: FrameType | None = sys._getframe(1)  # (only on a build: CPython's frame access)
    while frame is not None:
        if found is None and frame.f_code.co_filename.endswith(_CHECKPOINT):
            function = frame_locals(frame, _CHECKPOINTED)
            found = next(iter(function.values()), frame.f_code)
        if found is not None:
            owner = frame_locals(frame, ("self",)).get("self")
            if isinstance(owner, nn.Module):
                found = owner  # (the outermost one is the model)
        frame = frame.f_back
    return found


def calling(module: object) -> bool:
    """Whether a call of ``module`` (its ``forward``, or a method it called) is on the stack:
    a build outside ``torch.utils.checkpoint`` within the model whose checkpointed blocks built
    before it (``in_checkpoint``'s owner; a code object: a frame running it, as
    ``checkpoint_sequential``'s segment function, whose last segment runs unchecked). Only on
    a build, after such blocks."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is module or frame_locals(frame, ("self",)).get("self") is module:
            return True
        frame = frame.f_back
    return False


#: the locals naming the checkpointed function in torch.utils.checkpoint's frames
_CHECKPOINTED = ("run_function", "function")


def torch_only(module: nn.Module) -> bool:
    """Whether a first call of ``module`` runs only torch's code and lazynn's (which draw from
    no Python or numpy generator): its eager class's forward is torch.nn's, it holds no hook
    but its build hook, and no global module hook is registered. (torch keeps the global
    hooks in private dicts of ``torch.nn.modules.module``, read only here;
    tests/ecosystem/test_torch_internals.py checks that the public registration fills them.)"""
    eager = module.__dict__.get("cls_to_become") or getattr(type(module), "cls_to_become", None)
    if eager is None or not getattr(eager.forward, "__module__", "").startswith("torch.nn."):
        return False
    if len(module._forward_pre_hooks) > 1 or module._forward_hooks or module._backward_hooks:
        return False
    hooks = torch.nn.modules.module
    return not (
        hooks._global_forward_pre_hooks
        or hooks._global_forward_hooks
        or hooks._global_backward_pre_hooks
        or hooks._global_backward_hooks
    )


def under_dynamo() -> bool:
    """Whether torch.compile (dynamo's lazy-module protocol) is building a module right now:
    dynamo calls ``initialize_lazy_module`` itself. torch internals: tests/ecosystem/test_compile.py
    compiles an unbuilt rank-agnostic layer, which must give lazynn's refusal."""
    if "torch._dynamo" not in sys.modules:
        return False  # (no stack walk on a plain first call)
    return any(
        frame.f_code.co_name == "initialize_lazy_module" and _DYNAMO in frame.f_code.co_filename
        for frame in frames(2)
    )


def scripted_path(module: nn.Module) -> str | None:
    """The path of ``module`` in the model ``torch.jit.script`` was given (read off its
    frames, whose ``obj`` is that model; error path only), or None."""
    frame: FrameType | None = sys._getframe(1)  # CPython frame access: only on the error path
    root = None
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("jit", "_script.py")):
            obj = frame_locals(frame, ("obj",)).get("obj")
            if isinstance(obj, nn.Module):
                root = obj  # the outermost one is the user's model
        frame = frame.f_back
    if root is None:
        return None
    if root is module:
        return ""
    found = next((path for path, m in root.named_modules() if m is module), None)
    return found
