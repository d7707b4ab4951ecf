"""summary(): a model's layers, shapes and parameter counts, computed on meta.

Data first, rendering second: :func:`summary` returns a frozen :class:`Summary` of
:class:`SummaryRow`; ``str(summary)`` renders it with :func:`render`, a pure function.
Nothing is allocated and the model is not changed (the meta rehearsal restores it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._mixin import is_lazy_module
from ._rehearse import rehearse

__all__ = ["Summary", "SummaryRow", "render", "summary"]

Shape = tuple[tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class SummaryRow:
    """One module: where it is, what it becomes, what it sees, what it holds (own tensors)."""

    path: str
    depth: int
    type: str
    lazy_type: str | None  # the lazy class it was before the build, if any
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    num_parameters: int
    trainable: int
    nbytes: int  # own parameters and buffers


@dataclass(frozen=True)
class Summary:
    """The layers of a model as the build makes them; ``str()`` renders a table.

    Totals count each tensor once (shared weights once), and equal
    ``sum(p.numel() for p in model.parameters())`` of the built model.
    """

    model_type: str
    rows: tuple[SummaryRow, ...]
    total_parameters: int
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    #: lazy layers the examples never reached: their sizes, and so the totals, are unknown
    unreached: tuple[str, ...] = ()

    @property
    def non_trainable_parameters(self) -> int:
        return self.total_parameters - self.trainable_parameters

    def __str__(self) -> str:
        return render(self)


def summary(model: nn.Module, *example_inputs: Any, **example_kwargs: Any) -> Summary:
    """Summarize ``model`` for example inputs, built or not, allocating nothing.

    Args:
        model: any ``nn.Module``; lazy layers are reported with the sizes the examples give.
        *example_inputs, **example_kwargs: as for :func:`lazynn.build`: tensors, shapes,
            :class:`lazynn.Spec`.

    >>> import torch, lazynn
    >>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
    >>> s = lazynn.summary(net, (4, 16))
    >>> s.total_parameters, s.rows[1].type, s.rows[1].outputs[0][0]
    (154, 'Linear', (4, 8))
    >>> lazynn.is_lazy(net)
    True
    """
    lazy_types = {p: type(m).__name__ for p, m in model.named_modules() if is_lazy_module(m)}
    rehearsal = rehearse(model, example_inputs, example_kwargs)
    rows = []
    seen: set[int] = set()
    total = trainable = param_bytes = buffer_bytes = 0
    for path, _ in model.named_modules():
        infos = rehearsal.tensors.get(path, [])
        own = [i for i in infos if i.is_parameter]
        call = rehearsal.calls.get(path)
        rows.append(
            SummaryRow(
                path=path,
                depth=path.count(".") + 1 if path else 0,
                type=rehearsal.types[path],
                lazy_type=lazy_types.get(path),
                inputs=tuple(call.inputs) if call else (),
                outputs=tuple(call.outputs) if call else (),
                parameters=tuple((i.name, i.shape) for i in own),
                num_parameters=sum(i.numel for i in own),
                trainable=sum(i.numel for i in own if i.requires_grad),
                nbytes=sum(i.nbytes for i in infos),
            )
        )
        for info in infos:
            if info.ident in seen:
                continue
            seen.add(info.ident)
            if info.is_parameter:
                total += info.numel
                trainable += info.numel if info.requires_grad else 0
                param_bytes += info.nbytes
            else:
                buffer_bytes += info.nbytes
    root = rehearsal.calls.get("")
    return Summary(
        model_type=type(model).__name__,
        rows=tuple(rows),
        total_parameters=total,
        trainable_parameters=trainable,
        parameter_bytes=param_bytes,
        buffer_bytes=buffer_bytes,
        inputs=tuple(root.inputs) if root else (),
        outputs=tuple(root.outputs) if root else (),
        unreached=tuple(rehearsal.unreached),
    )


# --- rendering ---------------------------------------------------------------------------


def _shape(shapes: tuple[Shape, ...]) -> str:
    if not shapes:
        return "--"
    parts = []
    for dims, dtype in shapes:
        text = "[" + ", ".join(map(str, dims)) + "]"
        if dtype != torch.get_default_dtype():
            text += " " + str(dtype).replace("torch.", "")
        parts.append(text)
    return ", ".join(parts)


def _count(n: int) -> str:
    return f"{n:,}" if n else "--"


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def render(summary: Summary) -> str:
    """The table: one row per module, indented by depth, then the totals.

    A lazy layer's type reads ``LazyLinear -> Linear``: what it is, and what the examples
    build it into.
    """
    header = ("Module (type)", "Input shape", "Output shape", "Param shapes", "Params", "Bytes")
    table = []
    for row in summary.rows:
        kind = f"{row.lazy_type} -> {row.type}" if row.lazy_type else row.type
        if row.lazy_type == row.type:
            kind = f"{row.type}, not called: sizes unknown"
        label = f"{row.path.rsplit('.', 1)[-1]} ({kind})" if row.path else kind
        params = ", ".join(f"{n} [{', '.join(map(str, s))}]" for n, s in row.parameters)
        table.append(
            (
                "  " * row.depth + label,
                _shape(row.inputs),
                _shape(row.outputs),
                params or "--",
                _count(row.num_parameters),
                _bytes(row.nbytes) if row.nbytes else "--",
            )
        )
    widths = [max(len(r[i]) for r in (header, *table)) for i in range(len(header))]
    right = {4, 5}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "=" * len(line(tuple("x" * w for w in widths)))
    total_bytes = summary.parameter_bytes + summary.buffer_bytes
    lines = [
        f"{summary.model_type}: input {_shape(summary.inputs)} -> output {_shape(summary.outputs)}",
        rule,
        line(header),
        rule,
        *(line(r) for r in table),
        rule,
        f"Total params:         {summary.total_parameters:,}",
        f"Trainable params:     {summary.trainable_parameters:,}",
        f"Non-trainable params: {summary.non_trainable_parameters:,}",
        f"Parameter memory:     {_bytes(summary.parameter_bytes)}",
        f"Buffer memory:        {_bytes(summary.buffer_bytes)}",
        f"Total memory:         {_bytes(total_bytes)}",
        rule,
    ]
    if summary.unreached:
        lines += [
            "Not called by the examples, so not counted: "
            + ", ".join(f"'{p}'" for p in summary.unreached),
            rule,
        ]
    return "\n".join(lines)
