"""A lazy layer's sizes, solved from a checkpoint's tensor shapes.

Each tensor dimension of a layer is an affine function of an inferred size (``in_channels /
groups``, ``in_features``...). Constructing the layer on meta with the probe sizes, then with
one probe doubled, tells for each inferred size one dimension that depends on it and how; the
checkpoint's dimension gives the size. :func:`solve_sizes` does this for every size (each
element of a tuple size, such as LayerNorm's ``normalized_shape``, is its own unknown).

>>> import torch
>>> def shapes(sizes):
...     return {("", "weight"): torch.Size([4, sizes["in_features"]])}
>>> solve_sizes({"in_features": 1}, shapes, {("", "weight"): torch.Size([4, 7])}, "fc", "")
{'in_features': 7}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import CheckpointError, message, shape_str
from .construct import Slot, key_text, slots

__all__ = ["Shapes", "WithAliases", "checked_layout", "solve_sizes"]

#: sizes -> the shape of every tensor of the layer built with them (on meta)
Shapes = Callable[[Mapping[str, Any]], dict[Slot, torch.Size]]
#: an unknown: (size name, element index for a tuple size, or None)
_Unknown = tuple[str, int | None]


def solve_sizes(
    base: Mapping[str, Any],
    shapes: Shapes,
    found: Mapping[Slot, torch.Size],
    where: str,
    prefix: str,
) -> dict[str, Any]:
    """The sizes (as ``base``'s keys and kinds) that give the checkpoint's ``found`` shapes.

    Args:
        base: the probe value of each inferred size.
        shapes: what tensors the layer has, and their shapes, for given sizes.
        found: the checkpoint's shape of each of the layer's tensors it holds.
        where: the layer, for messages; ``prefix``: its state_dict prefix.

    Raises:
        CheckpointError: a tensor of the wrong rank, a dimension that gives no whole size, or
            no tensor from which a size can be read.
    """
    problem = _Problem(base, shapes, shapes(base), found, where, prefix)
    problem.check_ranks()
    unknowns: list[_Unknown] = [
        (name, index)
        for name, value in base.items()
        for index in (range(len(value)) if isinstance(value, tuple) else (None,))
    ]
    solved = {unknown: problem.solve(unknown) for unknown in unknowns}
    return {
        name: tuple(solved[(name, i)] for i in range(len(value)))
        if isinstance(value, tuple)
        else solved[(name, None)]
        for name, value in base.items()
    }


def _doubled(value: Any, index: int | None = None) -> Any:
    """``value`` twice as large (a tuple: every element, or only the one at ``index``)."""
    if not isinstance(value, tuple):
        return 2 * value
    return tuple(2 * v if index is None or i == index else v for i, v in enumerate(value))


@dataclass(frozen=True)
class _Problem:
    """One layer's checkpoint: what :func:`solve_sizes` knows (see its arguments), and
    ``probed``, the layer's shapes with the probe sizes."""

    base: Mapping[str, Any]
    shapes: Shapes
    probed: dict[Slot, torch.Size]
    found: Mapping[Slot, torch.Size]
    where: str
    prefix: str

    def check_ranks(self) -> None:
        """Refuse a checkpoint tensor whose rank is not the layer's."""
        for key, shape in self.found.items():
            if key not in self.probed or len(self.probed[key]) == len(shape):
                continue
            varied = self.shapes({n: _doubled(v) for n, v in self.base.items()})
            probed = self.probed[key]
            dims = [
                "?" if x != y else str(x)
                for x, y in zip(probed, varied.get(key, probed), strict=True)
            ]
            expected = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
            raise CheckpointError(
                message(
                    self.where,
                    f"'{self.prefix}{key_text(key)}' of shape {expected}",
                    f"shape {shape_str(shape)}",
                    "load a checkpoint saved from this kind of layer and arguments",
                )
            )

    def solve(self, unknown: _Unknown) -> int:
        """One unknown: the first checkpoint dimension that depends on it gives its value."""
        name, index = unknown
        probe = self.base[name] if index is None else self.base[name][index]
        other = self.shapes({**self.base, name: _doubled(self.base[name], index)})
        for key, shape in self.found.items():
            if key not in self.probed or key not in other:
                continue  # this size changes which tensors the layer has
            a, b = self.probed[key], other[key]
            if len(a) != len(shape):
                continue
            dim = next((d for d, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            if dim is None:
                continue
            slope = (b[dim] - a[dim]) / probe
            guess = probe + (shape[dim] - a[dim]) / slope
            if guess != int(guess) or guess < 1:
                raise CheckpointError(
                    message(
                        self.where,
                        f"'{self.prefix}{key_text(key)}' with dimension {dim} giving a whole "
                        f"{name}",
                        f"shape {shape_str(shape)}",
                        "load a checkpoint saved from this kind of layer",
                    )
                )
            return int(guess)
        raise CheckpointError(
            message(
                self.where,
                f"a checkpoint entry from which {name} can be read",
                "entries " + ", ".join(f"'{self.prefix}{key_text(k)}'" for k in self.found),
                "load a checkpoint that has this layer's parameters",
            )
        )


def checked_layout(
    construct: Callable[[Mapping[str, Any]], nn.Module],
    kwargs: Mapping[str, Any],
    sizes: Mapping[str, Any],
    found: Mapping[Slot, torch.Size],
    where: str,
    prefix: str,
) -> nn.Module:
    """The layer ``construct(sizes)`` makes (on meta), checked against the checkpoint's
    shapes ``found``; a :class:`CheckpointError` naming ``where`` if the layer's arguments
    (``kwargs``) refuse those sizes or give other shapes."""
    try:
        shadow = construct(sizes)
    except Exception as error:  # the eager class refuses these sizes with these arguments
        known = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise CheckpointError(
            message(
                where,
                f"a checkpoint whose sizes make a valid layer with its arguments ({known})",
                "a checkpoint giving " + ", ".join(f"{k}={v}" for k, v in sizes.items()),
                "construct the layer with the arguments the checkpoint was saved with",
                outcome="nothing was loaded into this layer",
                detail=str(error),
            )
        ) from error
    expected = {key: t.shape for key, t in slots(shadow).items()}
    wrong = {k: v for k, v in found.items() if tuple(expected[k]) != tuple(v)}
    if wrong:
        known = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise CheckpointError(
            message(
                where,
                "checkpoint shapes that agree with the layer's arguments ("
                + known
                + "): "
                + ", ".join(f"'{prefix}{key_text(k)}' {shape_str(expected[k])}" for k in wrong),
                ", ".join(f"{shape_str(v)}" for v in wrong.values()),
                "construct the layer with the arguments the checkpoint was saved with",
                outcome="nothing was loaded into this layer",
            )
        )
    return shadow


#: the names torch's parametrization tools save a parameter under, with its shape:
#: ``weight_norm``'s ``weight_v`` (``torch.nn.utils``) and ``original1`` (parametrizations),
#: pruning's and the old ``spectral_norm``'s ``weight_orig``, ``parametrize``'s ``original``
_ALIASES = (
    "{name}_v",
    "{name}_orig",
    "parametrizations.{name}.original1",
    "parametrizations.{name}.original",
)


class WithAliases(Mapping[str, Any]):
    """A checkpoint as a build reads it before work queued with ``on_build`` runs: an entry
    missing under its own name (``fc.weight``) is found under the name a parametrization tool
    saves it with, with its shape (``fc.weight_v`` after a queued ``weight_norm``).

    >>> import torch
    >>> view = WithAliases({"fc.weight_v": torch.ones(2, 3), "fc.weight_g": torch.ones(2, 1)})
    >>> tuple(view["fc.weight"].shape), "fc.bias" in view
    ((2, 3), False)
    """

    def __init__(self, state_dict: Mapping[str, Any]) -> None:
        self._entries = state_dict

    def __getitem__(self, key: str) -> Any:
        if key in self._entries:
            return self._entries[key]
        base, _, name = key.rpartition(".")
        prefix = f"{base}." if base else ""
        for alias in _ALIASES:
            other = prefix + alias.format(name=name)
            if other in self._entries:
                return self._entries[other]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
