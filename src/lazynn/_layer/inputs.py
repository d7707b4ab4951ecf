"""A lazy layer's first inputs: the sizes they give, and the checks before a build.

* :func:`read_sizes`: each inferred size, read where its :class:`~lazynn.Infer` says, with the
  rank and a positive size checked;
* :func:`check_input`: the input's device and dtype against the layer's placeholders (meta
  tensors check neither);
* :func:`run_on_meta`: the eager layer with these sizes, constructed and run on meta copies
  of the inputs, so that anything its forward refuses (a kernel larger than the input,
  channels not divisible by ``groups``) is refused before anything changes.

Each raises :class:`~lazynn.InferenceError` naming the layer's path, what was expected,
what was received and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .._errors import BUILD, Fix, InferenceError, message, meta_limitation, module_path, shape_str
from .._module.state import LazyState, find_state
from .._module.tensors import describe, is_placeholder, map_tensors, meta_like, raw
from .arguments import left_in_note
from .construct import short_repr
from .infer import Infer, ambiguity

__all__ = [
    "ambiguous_reading",
    "argument",
    "check_input",
    "construct_checked",
    "describe_substitute",
    "forward_error",
    "int_example",
    "read_sizes",
    "run_on_meta",
    "substitute_error",
]

_LOWER_PRECISION = (torch.float16, torch.bfloat16)


def argument(
    names: list[str], arg: int | str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """The forward argument ``arg`` (a position or a name; ``names``: the forward's argument
    names) of a call with ``args`` and ``kwargs``, or None if it was not passed."""
    if isinstance(arg, int):
        if arg < len(args):
            return args[arg]
        arg = names[arg] if arg < len(names) else str(arg)
    if arg in kwargs:
        return kwargs[arg]
    index = names.index(arg) if arg in names else len(args)
    return args[index] if index < len(args) else None


def _tensor_of(value: Any) -> Any:
    return value.data if isinstance(value, PackedSequence) else value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_example(value: int) -> str:
    """Why an int example fails where a shape was meant, and the shape to write."""
    return (
        f"an example given to lazynn.build or summary as {value!r} reaches the forward as an "
        f"int: a shape is a tuple, ({value},) or (4, {value})"
    )


def ambiguous_reading(
    specs: Mapping[str, Infer], names: list[str], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str | None:
    """Why a size read from a call's inputs may not be the one meant (``infer.ambiguity``), or
    None: the first inferred size whose reading is ambiguous."""
    for name, spec in specs.items():
        value = argument(names, spec.arg, args, kwargs)
        if isinstance(value, torch.Tensor):
            text = ambiguity(spec, value.shape, name)
            if text is not None:
                return text
    return None


def read_sizes(
    layer: nn.Module,
    specs: Mapping[str, Infer],
    names: list[str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """Each inferred size of ``layer`` read from its call's inputs."""
    sizes = {}
    for name, spec in specs.items():
        value = _tensor_of(argument(names, spec.arg, args, kwargs))
        if not isinstance(value, torch.Tensor):
            raise InferenceError(
                message(
                    module_path(layer),
                    f"{spec.accepted()} (a tensor) to infer {name}",
                    describe(value),
                    "call the layer with a tensor"
                    + (f" ({int_example(value)})" if _is_int(value) else ""),
                    key=Fix.INPUT_TENSOR,
                )
            )
        size = spec.read(value.shape)
        if size is None:
            raise InferenceError(
                message(
                    module_path(layer),
                    f"{spec.accepted()} to infer {name}",
                    f"shape {shape_str(value.shape)}",
                    "reshape the input to one of the accepted layouts",
                    key=Fix.INPUT_LAYOUT,
                )
            )
        if min(size if isinstance(size, tuple) else (size,)) < 1:
            raise InferenceError(
                message(
                    module_path(layer),
                    f"a positive {name} (read from the input's shape)",
                    f"shape {shape_str(value.shape)}, which gives {name}={size}",
                    "call the layer with a non-empty input",
                    key=Fix.INPUT_NONEMPTY,
                )
            )
        sizes[name] = size
    return sizes


def check_input(
    layer: nn.Module,
    specs: Mapping[str, Infer],
    names: list[str],
    placeholders: Iterable[torch.Tensor],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    mixed_precision: bool,
    any_float: bool,
) -> None:
    """The inputs that give sizes are on the placeholders' device and of their dtype
    (``mixed_precision``: float16/bfloat16 inputs may meet float32 placeholders; ``any_float``:
    any floating dtype is accepted)."""
    held = [raw(t) for t in placeholders]  # (their data: no __torch_function__ on the way)
    floats = [d.dtype for d in held if d.dtype.is_floating_point or d.dtype.is_complex]
    devices = {d.device for d in held}
    for name, spec in specs.items():
        value = _tensor_of(argument(names, spec.arg, args, kwargs))
        if devices and value.device not in devices:
            raise InferenceError(
                message(
                    module_path(layer),
                    f"an input on {', '.join(sorted(map(str, devices)))} (the layer's device)",
                    f"an input on {value.device} (to infer {name})",
                    "move the input (x.to(device)) or the layer (layer.to(device)) before "
                    f"the first call, or use {BUILD} for a dry run",
                    key=Fix.INPUT_DEVICE,
                )
            )
        dtype = value.dtype
        kind = value.device.type
        if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
            continue  # autocast casts inputs and weights; eager accepts any float here
        expected = floats[0] if floats else None
        ok = dtype.is_floating_point or dtype.is_complex
        if ok and expected is not None and dtype != expected and not any_float:
            ok = mixed_precision and expected == torch.float32 and dtype in _LOWER_PRECISION
        if not ok:
            want = (
                f"a {expected} input (the layer's dtype)" if expected else "a floating-point input"
            )
            raise InferenceError(
                message(
                    module_path(layer),
                    want,
                    f"a {dtype} input (to infer {name})",
                    "cast the input (x.to(dtype)) or the layer (layer.to(dtype)) "
                    "before the first call",
                    key=Fix.INPUT_DTYPE,
                    value=dtype,
                )
            )


def construct_checked(
    layer: nn.Module,
    construct: Callable[[], nn.Module],
    sizes: Mapping[str, Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> nn.Module:
    """``construct()``, the eager layer with ``sizes``; a refusal of its constructor (channels
    not divisible by ``num_groups``...) is an InferenceError naming the layer and its input."""
    try:
        return construct()
    except Warning:
        raise  # a warning turned error, as the eager constructor raises it
    except Exception as error:
        if _vmap_refused_draw(error):
            raise InferenceError(
                message(
                    module_path(layer),
                    "a first call under torch.vmap with randomness='same' or 'different' "
                    "(the layer's initialization draws random numbers)",
                    "randomness='error' (vmap's default)",
                    "pass randomness='same' to torch.vmap (the parameters a build makes are "
                    "not batched: every sample sees the same ones), or build the model before "
                    "the transform",
                    detail=str(error),
                )
            ) from error
        raise InferenceError(
            message(
                module_path(layer),
                "inputs from which a valid layer can be made",
                f"{describe(args[0] if args else kwargs)}, which gives "
                + ", ".join(f"{k}={v}" for k, v in sizes.items()),
                "check the input's layout and the layer's arguments",
                detail=str(error),
                key=Fix.LAYER_ARGUMENTS,
            )
        ) from error


def _vmap_refused_draw(error: Exception) -> bool:
    """Whether ``error`` is torch.vmap refusing a random operation (randomness='error')."""
    return isinstance(error, RuntimeError) and str(error).startswith(
        "vmap: called random operation while in randomness error mode"
    )


def forward_error(
    layer: nn.Module,
    built: nn.Module,
    args: tuple[Any, ...],
    error: Exception,
    kind: type[nn.Module],
    before: LazyState | None,
) -> InferenceError:
    """The error of a first call whose forward refused its input after the build: ``built``
    is the layer as built (for its repr and its sizes), ``error`` what the forward raised;
    ``kind`` the lazy class, ``before`` what the layer knew before the build (its arguments:
    a first argument equal to a size the input gave is noted as a left-in input size)."""
    note = None
    if before is not None:
        specs = before.specs if before.specs is not None else getattr(kind, "inferred", {})
        sizes = {name: getattr(built, name, None) for name in specs}
        note = left_in_note(kind, type(built), before.kwargs, sizes)
    parts = message(
        module_path(layer, name=kind.__name__),
        f"an input that {short_repr(built)} accepts",
        describe(args[0] if len(args) == 1 else args),
        "call it with a valid input",
        detail=str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
        key=Fix.VALID_INPUT,
        outcome="the layer is still unbuilt",
    )
    return InferenceError(parts if note is None else dataclasses.replace(parts, notes=(note,)))


def run_on_meta(
    layer: nn.Module,
    construct: Callable[[], nn.Module],
    sizes: Mapping[str, Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> nn.Module:
    """Construct the eager layer on meta (``construct``) and run it on meta copies of the
    inputs, in ``layer``'s training mode. Returns that meta layer, so a build on meta can
    use it.
    """
    shadow = construct_checked(layer, construct, sizes, args, kwargs)
    shadow.train(layer.training)
    meta_args = map_tensors(meta_like, args)
    meta_kwargs = map_tensors(meta_like, dict(kwargs))
    try:
        # (what its forward warns, it warns: the real forward's same warning then shows no
        # second time, under the default filters; no filter is changed, they are the process's)
        with torch.no_grad():
            shadow(*meta_args, **meta_kwargs)
    except Warning:
        raise  # a warning turned error, as the forward raises it
    except Exception as error:
        if meta_limitation(error):
            return shadow  # meta cannot run this forward (e.g. .item()): no verdict
        raise forward_error(layer, shadow, args, error, type(layer), find_state(layer)) from error
    return shadow


def substitute_error(
    where: str, slot: str, shape: torch.Size, current: torch.Tensor
) -> InferenceError:
    """The refusal of a build whose tensor for ``slot`` (of ``shape``, from the inputs) finds
    ``current`` in the placeholder's place, which does not fit."""
    return InferenceError(
        message(
            where,
            f"'{slot}' of shape {shape_str(shape)} (from the inputs)",
            describe_substitute(current),
            "tie layers whose inputs give the weight one shape (or tie them after "
            "the build: lazynn.on_build); for torch.func, build the model with a "
            "plain call first (model(example)), then take its parameters",
            outcome="the layer is still unbuilt",
        )
    )


def describe_substitute(tensor: torch.Tensor) -> str:
    """What stands in a placeholder's place at its build, for an error message: a tensor tied
    from another layer, or one torch.func.functional_call put there."""
    if is_placeholder(tensor) or tensor.numel() == 0:
        return "an unbuilt placeholder seen through torch.func (functional_call or a transform)"
    return (
        f"a tensor of shape {shape_str(tensor.shape)} in its place, which does not fit: a "
        "weight tied to another layer whose inputs gave it that shape, or a tensor passed to "
        "torch.func.functional_call"
    )
