"""The summary's data: frozen rows (:class:`SummaryRow`) and totals (:class:`Report`), and
their JSON-ready form (``to_dict()``). Nothing here renders: ``render.py`` does, and
:class:`lazynn.Summary` (``summary.py``) is a :class:`Report` with its renderings.

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
>>> report = lazynn.summary(net, (4, 16))
>>> report.to_dict()["rows"][1]["num_parameters"], report.to_dict()["total_flops"]
(136, 1152)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch

from .memory import Memory

__all__ = ["Dim", "Report", "Shape", "SummaryRow", "as_json", "dtype_name"]

#: a dimension: a size, or a symbolic batch such as "B" (or "2B")
Dim = int | str


class Shape(NamedTuple):
    """A tensor's shape and dtype, as a module took or returned it."""

    shape: tuple[Dim, ...]
    dtype: torch.dtype


#: a field's metadata: its value, ``(name, value)`` pairs, is a JSON object
_MAPPING = {"json": "object"}


@dataclass(frozen=True)
class SummaryRow:
    """One module: where it is, what it becomes, what it sees, what it holds.

    Counts are its own tensors (not its submodules'); a tensor tied to one listed earlier
    (``tied``) is counted there, so the rows add up to the totals. ``flops`` are those of all
    its calls, its submodules' included. ``to_dict()`` has one key per field, named as the
    field (docs/summary.md, JSON).

    Attributes:
        path: the module's path in the model (``"blocks.0.fc1"``); ``""`` for the model.
        depth: how deep it is: 0 for the model, 1 for its children, and so on.
        type: its class name once built (``"Linear"``).
        lazy_type: its lazy class name before the build (``"LazyLinear"``), or None if it
            was not lazy; equal to ``type`` for a lazy layer the examples never reached.
        inputs: the ``shape`` and ``dtype`` of each tensor its first call took (a named
            tuple); a dimension is a size, or, with a symbolic batch, the batch's name
            (``"B"``, or ``"2B"`` for twice the batch).
        outputs: the ``shape`` and ``dtype`` of each tensor its first call returned.
        parameters: the ``(name, shape)`` of each of its own parameters, tied ones
            included.
        num_parameters: how many values its own parameters hold (elements), each tensor
            counted once in the model (a tied one where it is first listed).
        trainable_parameters: of those, the values of parameters with ``requires_grad``
            (elements).
        parameter_bytes: the bytes of those parameters (``numel * element_size``).
        buffer_bytes: the bytes of its own buffers, counted as its parameters are.
        calls: how many times the examples called it (0: never reached).
        flops: the FLOPs of all its calls, its submodules' included, as
            ``torch.utils.flop_counter.FlopCounterMode`` counts them (a multiply-add is 2);
            per sample with a symbolic batch.
        tied: ``(own name, path of the tensor it is)`` for each of its tensors that is
            one listed earlier (counted there).
        note: why a size this lazy layer read may not be the one meant, with the fix (the
            table marks it ``!``); ``""`` if none.

    >>> import torch, lazynn
    >>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU())
    >>> row = lazynn.summary(net, (4, 16)).rows[1]
    >>> row.path, row.lazy_type, row.type, row.outputs[0].shape, row.parameters
    ('0', 'LazyLinear', 'Linear', (4, 8), (('weight', (8, 16)), ('bias', (8,))))
    >>> row.num_parameters, row.parameter_bytes, row.to_dict()["parameters"]
    (136, 544, {'weight': [8, 16], 'bias': [8]})
    """

    path: str
    depth: int
    type: str
    lazy_type: str | None
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = field(metadata=_MAPPING)
    num_parameters: int
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    calls: int = 1
    flops: int = 0
    tied: tuple[tuple[str, str], ...] = field(default=(), metadata=_MAPPING)
    note: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes of its own parameters and buffers."""
        return self.parameter_bytes + self.buffer_bytes

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values: one key per field, named as the field (tuples as
        lists, dtypes as names, ``parameters`` and ``tied`` as objects)."""
        return as_json(self)


@dataclass(frozen=True)
class Report:
    """The layers of a model as the build makes them, as data (``lazynn.Summary`` is this
    with its renderings, and documents the fields).

    Totals count each tensor once (shared weights once), and equal
    ``sum(p.numel() for p in model.parameters())`` of the built model. ``total_flops`` is what
    ``torch.utils.flop_counter.FlopCounterMode`` counts for one forward of the examples.
    """

    model_type: str
    rows: tuple[SummaryRow, ...]
    total_parameters: int
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    unreached: tuple[str, ...] = ()
    total_flops: int = 0
    mode: str = "train"
    batch: str | None = None
    memory: Memory | None = None
    #: the paths of the modules the examples called, in the order of their first calls
    call_order: tuple[str, ...] = ()

    @property
    def non_trainable_parameters(self) -> int:
        """``total_parameters - trainable_parameters``."""
        return self.total_parameters - self.trainable_parameters

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready values, one key per field, named as the field (tuples as
        lists, dtypes as names, each row its ``to_dict()``): ``json.dumps(summary.to_dict())``
        works, and is ``render(format="json")``."""
        return as_json(self)


def as_json(record: SummaryRow | Report) -> dict[str, Any]:
    """``record``'s fields as JSON-ready values, one key per field and named as it: the JSON
    format is the dataclass, field by field. Tuples become lists, dtypes their names
    (``"float32"``), a :class:`Shape` ``{"shape": [...], "dtype": "float32"}``, rows and the
    memory estimate their own ``to_dict()``, and a field of ``(name, value)`` pairs
    (``parameters``, ``tied``) an object."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.metadata.get("json") == "object":
            out[f.name] = {name: _plain(v) for name, v in value}
        else:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, Shape):
        return {"shape": _plain(value.shape), "dtype": _plain(value.dtype)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if hasattr(value, "to_dict"):  # a row, the memory estimate
        return value.to_dict()
    return value


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).replace("torch.", "")
