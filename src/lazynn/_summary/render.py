"""The summary's renderings: the text table and markdown (``table.py``), JSON, and DOT (a
picture: ``picture.py`` and ``graph.py``) of a :class:`Report`.

Each shows the same rows (``tree.py``): identical consecutive blocks (a transformer's 24
blocks, a ResNet stage's bottlenecks) collapse into one row with a count,
``blocks.1-23 (Block) x23``, and the depth is the deepest that fits in :data:`SCREEN_ROWS` rows
(``depth=`` to choose, ``expand=True`` to list every block). A row whose submodules are hidden
shows their totals. The text table fits the terminal's width when printed to one, 100
columns otherwise (``width=``).

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
>>> print(render(lazynn.summary(net, (4, 16)), format="markdown").splitlines()[3])
| 0 (LazyLinear -> Linear) | [4, 16] | [4, 8] | 136 | 1.0K |
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from .._errors import ArgumentError, message
from .picture import picture
from .report import Report
from .table import markdown, table, terminal_width
from .tree import COLUMNS, tree, visible, walk

__all__ = ["COLUMNS", "FORMATS", "SCREEN_ROWS", "Width", "render"]

#: the table's rows at most, by default: the depth shown is the deepest that fits
SCREEN_ROWS = 40
_DEFAULT_COLUMNS = ("input", "output", "params", "flops")
#: the formats :func:`render` writes
FORMATS = ("table", "markdown", "json", "dot")
#: a table's width: characters, None (no limit), or "auto" (the terminal's when stdout is a
#: terminal, at least 80; 100 otherwise)
Width = int | Literal["auto"] | None


def render(
    report: Report,
    format: str = "table",
    depth: int | None = None,
    expand: bool = False,
    width: Width = "auto",
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
    listed = isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns)
    if columns is not None and not listed:  # (a name alone is not its letters)
        raise ArgumentError(
            message(
                "Summary.render",
                f"columns: a list or tuple of names, some of {list(COLUMNS)}",
                f"columns={columns!r}",
                "pass a tuple: columns=('params',), or columns=None for the default ones",
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
    if depth is not None and (type(depth) is not int or depth < 0):
        raise ArgumentError(
            message(
                "Summary.render",
                "depth: an integer of 0 or more (0: the model's own row)",
                f"depth={depth!r}",
                "pass depth=None for every level, or a level of 0 or more",
            )
        )
    if width != "auto" and width is not None and (type(width) is not int or width < 1):
        raise ArgumentError(
            message(
                "Summary.render",
                "width: a number of characters (1 or more), None (no limit) or 'auto' (the "
                "terminal's when printing to one, 100 otherwise)",
                f"width={width!r}",
                "pass one of them: width=None for no limit",
            )
        )
    root = tree(report.rows, expand)
    deepest = max((n.row.depth for n in walk(root)), default=0)
    if depth is None:
        depth = deepest
        while depth > 1 and len(visible(root, depth)) > SCREEN_ROWS:
            depth -= 1
    shown = visible(root, depth)
    if format == "markdown":
        return markdown(report, shown, chosen)
    if format == "dot":
        return picture(report, root, shown, chosen)
    fit = terminal_width() if width == "auto" else width
    return table(report, shown, chosen, fit, depth, deepest)
