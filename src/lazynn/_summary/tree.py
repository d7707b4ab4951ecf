"""The rows as every rendering shows them: a tree of modules, runs of identical consecutive
blocks collapsed into one node (``0-2 (Block) x3``), cut to a depth; and the text of each
node's cells (its label, shapes, counts).

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
>>> root = tree(lazynn.summary(net, (4, 16)).rows, expand=False)
>>> [label(node, indent=True) for node, _, _ in visible(root, depth=1)]
['Sequential', '  0 (LazyLinear -> Linear)', '  1 (ReLU)', '  2 (LazyLinear -> Linear)']
>>> cells(root.children[0], hidden=False, columns=("output", "params"))
{'output': '[4, 8]', 'params': '136'}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._module.tensors import byte_size
from .report import Shape, SummaryRow, dtype_name

__all__ = [
    "COLUMNS",
    "Node",
    "cells",
    "ends",
    "label",
    "label_parts",
    "shape_text",
    "shape_texts",
    "si",
    "tree",
    "visible",
    "walk",
]

#: the columns a rendering can show, and their headers
COLUMNS = {
    "input": "Input shape",
    "output": "Output shape",
    "params": "Params",
    "param_shapes": "Param shapes",
    "param_bytes": "Param bytes",
    "buffer_bytes": "Buffer bytes",
    "flops": "FLOPs",
    "calls": "Calls",
}


@dataclass
class Node:
    """A row, the rows under it, and, for a run of identical consecutive blocks collapsed
    into it, how many blocks it stands for and the last one's name."""

    row: SummaryRow
    children: list[Node] = field(default_factory=list)
    count: int = 1
    last: str = ""

    def name(self) -> str:
        own = self.row.path.rsplit(".", 1)[-1]
        return f"{own}-{self.last}" if self.count > 1 else own

    def path(self) -> str:
        return f"{self.row.path}-{self.last}" if self.count > 1 else self.row.path


def _signature(node: Node) -> Any:
    r = node.row
    own = (r.type, r.lazy_type, r.inputs, r.outputs, r.parameters, r.calls, r.flops, r.tied)
    sizes = (r.num_parameters, r.trainable_parameters, r.parameter_bytes, r.buffer_bytes)
    return (
        own,
        sizes,
        tuple((c.row.path.rsplit(".", 1)[-1], _signature(c)) for c in node.children),
    )


def tree(rows: Sequence[SummaryRow], expand: bool) -> Node:
    """The rows as a tree (the model's row its root); unless ``expand``, each run of identical
    consecutive blocks is one node."""
    nodes = {row.path: Node(row) for row in rows}
    for row in rows[1:]:
        parent = row.path.rsplit(".", 1)[0] if "." in row.path else ""
        nodes[parent].children.append(nodes[row.path])
    root = nodes[rows[0].path]
    if not expand:
        _collapse(root)
    return root


def _collapse(node: Node) -> None:
    for child in node.children:
        _collapse(child)
    runs: list[Node] = []
    for child in node.children:
        previous = runs[-1] if runs else None
        if (
            previous is not None
            and child.children  # blocks, not single layers (ReLU, ReLU stay apart)
            and _signature(previous) == _signature(child)
            and not child.row.tied
        ):
            previous.count += 1
            previous.last = child.row.path.rsplit(".", 1)[-1]
            continue
        runs.append(child)
    node.children = runs


def walk(node: Node) -> list[Node]:
    """``node`` and every node under it, depth first."""
    return [node, *(n for c in node.children for n in walk(c))]


def visible(root: Node, depth: int) -> list[tuple[Node, bool, int]]:
    """(node, whether its submodules are hidden, how many blocks it stands for with its
    collapsed ancestors) for each row shown at ``depth``."""
    out: list[tuple[Node, bool, int]] = []

    def visit(node: Node, times: int) -> None:
        hidden = bool(node.children) and node.row.depth >= depth
        out.append((node, hidden, times))
        if not hidden:
            for child in node.children:
                visit(child, times)

    visit(root, 1)
    return out


def _flops(node: Node) -> int:
    """A row's FLOPs: its calls', or for a container never called itself (a ModuleList),
    its submodules' (per block)."""
    if node.row.calls or not node.children:
        return node.row.flops
    return sum(_flops(child) * child.count for child in node.children)


def _subtree(node: Node) -> tuple[int, int, int]:
    """(params, param bytes, buffer bytes) of ``node`` and everything below it, per block."""
    row = node.row
    params, pbytes, bbytes = row.num_parameters, row.parameter_bytes, row.buffer_bytes
    for child in node.children:
        p, pb, bb = _subtree(child)
        params, pbytes, bbytes = (
            params + p * child.count,
            pbytes + pb * child.count,
            bbytes + bb * child.count,
        )
    return params, pbytes, bbytes


def ends(
    node: Node, order: dict[str, int] | None = None
) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    """The shapes a row receives and gives; for a container never called itself (a
    ModuleList), those of the first and the last of its modules that ran (in ``order``, the
    order of their first calls, by path; else in the model's)."""
    if node.row.calls or not node.children:
        return node.row.inputs, node.row.outputs
    ran = [child for child in node.children if any(n.row.calls for n in walk(child))]
    if order is not None:
        ran.sort(key=lambda child: min(order.get(n.row.path, len(order)) for n in walk(child)))
    if not ran:
        return (), ()
    return ends(ran[0], order)[0], ends(ran[-1], order)[1]


# --- cells ------------------------------------------------------------------------------------


def shape_texts(shapes: tuple[Shape, ...]) -> list[str]:
    """Each shape as the table writes it: ``[2, 3]``, with its dtype when it is not the
    default one (``[2, 7] int64``)."""
    parts = []
    for dims, dtype in shapes:
        text = "[" + ", ".join(map(str, dims)) + "]"
        if dtype != torch.get_default_dtype():
            text += " " + dtype_name(dtype)
        parts.append(text)
    return parts


def shape_text(shapes: tuple[Shape, ...]) -> str:
    """The shapes, apart by commas; ``--`` for none."""
    return ", ".join(shape_texts(shapes)) or "--"


def _count(n: int) -> str:
    return f"{n:,}" if n else "--"


def si(n: int) -> str:
    """1234567 -> '1.2M' (FLOPs)."""
    if not n:
        return "--"
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if value < 1000 or unit == "P":
            return f"{value:.0f}" if not unit else f"{value:.1f}{unit}"
        value /= 1000
    return str(n)  # pragma: no cover


def _kind(row: SummaryRow) -> str:
    if row.lazy_type == row.type:
        return f"{row.type}, not called: sizes unknown"
    return f"{row.lazy_type} -> {row.type}" if row.lazy_type else row.type


def cells(node: Node, hidden: bool, columns: Sequence[str]) -> dict[str, str]:
    """The text of each of ``columns`` for ``node`` (``hidden``: its submodules are not
    shown, so it counts theirs)."""
    row, n = node.row, node.count
    params, pbytes, bbytes = (
        _subtree(node)
        if hidden or n > 1
        else (
            row.num_parameters,
            row.parameter_bytes,
            row.buffer_bytes,
        )
    )
    mark = "*" if row.tied else ""
    values = {
        "input": shape_text(row.inputs),
        "output": shape_text(row.outputs),
        "params": _count(params * n) + mark if params or mark else "--",
        "param_shapes": ", ".join(f"{k} [{', '.join(map(str, s))}]" for k, s in row.parameters)
        or "--",
        "param_bytes": byte_size(pbytes * n) if pbytes else "--",
        "buffer_bytes": byte_size(bbytes * n) if bbytes else "--",
        "flops": si(_flops(node) * n),
        "calls": str(row.calls) if row.calls != 1 else "",
    }
    return {c: values[c] for c in columns}


def label_parts(node: Node, indent: bool) -> tuple[str, str, str]:
    """A row's label in three parts: what comes before its type (the indentation and its
    name), its type (``LazyLinear -> Linear``), and the marks after it (``x3``, ``[4 calls]``,
    ``!``): a label cut to fit keeps the first and the last, cutting the type."""
    row = node.row
    name = (node.name() if indent else node.path()) if row.path else ""
    head, kind, tail = (f"{name} (", _kind(row), ")") if name else ("", _kind(row), "")
    if node.count > 1:
        tail += f" x{node.count}"
    if row.calls > 1:
        tail += f" [{row.calls} calls]"
    if row.note:
        tail += " !"
    return ("  " * row.depth + head if indent else head), kind, tail


def label(node: Node, indent: bool) -> str:
    """A row's label: ``  fc1 (LazyLinear -> Linear)``, indented by its depth if ``indent``,
    or named by its full path."""
    return "".join(label_parts(node, indent))
