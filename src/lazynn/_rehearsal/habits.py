"""torchinfo's keywords, answered in lazynn's words.

``torchinfo.summary(model, input_size=(4, 16), depth=1, col_names=...)`` is a habit: typed
to ``lazynn.summary``, those keywords would reach the model's forward as example arguments.
A keyword of torchinfo's that the forward does not take is refused before anything runs,
with lazynn's own way to say it; one the forward takes is the forward's.

>>> print(TORCHINFO["depth"])
choose the depth when rendering: print(lazynn.summary(model, x).render(depth=1))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from .._errors import ArgumentError, message

__all__ = ["TORCHINFO", "called", "check_keywords", "takes_keyword"]

_COLUMNS = (
    "torchinfo's input_size, output_size, num_params, kernel_size and mult_adds are lazynn's "
    "input, output, params, param_shapes and flops"
)

#: torchinfo's keyword -> how lazynn says it
TORCHINFO = {
    "input_size": "give each input's shape as an example, by position: "
    "lazynn.summary(model, (4, 16)); a dtype with it: lazynn.Spec((1, 1024), torch.long)",
    "input_data": "give the example tensors by position: lazynn.summary(model, x) (the "
    "forward's keyword arguments by their names)",
    "depth": "choose the depth when rendering: print(lazynn.summary(model, x).render(depth=1))",
    "col_names": "choose the columns when rendering: .render(columns=('input', 'output', "
    f"'params', 'flops')); {_COLUMNS}",
    "col_width": "choose the table's width when rendering: .render(width=120)",
    "row_settings": "rows show each module's type and its lazy class; depth and blocks when "
    "rendering: .render(depth=2, expand=True)",
    "verbose": "print the summary, or let a REPL show it: lazynn.summary returns it and "
    "prints nothing",
    "dtypes": "give each example's dtype with lazynn.Spec(shape, dtype): "
    "lazynn.Spec((1, 1024), torch.long)",
    "device": "drop it: a summary allocates nothing (it runs on meta); lazynn.build(model, x, "
    "device=...) places a built model",
    "batch_dim": "write the batch in each shape, or leave it free with a name or None: "
    "lazynn.Spec(('B', 16)), (None, 16)",
    "cache_forward_pass": "drop it: the summary runs the forward once, on meta",
}


def takes_keyword(forward: Callable[..., Any], name: str) -> bool:
    """Whether ``forward`` takes a keyword ``name`` (by name, or ``**kwargs``); True when its
    signature cannot be read."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in parameters
    )


def called(model: Any) -> tuple[Callable[..., Any] | None, str]:
    """What a call of ``model`` (or of the model a class makes) runs with the examples, and
    its owner's name: the bound ``forward`` of an instance (one set on it too), a compiled
    model's original's; None where another function takes the call (a ``__call__`` of the
    class's own) or the model is not known before it is made (a lambda factory)."""
    if isinstance(model, type):
        if not issubclass(model, nn.Module) or model.__call__ is not nn.Module.__call__:
            return None, model.__name__
        return model.forward, model.__name__
    if not isinstance(model, nn.Module):
        return None, type(model).__name__
    model = getattr(model, "_orig_mod", model)  # (torch.compile's OptimizedModule: its model)
    if type(model).__call__ is not nn.Module.__call__:
        return None, type(model).__name__
    return model.forward, type(model).__name__


def check_keywords(forward: Callable[..., Any] | None, owner: str, kwargs: dict[str, Any]) -> None:
    """Refuse torchinfo's keywords among ``kwargs`` that ``forward`` (``owner``'s, by name;
    None: not known before the model is made) does not take."""
    for name in kwargs:
        if name in TORCHINFO and forward is not None and not takes_keyword(forward, name):
            raise ArgumentError(
                message(
                    "lazynn.summary",
                    "example inputs for the model's forward, by position or by the names its "
                    "arguments have, and lazynn's own keywords (mode, training, optimizer)",
                    f"{name}=, torchinfo's keyword, which {owner}.forward does not take",
                    TORCHINFO[name],
                )
            )
