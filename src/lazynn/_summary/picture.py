"""The rows the table shows as ``graph.py``'s boxes: the picture's content, in the order of the
forward's calls.

A row with rows shown under it is a frame around them; the others are nodes, and the path runs
through the nodes in the order the examples first called them (``Report.call_order``), so it
follows the forward, not the order the modules were registered in (a transformer layer
registers its norms after its feed-forward and calls one between). A module that ran while
none of the modules in it did (``nn.MultiheadAttention``, whose forward uses its ``out_proj``'s
weight without calling it) is one node on the path at every depth, counting the modules in it,
as a row whose submodules are hidden does.

>>> import torch, lazynn
>>> from torch import nn
>>> class Attend(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.attn, self.norm = nn.MultiheadAttention(8, 2, batch_first=True), nn.LayerNorm(8)
...     def forward(self, x):
...         return self.norm(x + self.attn(x, x, x)[0])
>>> text = lazynn.summary(Attend(), (2, 5, 8)).render(format="dot")
>>> lines = [line.strip() for line in text.splitlines() if "tooltip" in line or '" -> "' in line]
>>> print(*lines, sep="\\n")
"n1" [label="attn (MultiheadAttention)\\nParams: 288, FLOPs: 6.7K", tooltip="attn"];
"n2" [label="norm (LayerNorm)\\nParams: 16", tooltip="norm"];
"input" -> "n1" [label="[2, 5, 8], [2, 5, 8], [2, 5, 8]"];
"n1" -> "n2" [label="[2, 5, 8]"];
"n2" -> "output" [label="[2, 5, 8]"];
"""

from __future__ import annotations

from collections.abc import Sequence

from .graph import Box, dot
from .report import Report
from .tree import COLUMNS, Node, cells, ends, label, shape_texts, si, walk

__all__ = ["picture"]


def picture(
    summary: Report, root: Node, shown: list[tuple[Node, bool, int]], columns: Sequence[str]
) -> str:
    """The rows ``shown`` as a DOT graph: a box per row (a row with rows shown under it
    frames them, unless it ran while none of them did), its label the table's, its figures
    those of ``columns`` but the shapes, which are on the edges; the path through them in the
    order of their first calls."""
    hidden = {id(node): is_hidden for node, is_hidden, _ in shown}
    figures = [c for c in columns if c not in ("input", "output")]
    order = {path: i for i, path in enumerate(summary.call_order)}
    if not order:  # (a report made by hand: the model's order)
        order = {row.path: i for i, row in enumerate(summary.rows) if row.calls}

    def first_call(node: Node) -> int:
        return min((order[n.row.path] for n in walk(node) if n.row.path in order), default=0)

    def box(node: Node) -> Box:
        folded = hidden[id(node)] or _ran_alone(node)
        values = cells(node, folded, figures)
        said = ", ".join(f"{COLUMNS[c]}: {v}" for c, v in values.items() if v not in ("--", ""))
        text = label(node, True)[2 * node.row.depth :]  # (its name as the table's, unindented)
        inside = () if folded else tuple(box(child) for child in node.children)
        inputs, outputs = ends(node, order)
        ran = any(n.row.calls for n in walk(node))
        tied = [f"* {name} is {owner}, counted there" for name, owner in node.row.tied]
        return Box(
            label="\n".join([text, *([said] if said else []), *tied]),
            path=node.path(),
            inputs=tuple(shape_texts(inputs)),
            outputs=tuple(shape_texts(outputs)),
            on_path=node.row.calls == 1 or (not node.row.calls and ran),
            ran=ran,
            lazy=node.row.lazy_type not in (None, node.row.type),
            children=inside,
            order=first_call(node),
        )

    total = f"{summary.total_parameters:,} params, {si(summary.total_flops)} FLOPs"
    per_sample = f", per sample: {summary.batch}=1" if summary.batch else ""
    title = f"{summary.model_type}: {total} ({summary.mode} mode{per_sample})"
    inputs, outputs = tuple(shape_texts(summary.inputs)), tuple(shape_texts(summary.outputs))
    return dot(summary.model_type, title, inputs, outputs, box(root))


def _ran_alone(node: Node) -> bool:
    """Whether ``node``'s module ran while no module in it did (its forward uses their
    tensors, not their forwards: ``nn.MultiheadAttention``'s ``out_proj``). Not when one of
    them is a lazy layer never reached: the picture shows that one apart, as unbuilt."""
    inside = walk(node)[1:]
    return (
        bool(inside)
        and node.row.calls > 0
        and not any(n.row.calls for n in inside)
        and not any(n.row.lazy_type == n.row.type for n in inside)
    )
