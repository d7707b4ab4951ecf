"""The summary's renderings: the text table, markdown, JSON and DOT (a picture, ``graph.py``)
of a :class:`Report`.

The table fits a screen by default: identical consecutive blocks (a transformer's 24 blocks, a
ResNet stage's bottlenecks) collapse into one row with a count, ``blocks.1-23 (Block) x23``,
and the depth is the deepest that fits in :data:`SCREEN_ROWS` rows (``depth=`` to choose,
``expand=True`` to list every block). A row whose submodules are hidden shows their totals.
The DOT graph shows the same rows, as boxes.

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
>>> print(render(lazynn.summary(net, (4, 16)), format="markdown").splitlines()[3])
| 0 (LazyLinear -> Linear) | [4, 16] | [4, 8] | 136 | 1.0K |
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._errors import ArgumentError, message
from .._module.tensors import byte_size
from .graph import Box, dot
from .report import Report, Shape, SummaryRow, dtype_name

__all__ = ["COLUMNS", "FORMATS", "SCREEN_ROWS", "render"]

#: the table's rows at most, by default: the depth shown is the deepest that fits
SCREEN_ROWS = 40
#: the columns :func:`render` can show, and their headers
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
_DEFAULT_COLUMNS = ("input", "output", "params", "flops")
#: the formats :func:`render` writes
FORMATS = ("table", "markdown", "json", "dot")
_RIGHT = {"params", "param_bytes", "buffer_bytes", "flops", "calls"}


def render(
    report: Report,
    format: str = "table",
    depth: int | None = None,
    expand: bool = False,
    width: int | None = 100,
    columns: Sequence[str] | None = None,
) -> str:
    """``report`` as ``format``: ``"table"`` (text), ``"markdown"``, ``"json"`` or ``"dot"``
    (see :meth:`lazynn.Summary.render` for the arguments)."""
    if format == "json":
        return json.dumps(report.to_dict(), indent=2)
    if format not in FORMATS:
        fix = (
            f"Graphviz draws an image from format='dot': dot -T{format}, or graphviz.Source(text) "
            f"in a notebook; the command line's --format {format} runs dot"
            if format in ("svg", "png", "pdf")
            else "pass one of them: format='dot' for the picture's source"
        )
        raise ArgumentError(
            message(
                "Summary.render",
                "format: 'table', 'markdown', 'json' or 'dot'",
                f"format={format!r}",
                fix,
            )
        )
    chosen = tuple(columns) if columns is not None else _DEFAULT_COLUMNS
    unknown = [c for c in chosen if c not in COLUMNS]
    if unknown:
        raise ArgumentError(
            message(
                "Summary.render",
                f"columns: some of {list(COLUMNS)}",
                f"unknown columns {unknown}",
                "name columns from that list, or pass columns=None for the default ones",
            )
        )
    if depth is not None and depth < 0:
        raise ArgumentError(
            message(
                "Summary.render",
                "depth: an integer of 0 or more (0: the model's own row)",
                f"depth={depth}",
                "pass depth=None for every level, or a level of 0 or more",
            )
        )
    tree = _tree(report.rows, expand)
    deepest = max((n.row.depth for n in _walk(tree)), default=0)
    if depth is None:
        depth = deepest
        while depth > 1 and len(_visible(tree, depth)) > SCREEN_ROWS:
            depth -= 1
    shown = _visible(tree, depth)
    if format == "markdown":
        return _markdown(report, shown, chosen)
    if format == "dot":
        return _dot(report, tree, shown, chosen)
    return _table(report, shown, chosen, width, depth, deepest)


# --- the tree of rows, with runs of identical blocks collapsed ---------------------------------


@dataclass
class _Node:
    row: SummaryRow
    children: list[_Node] = field(default_factory=list)
    #: how many identical consecutive blocks this node stands for, and the last one's name
    count: int = 1
    last: str = ""

    def name(self) -> str:
        own = self.row.path.rsplit(".", 1)[-1]
        return f"{own}-{self.last}" if self.count > 1 else own

    def path(self) -> str:
        return f"{self.row.path}-{self.last}" if self.count > 1 else self.row.path


def _signature(node: _Node) -> Any:
    r = node.row
    own = (r.type, r.lazy_type, r.inputs, r.outputs, r.parameters, r.calls, r.flops, r.tied)
    sizes = (r.num_parameters, r.trainable_parameters, r.parameter_bytes, r.buffer_bytes)
    return (
        own,
        sizes,
        tuple((c.row.path.rsplit(".", 1)[-1], _signature(c)) for c in node.children),
    )


def _tree(rows: Sequence[SummaryRow], expand: bool) -> _Node:
    nodes = {row.path: _Node(row) for row in rows}
    for row in rows[1:]:
        parent = row.path.rsplit(".", 1)[0] if "." in row.path else ""
        nodes[parent].children.append(nodes[row.path])
    root = nodes[rows[0].path]
    if not expand:
        _collapse(root)
    return root


def _collapse(node: _Node) -> None:
    for child in node.children:
        _collapse(child)
    runs: list[_Node] = []
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


def _walk(node: _Node) -> list[_Node]:
    return [node, *(n for c in node.children for n in _walk(c))]


def _visible(root: _Node, depth: int) -> list[tuple[_Node, bool, int]]:
    """(node, whether its submodules are hidden, how many blocks it stands for with its
    collapsed ancestors) for each row shown at ``depth``."""
    out: list[tuple[_Node, bool, int]] = []

    def visit(node: _Node, times: int) -> None:
        hidden = bool(node.children) and node.row.depth >= depth
        out.append((node, hidden, times))
        if not hidden:
            for child in node.children:
                visit(child, times)

    visit(root, 1)
    return out


def _flops(node: _Node) -> int:
    """A row's FLOPs: its calls', or for a container never called itself (a ModuleList),
    its submodules' (per block)."""
    if node.row.calls or not node.children:
        return node.row.flops
    return sum(_flops(child) * child.count for child in node.children)


def _subtree(node: _Node) -> tuple[int, int, int]:
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


# --- cells ------------------------------------------------------------------------------------


def _shape(shapes: tuple[Shape, ...]) -> str:
    if not shapes:
        return "--"
    parts = []
    for dims, dtype in shapes:
        text = "[" + ", ".join(map(str, dims)) + "]"
        if dtype != torch.get_default_dtype():
            text += " " + dtype_name(dtype)
        parts.append(text)
    return ", ".join(parts)


def _count(n: int) -> str:
    return f"{n:,}" if n else "--"


def _si(n: int) -> str:
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


def _cells(node: _Node, hidden: bool, columns: Sequence[str]) -> dict[str, str]:
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
        "input": _shape(row.inputs),
        "output": _shape(row.outputs),
        "params": _count(params * n) + mark if params or mark else "--",
        "param_shapes": ", ".join(f"{k} [{', '.join(map(str, s))}]" for k, s in row.parameters)
        or "--",
        "param_bytes": byte_size(pbytes * n) if pbytes else "--",
        "buffer_bytes": byte_size(bbytes * n) if bbytes else "--",
        "flops": _si(_flops(node) * n),
        "calls": str(row.calls) if row.calls != 1 else "",
    }
    return {c: values[c] for c in columns}


def _label(node: _Node, indent: bool) -> str:
    row = node.row
    name = (node.name() if indent else node.path()) if row.path else ""
    text = f"{name} ({_kind(row)})" if name else _kind(row)
    if node.count > 1:
        text += f" x{node.count}"
    if row.calls > 1:
        text += f" [{row.calls} calls]"
    if row.note:
        text += " !"
    return ("  " * row.depth + text) if indent else text


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 1)] + "..."


def _notes(
    summary: Report, shown: list[tuple[_Node, bool, int]], depth: int, deepest: int
) -> list[str]:
    notes = [f"! {row.note}" for row in summary.rows if row.note]  # (hidden rows' too)
    tied = [(n.row.path, name, owner) for n, _, _ in shown for name, owner in n.row.tied]
    for path, name, owner in tied:
        notes.append(f"* {path}.{name} is {owner}: counted once, there")
    if any(n.count > 1 for n, _, _ in shown):
        notes.append(
            "xN: N identical consecutive blocks in one row (totals for all N; the rows under "
            "it show one block); expand=True / --expand lists each"
        )
    if depth < deepest:
        notes.append(
            f"Depth {depth} of {deepest} shown (a row with hidden submodules counts them); "
            "depth= / --depth N for more"
        )
    if summary.batch is not None:
        notes.append(
            f"{summary.batch}: the batch dimension; FLOPs are per sample ({summary.batch}=1)"
        )
    return notes


def _totals(summary: Report) -> list[str]:
    total_bytes = summary.parameter_bytes + summary.buffer_bytes
    lines = [
        f"Total params:         {summary.total_parameters:,}",
        f"Trainable params:     {summary.trainable_parameters:,}",
        f"Non-trainable params: {summary.non_trainable_parameters:,}",
        f"Total FLOPs:          {summary.total_flops:,} ({_si(summary.total_flops)}, "
        + f"{summary.mode} mode{', per sample' if summary.batch else ''})",
        f"Parameter memory:     {byte_size(summary.parameter_bytes)}",
        f"Buffer memory:        {byte_size(summary.buffer_bytes)}",
        f"Total memory:         {byte_size(total_bytes)}",
    ]
    memory = summary.memory
    if memory is not None:
        lines += [
            f"Training memory ({memory.optimizer}, on meta{', per sample' * bool(summary.batch)}):",
            f"  parameters          {byte_size(memory.params)}",
            f"  gradients           {byte_size(memory.gradients)}",
            f"  optimizer states    {byte_size(memory.optimizer_states)}",
            f"  activations         {byte_size(memory.activations)}",
            f"  total               {byte_size(memory.total)}",
        ]
    return lines


def _table(
    summary: Report,
    shown: list[tuple[_Node, bool, int]],
    columns: Sequence[str],
    width: int | None,
    depth: int,
    deepest: int,
) -> str:
    header = ("Module (type)", *(COLUMNS[c] for c in columns))
    body = [(_label(n, True), *_cells(n, hidden, columns).values()) for n, hidden, _ in shown]
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
    if width is not None:  # cut the text columns, widest first, until the lines fit
        text = [0] + [i + 1 for i, c in enumerate(columns) if c not in _RIGHT]
        while sum(widths) + 2 * (len(widths) - 1) > width:
            widest = max(text, key=lambda i: widths[i])
            if widths[widest] <= 12:
                break
            widths[widest] -= 1
    right = {i + 1 for i, c in enumerate(columns) if c in _RIGHT}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            _cut(c, w).rjust(w) if i in right else _cut(c, w).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "=" * (sum(widths) + 2 * (len(widths) - 1))
    title = (
        f"{summary.model_type}: input {_shape(summary.inputs)} -> output {_shape(summary.outputs)}"
    )
    lines = [_cut(title, len(rule)), rule, line(header), rule, *(line(r) for r in body), rule]
    lines += _totals(summary)
    lines.append(rule)
    notes = _notes(summary, shown, depth, deepest)
    if summary.unreached:
        notes.append(
            "Not called by the examples, so not counted: "
            + ", ".join(f"'{p}'" for p in summary.unreached)
        )
    if notes:
        fill = max(len(rule), 60)
        lines += [textwrap.fill(n, fill, subsequent_indent="  ") for n in notes]
        lines.append(rule)
    return "\n".join(lines)


def _markdown(summary: Report, shown: list[tuple[_Node, bool, int]], columns: Sequence[str]) -> str:
    header = ("Module (type)", *(COLUMNS[c] for c in columns))
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for node, hidden, _ in shown:
        cells = (_label(node, False), *_cells(node, hidden, columns).values())
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", *(f"- {t.strip()}" for t in _totals(summary))]
    lines += [f"- {row.note}" for row in summary.rows if row.note]
    return "\n".join(lines)


def _dot(
    summary: Report, root: _Node, shown: list[tuple[_Node, bool, int]], columns: Sequence[str]
) -> str:
    """The rows shown as a DOT graph: a box per row (a row with rows shown under it frames
    them), its label the table's, its figures those of ``columns`` but the shapes, which are
    on the edges."""
    hidden = {id(node): is_hidden for node, is_hidden, _ in shown}
    figures = [c for c in columns if c not in ("input", "output")]

    def box(node: _Node) -> Box:
        cells = _cells(node, hidden[id(node)], figures)
        said = ", ".join(f"{COLUMNS[c]}: {v}" for c, v in cells.items() if v not in ("--", ""))
        label = _label(node, True)[2 * node.row.depth :]  # (its name as the table's, unindented)
        inside = () if hidden[id(node)] else tuple(box(child) for child in node.children)
        inputs, outputs = _ends(node)
        ran = any(n.row.calls for n in _walk(node))
        tied = [f"* {name} is {owner}, counted there" for name, owner in node.row.tied]
        return Box(
            label="\n".join([label, *([said] if said else []), *tied]),
            path=node.path(),
            inputs=_shape(inputs),
            outputs=_shape(outputs),
            on_path=node.row.calls == 1 or (not node.row.calls and ran),
            ran=ran,
            lazy=node.row.lazy_type not in (None, node.row.type),
            children=inside,
        )

    total = f"{summary.total_parameters:,} params, {_si(summary.total_flops)} FLOPs"
    per_sample = f", per sample: {summary.batch}=1" if summary.batch else ""
    title = f"{summary.model_type}: {total} ({summary.mode} mode{per_sample})"
    inputs, outputs = _shape(summary.inputs), _shape(summary.outputs)
    return dot(summary.model_type, title, inputs, outputs, box(root))


def _ends(node: _Node) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    """The shapes a row receives and gives; for a container never called itself (a
    ModuleList), those of the first and the last of its modules that ran (called in turn)."""
    if node.row.calls or not node.children:
        return node.row.inputs, node.row.outputs
    ran = [child for child in node.children if any(n.row.calls for n in _walk(child))]
    if not ran:
        return (), ()
    return _ends(ran[0])[0], _ends(ran[-1])[1]
