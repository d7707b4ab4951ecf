"""Lazy layers a factory's ``__init__`` transforms (``weight_norm``, ``spectral_norm``, a
parametrization, pruning): eager code applies these to a built layer, so the factory's first
run (``draft.py``) lays each such layer out as its eager class on meta
(``_layer/layout.py``), with every lazy layer the same line of code constructs, and the layer
learns its sizes from its input through that run's own forward. This module finds them (a
failed step, a transformed placeholder), reads what they learnt, and refuses those no input
reached.

>>> from lazynn._module.state import Drafting
>>> laid_read(Drafting(), {})
{}
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize, prune

from .._errors import InferenceError, message
from .._layer.base import LazyLayer
from .._module.lifecycle import is_lazy_module
from .._module.state import Drafting, find_state

__all__ = ["NeedsTensors", "laid_read", "needing", "refuse_unread", "transformed_layers"]


class NeedsTensors(Exception):
    """A step of a draft's ``__init__`` needed the tensors of these lazy layers (by number)."""

    def __init__(self, indices: set[int]) -> None:
        super().__init__(f"lazy layers number {sorted(i + 1 for i in indices)}")
        self.indices = indices


def needing(error: BaseException, drafting: Drafting, laid: bool = False) -> int | None:
    """The number of the lazy layer a failed step of a draft's ``__init__`` was given (its
    placeholder, or the layer, a local of the innermost frame that holds one; in ``error``'s
    traceback, else its cause's: a caller's factory may have wrapped it), not laid out eager
    already (``laid``: or one that is)."""
    for failed in (error, error.__cause__):
        trace = failed.__traceback__ if failed is not None else None
        frames = [frame for frame, _ in traceback.walk_tb(trace)]
        for frame in reversed(frames):
            for value in _shallow(frame.f_locals.values()):
                index = None
                if isinstance(value, torch.Tensor):
                    index = drafting.owners.get(id(value))
                elif isinstance(value, LazyLayer) and (state := find_state(value)) is not None:
                    index = state.index if state.index >= 0 and is_lazy_module(value) else None
                if index is not None and (laid or index not in drafting.eager):
                    return index
    return None


def _shallow(values: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """``values``, and the items of the lists and tuples among them, ``depth`` levels deep
    (``prune.global_unstructured``'s ``[(module, "weight"), ...]``)."""
    for value in values:
        yield value
        if depth and isinstance(value, (list, tuple)):
            yield from _shallow(value[:64], depth - 1)


def _transformed(layer: nn.Module) -> bool:
    """Whether a parametrization or pruning holds ``layer``'s tensors (applied in ``__init__``
    to its placeholders, which their forward cannot compute with)."""
    return parametrize.is_parametrized(layer) or prune.is_pruned(layer)


def laid_read(
    drafting: Drafting, learnt: dict[nn.Module, dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """The sizes the layers laid out eager read, by number (:attr:`Drafting.laid`)."""
    return {i: dict(learnt[m]) for i, m in drafting.laid.items() if m in learnt}


def refuse_unread(model: nn.Module, drafting: Drafting, read: dict[int, dict[str, Any]]) -> None:
    """Refuse the layers laid out eager with stand-in sizes that the forward never called: no
    input gave them their sizes."""
    paths = {id(m): p for p, m in model.named_modules()}
    unread = [
        (i, m)
        for i, m in sorted(drafting.laid.items())
        if drafting.entries[i].sizes is None and i not in read
    ]
    if unread:
        named = [f"'{paths[id(m)]}'" if id(m) in paths else "" for _, m in unread]
        shown = [
            n or f"lazy layer number {i + 1} of its construction (left out of the model)"
            for (i, _), n in zip(unread, named, strict=True)
        ]
        raise InferenceError(
            message(
                drafting.where,
                "example inputs whose forward calls every lazy layer",
                "a forward that never called " + ", ".join(shown) + ", whose tensors the "
                "factory's __init__ transforms (weight_norm, a parametrization), so that its "
                "first run lays them out as their eager class",
                "pass inputs that reach them, or give them their sizes (their eager class)",
                outcome="nothing was built",
            )
        )


def transformed_layers(model: nn.Module, drafting: Drafting) -> set[int]:
    """The numbers of the lazy layers of a draft whose tensors a parametrization or pruning
    holds (applied in ``__init__`` to their placeholders, which their forward cannot compute
    with), not laid out eager already."""
    return {
        state.index
        for m in model.modules()
        if isinstance(m, LazyLayer)
        and _transformed(m)
        and (state := find_state(m)) is not None
        and state.index >= 0
        and state.index not in drafting.eager
    }
