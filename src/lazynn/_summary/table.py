"""The summary as a table of text (and as a markdown table): a row per module shown, the
totals, and notes under them.

The table fits a width: by default the terminal's when it prints to one (at least
:data:`MIN_WIDTH`), :data:`WIDTH` otherwise (a file, a pipe, a doctest), so that what is
compared as text does not depend on the terminal. To fit, shapes are shortened first (identical
shapes written once, ``[2, 64, 32] x3``, then cut), then the names' types, each keeping the
module's name and its marks; a note under the table says what was cut. Notes that differ only
by the module they are about are one note, naming each.

>>> import lazynn
>>> from torch import nn
>>> class Attend(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
...     def forward(self, x):
...         return self.attention(x, x, x)[0]
>>> report = lazynn.summary(Attend(), (2, 10, 16))
>>> print(report.render(width=90, columns=("input", "output", "params")))  # doctest: +ELLIPSIS
Attend: input [2, 10, 16] -> output [2, 10, 16]
========================================================================================
Module (type)                                   Input shape     Output shape      Params
========================================================================================
Attend                                          [2, 10, 16]     [2, 10, 16]           --
  attention (MultiheadAttention)                [2, 10, 16] x3  [2, 10, 16], ...     816
    out_proj (NonDynamicallyQuantizableLinear)  --              --                   272
========================================================================================
...
...: shapes cut to fit 90 columns; width= / --width N for more (None / 0: no limit)
========================================================================================
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from itertools import groupby

from .._module.tensors import byte_size
from .report import Report, SummaryRow
from .tree import COLUMNS, Node, cells, label, label_parts, shape_text, si

__all__ = ["MIN_WIDTH", "WIDTH", "markdown", "notes_of", "table", "terminal_width"]

#: the table's width when it is not printed to a terminal (a file, a pipe, a doctest, pytest)
WIDTH = 100
#: the narrowest the table is made for a terminal, however narrow the terminal
MIN_WIDTH = 80
#: the narrowest a column is cut to (or its header's width)
_FLOOR = 12
_RIGHT = {"params", "param_bytes", "buffer_bytes", "flops", "calls"}
_SHAPES = {"input", "output", "param_shapes"}


def terminal_width() -> int:
    """The table's width by default: the terminal's (``shutil.get_terminal_size``, at least
    :data:`MIN_WIDTH`) when stdout is a terminal; :data:`WIDTH` otherwise."""
    try:
        to_terminal = sys.stdout is not None and sys.stdout.isatty()
    except (AttributeError, ValueError):  # (a stand-in stream, a closed one)
        to_terminal = False
    if not to_terminal:
        return WIDTH
    return max(shutil.get_terminal_size((WIDTH, 24)).columns, MIN_WIDTH)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 1)] + "..."


def _shapes_fit(text: str, width: int, cut: bool = True) -> str:
    """A cell of shapes in ``width``: as it is, or with runs of identical shapes written once
    (``[2, 64, 32] x3``), or (unless not ``cut``) that cut with ``...``: after its first
    shapes where they fit (``[2, 64, 32], ...``)."""
    if len(text) <= width:
        return text
    first, *rest = text.split(", [")
    shapes = [first, *("[" + shape for shape in rest)]
    runs = [shape if n == 1 else f"{shape} x{n}" for shape, n in _runs(shapes)]
    compact = ", ".join(runs)
    if not cut or len(compact) <= width:
        return compact
    whole = [", ".join(runs[:i]) + ", ..." for i in range(len(runs) - 1, 0, -1)]
    return next((text for text in whole if len(text) <= width), _cut(compact, width))


def _runs(shapes: list[str]) -> list[tuple[str, int]]:
    return [(shape, len(list(run))) for shape, run in groupby(shapes)]


def _label_fit(node: Node, width: int) -> str:
    """A row's label in ``width``: its type cut, its indentation, name and marks kept (all
    cut, if even they do not fit)."""
    head, kind, tail = label_parts(node, indent=True)
    whole = head + kind + tail
    room = width - len(head) - len(tail)
    if len(whole) <= width or room < 4:
        return _cut(whole, width)
    return head + _cut(kind, room) + tail


def _widths(
    header: Sequence[str], body: Sequence[Sequence[str]], columns: Sequence[str], width: int | None
) -> list[int]:
    """Each column's width: as wide as its widest cell, then, to fit ``width``, the columns of
    shapes narrowed (the widest first) to their identical shapes written once, then down to 12,
    then the names down to 13 (their header's width)."""
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
    if width is None:
        return widths
    shapes = [i + 1 for i, c in enumerate(columns) if c in _SHAPES]
    compact = {i: max(len(_shapes_fit(r[i], 0, cut=False)) for r in body) for i in shapes}
    stages = [
        {i: max(compact[i], len(header[i])) for i in shapes},
        {i: max(_FLOOR, len(header[i])) for i in shapes},
        {0: max(_FLOOR, len(header[0]))},
    ]
    for floors in stages:
        narrowed = [i for i in floors if widths[i] > floors[i]]
        while narrowed and sum(widths) + 2 * (len(widths) - 1) > width:
            widest = max(narrowed, key=lambda i: widths[i])
            widths[widest] -= 1
            narrowed = [i for i in narrowed if widths[i] > floors[i]]
        for i in shapes:  # (no wider than its cells as they are then written)
            written = (len(_shapes_fit(r[i], widths[i])) for r in (header, *body))
            widths[i] = max(written)
    return widths


def table(
    summary: Report,
    shown: list[tuple[Node, bool, int]],
    columns: Sequence[str],
    width: int | None,
    depth: int,
    deepest: int,
) -> str:
    """The text table of the rows ``shown`` (``depth`` of ``deepest`` levels), its lines cut
    to ``width`` as far as the floors allow (None: not cut)."""
    header = ("Module (type)", *(COLUMNS[c] for c in columns))
    body = [(label(n, True), *cells(n, hidden, columns).values()) for n, hidden, _ in shown]
    widths = _widths(header, body, columns, width)
    right = {i + 1 for i, c in enumerate(columns) if c in _RIGHT}
    cut: set[str] = set()

    def fit(i: int, text: str, node: Node | None) -> str:
        if len(text) <= widths[i]:
            return text
        if i == 0:
            cut.add("names")
            return _label_fit(node, widths[i]) if node is not None else _cut(text, widths[i])
        fitted = _shapes_fit(text, widths[i])  # (only names and shapes are narrowed)
        if fitted.endswith("..."):  # (not when identical shapes written once fit)
            cut.add("shapes")
        return fitted

    def line(cells: Sequence[str], node: Node | None = None) -> str:
        texts = [fit(i, c, node) for i, c in enumerate(cells)]
        return "  ".join(
            t.rjust(w) if i in right else t.ljust(w)
            for i, (t, w) in enumerate(zip(texts, widths, strict=True))
        ).rstrip()

    rule = "=" * (sum(widths) + 2 * (len(widths) - 1))
    rows = [line(r, n) for r, (n, _, _) in zip(body, shown, strict=True)]
    heading = line(header)
    inputs, outputs = shape_text(summary.inputs), shape_text(summary.outputs)
    title = f"{summary.model_type}: input {inputs} -> output {outputs}"
    room = max(len(rule), width) if width is not None else len(title)
    if len(title) > room:
        inputs, outputs = (_shapes_fit(text, 0, cut=False) for text in (inputs, outputs))
        title = f"{summary.model_type}: input {inputs} -> output {outputs}"
        if len(title) > room:
            cut.add("shapes")
    lines = [_cut(title, room), rule, heading, rule, *rows, rule]
    lines += _totals(summary)
    lines.append(rule)
    notes = _notes(summary, shown, depth, deepest)
    if cut and width is not None:
        what = " and ".join(sorted(cut))
        notes.append(
            f"...: {what} cut to fit {width} columns; width= / --width N for more "
            "(None / 0: no limit)"
        )
    if notes:
        fill = max(len(rule), 60)
        lines += [textwrap.fill(n, fill, subsequent_indent="  ") for n in notes]
        lines.append(rule)
    return "\n".join(lines)


def notes_of(rows: Sequence[SummaryRow]) -> list[str]:
    """The rows' notes, each once: notes that differ only by the path of the module they are
    about (``LazyConv2d at 'a.conv' reads ...``) are one note naming each module
    (``LazyConv2d at 'a.conv', 'b.conv' and 'c.conv' reads ...``)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if not row.note:
            continue
        quoted = f"'{row.path}'"
        key = row.note.replace(quoted, "\0") if row.path and quoted in row.note else row.note
        groups.setdefault(key, []).append(quoted)
    out = []
    for key, paths in groups.items():
        named = paths[0] if len(paths) == 1 else ", ".join(paths[:-1]) + " and " + paths[-1]
        out.append(key.replace("\0", named))
    return out


def _notes(
    summary: Report, shown: list[tuple[Node, bool, int]], depth: int, deepest: int
) -> list[str]:
    notes = [f"! {note}" for note in notes_of(summary.rows)]  # (hidden rows' too)
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
    if summary.unreached:
        notes.append(
            "Not called by the examples, so not counted: "
            + ", ".join(f"'{p}'" for p in summary.unreached)
        )
    return notes


def _totals(summary: Report) -> list[str]:
    total_bytes = summary.parameter_bytes + summary.buffer_bytes
    lines = [
        f"Total params:         {summary.total_parameters:,}",
        f"Trainable params:     {summary.trainable_parameters:,}",
        f"Non-trainable params: {summary.non_trainable_parameters:,}",
        f"Total FLOPs:          {summary.total_flops:,} ({si(summary.total_flops)}, "
        + f"{summary.mode} mode{', per sample' if summary.batch else ''})",
        f"Parameter memory:     {byte_size(summary.parameter_bytes)}",
        f"Buffer memory:        {byte_size(summary.buffer_bytes)}",
        f"Total memory:         {byte_size(total_bytes)}",
    ]
    memory = summary.memory
    if memory is not None:
        # (with a symbolic batch only the activations are per sample: the total is at B=1)
        per, at = (" per sample", f" at {summary.batch}=1") if summary.batch else ("", "")
        lines += [
            f"Training memory ({memory.optimizer}, on meta):",
            f"  parameters          {byte_size(memory.params)}",
            f"  gradients           {byte_size(memory.gradients)}",
            f"  optimizer states    {byte_size(memory.optimizer_states)}",
            f"  activations         {byte_size(memory.activations)}{per}",
            f"  total               {byte_size(memory.total)}{at}",
        ]
    return lines


def markdown(summary: Report, shown: list[tuple[Node, bool, int]], columns: Sequence[str]) -> str:
    """The rows ``shown`` as a markdown table (each named by its full path), the totals and
    the notes as a list under it; nothing is cut."""
    header = ("Module (type)", *(COLUMNS[c] for c in columns))
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for node, hidden, _ in shown:
        row = (label(node, False), *cells(node, hidden, columns).values())
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    lines += ["", *(f"- {t.strip()}" for t in _totals(summary))]
    lines += [f"- {note}" for note in notes_of(summary.rows)]
    return "\n".join(lines)
