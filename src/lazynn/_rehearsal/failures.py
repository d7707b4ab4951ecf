"""A rehearsal's failure, worded: the module whose forward raised (by its path and class, a
lazy layer by its lazy class), the input shapes it received, and the fix, keyed for the
command line: a forward that needs values (``NeedsValuesError``), a module that does not
implement the call, a batch of one for a BatchNorm in training, token ids given as floats,
not one example per argument of the model's forward, or the shapes.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from .._errors import (
    Fix,
    InferenceError,
    NeedsValuesError,
    first_line,
    message,
    meta_limitation,
    shape_str,
)
from .._layer.inputs import int_example
from .._module.tensors import shapes
from .habits import TORCHINFO

__all__ = ["failure_of"]


def failure_of(
    error: Exception,
    where: tuple[str, nn.Module, Any, Any] | None,
    lazy_before: dict[str, type],
) -> InferenceError:
    if where is None:
        return InferenceError(
            message(
                "the model",
                "example inputs its forward accepts",
                "inputs that failed before any module ran",
                "check the example inputs",
                detail=f"{type(error).__name__}: {error}",
                key=Fix.INPUT_ARGUMENTS,
            )
        )
    path, module, a, k = where
    name = lazy_before.get(path, type(module)).__name__  # a lazy layer, by its own name
    label = f"{name} at '{path}'" if path else f"{name} (root)"
    received = ", ".join(f"{shape_str(s)} {d}".replace("torch.", "") for s, d in shapes((a, k)))
    if meta_limitation(error):
        # nn.AdaptiveLogSoftmaxWithLoss selects rows with torch.nonzero: shapes from values
        return NeedsValuesError(
            message(
                label,
                "a forward whose shapes follow from its inputs' shapes (build and summary run "
                "the model on meta tensors, which hold no values)",
                f"one that needs values (inputs of shapes {received or 'none'})",
                "build it with a real call, model(example), instead of lazynn.build or "
                "lazynn.summary",
                detail=f"{type(error).__name__}: {first_line(error)}",
                key=Fix.NEEDS_VALUES,
                outcome="the model is unchanged",
            )
        )
    key, fix = _fix_of(error, path, module, a)
    return InferenceError(
        message(
            label,
            "inputs it can take (the build ran the model on meta tensors)",
            f"inputs of shapes {received or 'none'}",
            fix,
            detail=f"{type(error).__name__}: {first_line(error)}",
            key=key,
            outcome="the model is unchanged",
        )
    )


def _fix_of(error: Exception, path: str, module: nn.Module, args: Any) -> tuple[Fix, str]:
    """The fix (its key and its words) for a module's forward that failed on meta inputs."""
    if isinstance(error, NotImplementedError):
        return Fix.NOT_IMPLEMENTED, (
            "the module does not implement this call (its forward is not written, or it does "
            "not support inputs of these shapes): write its forward, or check the example "
            "inputs' shapes and the layers before it"
        )
    if "more than 1 value per channel when training" in str(error):  # (torch's words)
        return Fix.BATCH_OF_MORE, (
            "give a batch of more than one, or run in eval mode (model.eval() before "
            "lazynn.build; lazynn.summary(..., mode='eval'); lazynn summary --eval)"
        )
    first = next(iter(shapes(args)), None)
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and first and first[1].is_floating_point:
        return Fix.TOKEN_IDS, "give the embedding integer token ids (torch.long)"
    if not path and isinstance(error, TypeError) and _refused_arguments(error):
        habit = next(
            (TORCHINFO[w] for w in TORCHINFO if f"keyword argument '{w}'" in str(error)), None
        )
        if habit is not None:  # (a factory's forward, not known before its model is made)
            return Fix.INPUT_ARGUMENTS, f"{habit} (torchinfo's keyword is not lazynn's)"
        return Fix.INPUT_ARGUMENTS, "give one example per argument of the model's forward"
    ints = [v for v in (args if isinstance(args, tuple) else ()) if _size(v)]
    if ints and not shapes(args):
        return Fix.INPUT_SHAPES, int_example(ints[0])
    return Fix.INPUT_SHAPES, "check the example inputs' shapes and the layers before this one"


def _size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refused_arguments(error: TypeError) -> bool:
    """Whether Python refused a call's arguments (the model's forward called with too many or
    too few): the innermost frame of ``error`` is the module's call, not its forward."""
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None:
        return False
    # (nn.Module's call machinery, _call_impl or its inner(): torch's own file)
    return trace.tb_frame.f_code.co_filename.endswith(os.path.join("nn", "modules", "module.py"))
