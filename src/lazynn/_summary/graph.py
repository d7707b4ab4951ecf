"""The summary as a picture: a Graphviz DOT graph of boxes, the shapes on its edges.

``picture.py`` decides what each box says (the table's rows, collapsed and cut to a depth, as
:class:`Box`); this file writes them as DOT, the text Graphviz draws (``dot -Tsvg``), as
torchviz, torchview and Keras' ``plot_model`` do. A box with boxes inside is a cluster (a
frame with its label), any other a node; the edges run from the input, through the nodes in
the order the forward first called them, to the output, each labelled with the shapes the next
one receives. A module called more than once (a shared activation) stands off that path, as it
is at several places on it; a module never called is a dashed box.

Where the next node receives a shape the one before does not give (the forward branches, joins
a skip connection, or computes between them), the edge is dashed.

>>> inner = (Box("fc (Linear)", "fc", ("[2, 3]",), ("[2, 4]",)),)
>>> net = Box("Net", "", ("[2, 3]",), ("[2, 4]",), children=inner)
>>> text = dot("Net", "Net: 16 params", ("[2, 3]",), ("[2, 4]",), net)
>>> print(*text.splitlines()[5:], sep="\\n")  # (after the looks: fonts, colours)
  "input" [label="input", shape=ellipse, style="filled", fillcolor="#ffffff"];
  subgraph "cluster_n0" {
    style="rounded"; color="#9ca3af"; fontsize=11; labeljust=l;
    label="Net\\l";
    "n1" [label="fc (Linear)", tooltip="fc"];
  }
  "output" [label="output", shape=ellipse, style="filled", fillcolor="#ffffff"];
  "input" -> "n1" [label="[2, 3]"];
  "n1" -> "output" [label="[2, 4]"];
  label="Net: 16 params";
}
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Box", "dot", "quoted"]

_GRAPH = [
    "rankdir=TB;",
    'fontname="Helvetica"; fontsize=12;',
    'node [shape=box, style="rounded,filled", fillcolor="#f3f4f6", color="#6b7280", '
    'fontname="Helvetica", fontsize=11];',
    'edge [color="#374151", fontname="Helvetica", fontsize=10];',
]
#: a lazy layer's box (it was lazy before the build), as the table's "LazyLinear -> Linear"
_LAZY = 'fillcolor="#dbeafe"'
_CLUSTER = 'style="rounded"; color="#9ca3af"; fontsize=11; labeljust=l;'
_ENDS = 'shape=ellipse, style="filled", fillcolor="#ffffff"'


@dataclass(frozen=True)
class Box:
    """One row of the summary as a box: its label (lines apart by ``\\n``), its module's path
    (the tooltip), the shapes it receives and gives (its first call's), each as the table
    writes it; whether it is on the path (called once), whether it ran (it or a module in it
    was called), whether it was lazy, the boxes inside it, and its place on the path (the
    order of first calls: the path runs through the boxes by ``order``, then as listed)."""

    label: str
    path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    on_path: bool = True
    ran: bool = True
    lazy: bool = False
    children: tuple[Box, ...] = ()
    order: int = 0


def quoted(text: str, left: bool = False) -> str:
    """``text`` as a DOT string: in double quotes, its backslashes and quotes escaped, a line
    break as ``\\n`` (a line break in a Graphviz label; ``left``: as ``\\l``, each line
    left-justified).

    >>> print(quoted('blocks."a\\\\b"'))
    "blocks.\\"a\\\\b\\""
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if left:
        return '"' + escaped.replace("\n", "\\l") + '\\l"'
    return '"' + escaped.replace("\n", "\\n") + '"'


def dot(name: str, title: str, inputs: tuple[str, ...], outputs: tuple[str, ...], root: Box) -> str:
    """The DOT graph ``name`` of ``root`` and the boxes in it: an ``input`` node that gives
    ``inputs``, an ``output`` node that receives ``outputs``, ``title`` under the picture."""
    ids = _ids(root)
    lines = [f"digraph {quoted(name)} {{", *(f"  {line}" for line in _GRAPH)]
    lines.append(f'  "input" [label="input", {_ENDS}];')
    lines += _box(root, ids, "  ")
    lines.append(f'  "output" [label="output", {_ENDS}];')
    called = sorted(
        (box for box in _all(root) if not box.children and box.on_path), key=lambda b: b.order
    )
    names = ["input", *(ids[id(box)] for box in called), "output"]
    gives = [inputs, *(box.outputs for box in called)]
    receives = [*(box.inputs for box in called), outputs]
    for i, (shapes, given) in enumerate(zip(receives, gives, strict=True)):
        joined = bool(shapes) and set(shapes) <= set(given)  # (what it receives, given here)
        style = "" if joined else ", style=dashed"
        edge = f"{quoted(names[i])} -> {quoted(names[i + 1])}"
        lines.append(f"  {edge} [label={quoted(', '.join(shapes) or '--')}{style}];")
    lines.append(f"  label={quoted(title)};")  # (last: a cluster would inherit it)
    lines.append("}")
    return "\n".join(lines)


def _ids(root: Box) -> dict[int, str]:
    """A short name for each box, in order: ``n0``, ``n1``... (a cluster's: ``cluster_n0``,
    Graphviz's mark of a frame)."""
    return {
        id(box): f"cluster_n{i}" if box.children else f"n{i}" for i, box in enumerate(_all(root))
    }


def _all(box: Box) -> Iterator[Box]:
    yield box
    for child in box.children:
        yield from _all(child)


def _box(box: Box, ids: dict[int, str], indent: str) -> list[str]:
    """The DOT statements of ``box``: a node, or a cluster with its boxes in it."""
    tooltip = f", tooltip={quoted(box.path)}" if box.path else ""
    if not box.children:
        fill = f", {_LAZY}" if box.lazy else ""
        dashed = "" if box.ran else ', style="rounded,dashed"'
        attributes = f"label={quoted(box.label)}{tooltip}{fill}{dashed}"
        return [f"{indent}{quoted(ids[id(box)])} [{attributes}];"]
    lines = [f"{indent}subgraph {quoted(ids[id(box)])} {{", f"{indent}  {_CLUSTER}"]
    lines.append(f"{indent}  label={quoted(box.label, left=True)};")
    if box.path:
        lines.append(f"{indent}  tooltip={quoted(box.path)};")
    for child in box.children:
        lines += _box(child, ids, indent + "  ")
    lines.append(f"{indent}}}")
    return lines
