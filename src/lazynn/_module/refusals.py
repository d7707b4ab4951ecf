"""The refusals of unbuilt placeholders and modules, worded for whoever asked, and the undo
steps two of them need.

torch words its refusals for its own lazy modules ("Run a dummy forward pass", or a shape error
that blames ``load_state_dict``); lazynn's name every unbuilt parameter and the recipe (build,
then wrap; build on meta, shard, materialize; the factory form for init code that needs
sizes), with torch's own phrase kept inside. Who asked comes from ``callers.py``.

Two refusals must also take back what the tool did before it asked: a refused ``fully_shard``
has registered itself on the module (:func:`undo_wrapper`), a refused pruning has moved the
parameter (:func:`undo_pruning`); the placeholder's refusal calls them.

>>> error = refusal("the 'weight' of LazyLinear", "UninitializedParameter", "Tensor.sum", None)
>>> str(error).startswith("the 'weight' of LazyLinear: expected a built tensor for Tensor.sum")
True
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .._errors import (
    BUILD,
    CALL_NOT_FORWARD,
    Fix,
    InferenceError,
    UnbuiltError,
    frame_locals,
    message,
    module_path,
    torch_phrase,
)
from .callers import (
    Wrapper,
    distributed,
    find_tool,
    find_wrapper,
    frames,
    scripted_path,
    under_dynamo,
)
from .state import WAITING, context, find_state
from .tensors import is_placeholder

__all__ = [
    "compile_refusal",
    "distributed",
    "refusal",
    "refuse_under_export",
    "refuse_under_functorch",
    "replication_refusal",
    "scripting_refusal",
    "undo_pruning",
    "undo_wrapper",
    "warn_compiled_queue",
    "wrapper_error",
    "wrapper_refusal",
]


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

    ``torch.distributed._composable.contract`` is private; tests/building/test_distributed.py
    applies
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
                key=Fix.ON_BUILD,
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
    (a lazy layer records its construction order). torch internals:
    tests/module/test_tools_on_unbuilt_models.py
    checks that a refused pruning leaves the layer as it was.
    """
    keys = ("module", "name", "orig")
    found = next(
        (
            values
            for f in frames()
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


def compile_refusal(what: str, why: str, fixes: list[str]) -> None:
    """Refuse, under torch.compile, to build ``what``: a graph break that dynamo reports in
    its own words (without fullgraph the call runs uncompiled, and builds; with fullgraph=True
    it is the error, ours inside), not an exception from inside dynamo, which it would wrap as
    an internal error. ``torch._dynamo.exc.unimplemented`` is private: its keyword signature
    is checked by tests/ecosystem/test_torch_internals.py."""
    from torch._dynamo.exc import unimplemented  # (only under dynamo: imported already)

    unimplemented(
        gb_type="lazynn: build under torch.compile",
        context=what,
        explanation=f"lazynn cannot build {what} while torch.compile traces it: {why}",
        hints=fixes,
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
    """A first call inside ``torch.func.grad`` / ``jacrev`` / ``jvp`` (or ``functional_call``
    under one), refused: building there would materialize parameters inside a transform that
    differentiates (torch's own lazy modules crash the interpreter). Under ``vmap`` alone the
    build runs as torch's does (torchrl builds one network per agent so): the parameters it
    makes are not batched, and draws follow vmap's ``randomness``."""
    # torch._C._functorch.get_interpreter_stack is private; torch.func has no public "which
    # transforms are active" query. tests/ecosystem/test_torch_internals.py checks it exists.
    # (traced by dynamo, the stack is not None whatever runs: a build is never refused there)
    if torch.compiler.is_dynamo_compiling():
        return
    stack = torch._C._functorch.get_interpreter_stack()
    if stack and any(level.key() != _VMAP for level in stack):
        raise InferenceError(
            message(
                module_path(module),
                "its first call outside torch.func transforms that differentiate",
                "a first call inside torch.func.grad / jacrev / jvp (or functional_call under one)",
                "build the model first with a plain call, model(example), or "
                f"{BUILD}; then apply the transform",
            )
        )


#: the transform under which a first call builds (see refuse_under_functorch)
_VMAP = torch._C._functorch.TransformType.Vmap


def scripting_refusal(module: nn.Module) -> UnbuiltError:
    """torch.jit.script of an unbuilt lazy module, refused with torch's own words inside."""
    left = [n for n, t in module.named_parameters() if is_placeholder(t)]
    left += [n for n, t in module.named_buffers() if is_placeholder(t)]
    return UnbuiltError(
        message(
            module_path(module, scripted_path(module)),
            "a built module for torch.jit.script",
            "a module that has uninitialized parameters (it is not built yet)",
            f"build the model first: {BUILD}, or call it once on an example input (or load a "
            "built checkpoint); then script it",
            # torch's own words (its check would come next)
            detail=f"'{torch.typename(type(module))}' has uninitialized parameters {left}. "
            "Did you forget to run a forward pass?",
        )
    )


def replication_refusal(module: nn.Module) -> UnbuiltError:
    """DataParallel's replication of an unbuilt lazy module, refused."""
    return UnbuiltError(
        message(
            module_path(module),
            "a built module for DataParallel",
            "an unbuilt lazy module",
            "build the model before wrapping it: call it once on an example input (or load a "
            "built checkpoint), then wrap it in DataParallel",
        )
    )
