"""The summary as a picture: ``render(format="dot")``, a Graphviz DOT graph of the table's rows.

The DOT text is read back with tests/dot_graph.py's parser (no Graphviz needed): it parses, it
has one box per row the table shows (a node, or a cluster framing the rows under it), and
edges from the input through the modules to the output, labelled with the shapes. Where
Graphviz's ``dot`` is installed, it draws the same text, and its SVG shows the same labels.
"""

from __future__ import annotations

import re
import sys
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import lazynn
from dot_graph import Graph, has_dot, parse, path_through, svg_of, svg_texts
from golden_models import CASES, Blocks, TwoInputs, lazy_cnn
from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import models


def graph_of(model: nn.Module, *examples: object, **view: object) -> Graph:
    return parse(lazynn.summary(model, *examples).render(format="dot", **view))  # type: ignore[arg-type]


def markdown_rows(model: nn.Module, *examples: object, **view: object) -> list[str]:
    """The first cell (the module's path and type) of each row of the markdown table."""
    text = lazynn.summary(model, *examples).render(format="markdown", **view)  # type: ignore[arg-type]
    lines = text.split("\n\n")[0].splitlines()[2:]
    return [line[2:].split(" | ")[0] for line in lines]


def boxes(graph: Graph) -> dict[str, dict[str, str]]:
    """Every box of the graph, nodes and clusters, by id (not the input and output nodes)."""
    nodes = {k: v for k, v in graph.nodes.items() if k not in ("input", "output")}
    return {**nodes, **graph.clusters}


# --- one box per row, the shapes on the edges --------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_box_per_row_of_the_table_and_a_path_with_the_shapes(name: str) -> None:
    case = CASES[name]
    report = lazynn.summary(case.factory(), *case.examples)
    graph = parse(report.render(format="dot"))
    rows = markdown_rows(case.factory(), *case.examples)
    assert len(boxes(graph)) == len(rows)
    # each row's label is a box's (the model's row: the outermost)
    labels = sorted(attrs["label"].split("\n")[0] for attrs in boxes(graph).values())
    expected = [row.rsplit(".", 1)[-1] for row in rows]
    assert sorted(expected) == labels
    # the tooltips are the rows' paths
    paths = {attrs.get("tooltip", "") for attrs in boxes(graph).values()}
    assert paths == {row.split(" (")[0] if " (" in row else "" for row in rows}
    # every edge has the shapes; the path runs from the input's to the output's
    path = path_through(graph)
    assert len(path) == len(graph.edges) + 1
    labels_on_path = [attrs["label"] for _, _, attrs in graph.edges]
    assert labels_on_path[-1] == _shapes(report.outputs)
    assert all(label.startswith("[") for label in labels_on_path)


def _shapes(shapes: tuple[tuple[tuple[object, ...], torch.dtype], ...]) -> str:
    """As the table writes them: ``[2, 10]``, ``[2, 7] int64``."""
    out = []
    for dims, dtype in shapes:
        text = "[" + ", ".join(map(str, dims)) + "]"
        out.append(text if dtype == torch.float32 else f"{text} {str(dtype)[6:]}")
    return ", ".join(out)


def test_a_sequential_model_is_a_path_of_its_layers_with_their_shapes() -> None:
    graph = graph_of(lazy_cnn(), (2, 3, 8, 8), depth=2)
    path = path_through(graph)
    names = [graph.nodes[n]["label"].split("\n")[0] for n in path[1:-1]]
    assert names == [
        "0 (LazyConv2d -> Conv2d)",
        "1 (LazyBatchNorm2d -> BatchNorm2d)",
        "2 (ReLU)",
        "3 (MaxPool2d)",
        "flatten (Flatten)",
        "classifier (LazyLinear -> Linear)",
    ]
    shapes = [attrs["label"] for _, _, attrs in graph.edges]
    assert shapes == [
        "[2, 3, 8, 8]",
        "[2, 8, 8, 8]",
        "[2, 8, 8, 8]",
        "[2, 8, 8, 8]",
        "[2, 8, 4, 4]",
        "[2, 128]",
        "[2, 10]",
    ]
    assert all("style" not in attrs for _, _, attrs in graph.edges)  # each gives the next's
    lazy = [n for n in path[1:-1] if "fillcolor" in graph.nodes[n]]
    assert len(lazy) == 3  # the lazy layers are coloured
    (features,) = [c for c in graph.clusters.values() if c["label"].startswith("features")]
    assert features["tooltip"] == "features"


def test_identical_blocks_are_one_frame_as_in_the_table() -> None:
    graph = graph_of(Blocks(), (4, 6))
    labels = [c["label"] for c in graph.clusters.values()]
    assert "0-2 (Block) x3\nParams: 486, FLOPs: 3.5K" in labels
    (block,) = [k for k, c in graph.clusters.items() if c["label"].startswith("0-2")]
    assert [graph.nodes[n]["tooltip"] for n in graph.members[block]] == [
        "blocks.0.fc1",
        "blocks.0.fc2",
    ]
    expanded = graph_of(Blocks(), (4, 6), expand=True)
    framed = sorted(c["tooltip"] for c in expanded.clusters.values() if "tooltip" in c)
    assert framed == ["blocks", "blocks.0", "blocks.1", "blocks.2"]
    assert len(boxes(expanded)) == len(markdown_rows(Blocks(), (4, 6), expand=True))


def test_a_module_called_more_than_once_stands_off_the_path() -> None:
    """Blocks' one ReLU, called in each block and after them: on no one place of the path."""
    graph = graph_of(Blocks(), (4, 6))
    (relu,) = [n for n, a in graph.nodes.items() if a.get("tooltip") == "relu"]
    assert graph.nodes[relu]["label"] == "relu (ReLU) [4 calls]"
    assert relu not in path_through(graph)
    assert [a["label"] for _, _, a in graph.edges] == ["[4, 6]", "[4, 12]", "[4, 6]", "[4, 2]"]


def test_an_edge_to_a_module_that_receives_other_shapes_is_dashed() -> None:
    """TwoInputs: fuse takes the concatenated features, embed the tokens: a branch."""
    report = lazynn.summary(TwoInputs(), (2, 5), (2, 3), lazynn.Spec((2, 7), torch.long))
    graph = parse(report.render(format="dot"))
    edges = [(graph.nodes[t]["label"].split(" ")[0], a) for t, _, a in graph.edges]
    assert edges[0] == ("input", {"label": "[2, 8]", "style": "dashed"})
    assert edges[1] == ("fuse", {"label": "[2, 7] int64", "style": "dashed"})
    assert edges[2] == ("embed", {"label": "[2, 24]", "style": "dashed"})
    assert edges[3] == ("head", {"label": "[2, 4]"})


def test_depth_hides_rows_and_a_module_list_shown_whole_takes_its_blocks_shapes() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                nn.Sequential(lazynn.LazyLinear(8), nn.ReLU()) for _ in range(3)
            )
            self.head = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    graph = graph_of(Stack(), (4, 5), depth=1)
    assert len(boxes(graph)) == len(markdown_rows(Stack(), (4, 5), depth=1)) == 3
    path = [graph.nodes[n]["label"].split("\n")[0] for n in path_through(graph)[1:-1]]
    assert path == ["layers (ModuleList)", "head (LazyLinear -> Linear)"]
    assert [a["label"] for _, _, a in graph.edges] == ["[4, 5]", "[4, 8]", "[4, 2]"]
    assert all("style" not in a for _, _, a in graph.edges)


def test_a_module_never_called_is_a_dashed_box_off_the_path() -> None:
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(3, 4)
            self.spare = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    graph = graph_of(Unused(), (2, 3))
    (spare,) = [n for n, a in graph.nodes.items() if a.get("tooltip") == "spare"]
    assert graph.nodes[spare]["style"] == "rounded,dashed"
    assert spare not in path_through(graph)


def test_the_columns_are_the_figures_in_each_box() -> None:
    graph = graph_of(lazy_cnn(), (2, 3, 8, 8), columns=("params", "param_bytes", "calls"))
    labels = [a["label"] for a in graph.nodes.values()]
    assert "classifier (LazyLinear -> Linear)\nParams: 1,290, Param bytes: 5.04 KiB" in labels
    assert [a["label"] for _, _, a in graph.edges][-1] == "[2, 10]"  # shapes stay on edges


@pytest.mark.parametrize("format", ["svg", "png", "html"])
def test_an_image_format_is_refused_with_the_way_to_draw_one(format: str) -> None:
    report = lazynn.summary(lazy_cnn(), (2, 3, 8, 8))
    with pytest.raises(
        ValueError, match="expected format: 'table', 'markdown', 'json' or 'dot'"
    ) as e:
        report.render(format=format)
    assert isinstance(e.value, lazynn.ArgumentError)
    assert ("Fix: Graphviz draws an image" in str(e.value)) == (format != "html")


# --- the path follows the forward's calls, at every depth ----------------------------------------


class Attend(nn.Module):
    """A norm, attention, a norm (issue 38's shape). ``nn.MultiheadAttention``'s forward uses
    its ``out_proj``'s weight without calling it: a module that ran while none in it did."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x)
        return self.ln2(x + self.attn(x, x, x)[0])


class Residual(nn.Module):
    """A ResNet basic block whose shortcut is registered first and called last, its one ReLU
    called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.shortcut = nn.Sequential(lazynn.LazyConv2d(8, 1), lazynn.LazyBatchNorm2d())
        self.conv1 = lazynn.LazyConv2d(8, 3, padding=1)
        self.bn1 = lazynn.LazyBatchNorm2d()
        self.conv2 = lazynn.LazyConv2d(8, 3, padding=1)
        self.bn2 = lazynn.LazyBatchNorm2d()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def encoder_layers() -> nn.Sequential:
    """torch's encoder layer registers self_attn, linear1, dropout, linear2, norm1, norm2,
    dropout1, dropout2, and calls self_attn, dropout1, norm1, linear1...; lazy and eager."""
    return nn.Sequential(
        lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=32, batch_first=True),
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, batch_first=True, norm_first=True),
    )


#: models whose forward calls modules in another order than they are registered in, or a
#: module that calls none of its own: factory, input shape
TRACED = {
    "multihead attention": (Attend, (2, 5, 16)),
    "transformer encoder layers": (encoder_layers, (2, 5, 16)),
    "residual block": (Residual, (2, 3, 8, 8)),
    # (its encoder's skips join the decoder; its upconvs and decoder lists called interleaved)
    "u-net": (lambda: models.LazyUNet(out_channels=2, base=4, depth=2), (2, 1, 16, 16)),
}


def traced(model: nn.Module, x: torch.Tensor) -> list[str]:
    """The path of the module of each call a real forward makes, in order (forward pre-hooks)."""
    calls: list[str] = []
    hooks = [
        module.register_forward_pre_hook(lambda *_, path=path: calls.append(path))
        for path, module in model.named_modules()
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return calls


def built(name: str) -> tuple[nn.Module, tuple[int, ...], list[str]]:
    """``TRACED[name]``'s model, built by a first call, its input shape, and its calls."""
    factory, shape = TRACED[name]
    torch.manual_seed(0)
    model = factory()
    x = torch.randn(shape)
    with torch.no_grad():
        model(x)
    return model, shape, traced(model, x)


def on_path(graph: Graph) -> list[str]:
    """The paths of the modules on the path (the model's: ``""``), input to output."""
    return [graph.nodes[n].get("tooltip", "") for n in path_through(graph)[1:-1]]


@pytest.mark.parametrize("name", sorted(TRACED))
def test_the_path_follows_the_traced_calls_at_every_depth(name: str) -> None:
    model, shape, calls = built(name)
    report = lazynn.summary(model, shape)

    def inside(path: str, call: str) -> bool:
        path = re.sub(r"-\w+$", "", path)  # (a run of identical blocks: its first)
        return not path or call == path or call.startswith(path + ".")

    def first(path: str) -> int:
        return next(i for i, call in enumerate(calls) if inside(path, call))

    for depth in range(max(row.depth for row in report.rows) + 1):
        graph = parse(report.render(format="dot", depth=depth))
        path = on_path(graph)
        # in the order the forward first called each (or, for a box of several, one in it)
        assert path == sorted(path, key=first), f"depth {depth}"
        # every node of a module called once, or of a container whose modules ran, is on it
        nodes = [
            a.get("tooltip", "") for n, a in graph.nodes.items() if n not in ("input", "output")
        ]
        once = [
            p
            for p in nodes
            if calls.count(p) == 1 or (p not in calls and any(inside(p, c) for c in calls))
        ]
        assert sorted(once) == sorted(path), f"depth {depth}"
        # and every frame of a module that ran holds a part of the path
        for cluster, attributes in graph.clusters.items():
            if any(inside(attributes.get("tooltip", ""), call) for call in calls):
                members = [graph.nodes[n].get("tooltip", "") for n in graph.members[cluster]]
                assert set(members) & set(path), f"depth {depth}: {attributes['label']!r}"


@pytest.mark.parametrize("depth", [None, 1, 0])
def test_attention_is_one_node_on_the_path_at_every_depth(depth: int | None) -> None:
    """nn.MultiheadAttention, whose out_proj its forward never calls: one node, on the path
    from ln1 to ln2, counting out_proj's parameters (816 + 272); its edges are solid (it
    receives x three times, and ln2 receives the first of what it gives)."""
    model, shape, _ = built("multihead attention")
    graph = parse(lazynn.summary(model, shape).render(format="dot", depth=depth))
    if depth == 0:
        assert on_path(graph) == [""]
        return
    assert on_path(graph) == ["ln1", "attn", "ln2"]
    (attn,) = [a for a in graph.nodes.values() if a.get("tooltip") == "attn"]
    assert attn["label"] == "attn (MultiheadAttention)\nParams: 1,088, FLOPs: 23.7K"
    assert not any("out_proj" in a.get("tooltip", "") for a in graph.nodes.values())
    assert [a for _, _, a in graph.edges] == [
        {"label": "[2, 5, 16]"},
        {"label": "[2, 5, 16], [2, 5, 16], [2, 5, 16]"},
        {"label": "[2, 5, 16]"},
        {"label": "[2, 5, 16]"},
    ]


def test_an_encoder_layer_is_drawn_in_the_order_it_calls_its_modules() -> None:
    model, shape, _ = built("transformer encoder layers")
    graph = parse(lazynn.summary(model, shape).render(format="dot"))
    post = ["self_attn", "dropout1", "norm1", "linear1", "dropout", "linear2", "dropout2", "norm2"]
    pre = ["norm1", "self_attn", "dropout1", "norm2", "linear1", "dropout", "linear2", "dropout2"]
    assert on_path(graph) == [f"0.{p}" for p in post] + [f"1.{p}" for p in pre]
    assert all("style" not in a for _, _, a in graph.edges)  # (each receives what one gives)


def test_a_skip_joining_the_path_is_a_dashed_edge() -> None:
    """The U-Net's decoder receives its skip concatenated to its upconv's output."""
    model, shape, _ = built("u-net")
    graph = parse(lazynn.summary(model, shape).render(format="dot", depth=3))
    into = {graph.nodes[head].get("tooltip"): a for _, head, a in graph.edges}
    for level, channels in ((0, 16), (1, 8)):
        assert into[f"upconvs.{level}"].get("style") is None
        assert into[f"decoder.{level}.0"] == {
            "label": f"[2, {channels}, {8 * 2**level}, {8 * 2**level}]",
            "style": "dashed",
        }


def test_a_lazy_layer_never_reached_inside_a_module_that_ran_stays_apart() -> None:
    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.spare = lazynn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    graph = graph_of(nn.Sequential(Skips(), nn.ReLU()), (2, 3))
    (spare,) = [a for a in graph.nodes.values() if a.get("tooltip") == "0.spare"]
    assert spare["style"] == "rounded,dashed"  # (unbuilt, shown, off the path)
    assert on_path(graph) == ["1"]


# --- names that DOT must quote, read back exactly -----------------------------------------------

#: characters that mean something in DOT or in a Graphviz label, and some that are not ASCII
NASTY = ' "\\{}[]<>|;,=-:#/*\nlNé中'
NAMES = st.text(alphabet=st.sampled_from(NASTY + "ab1_"), min_size=1, max_size=8).filter(
    lambda name: not hasattr(nn.Module(), name)  # (add_module refuses an attribute's name)
)


def named_model(names: list[str]) -> nn.Sequential:
    """Sequential(name0: Linear, name1: Sequential(name2: Linear, ...), ...): nested halfway."""
    half = len(names) // 2
    inner = nn.Sequential(OrderedDict((n, lazynn.LazyLinear(3)) for n in names[half:]))
    outer = OrderedDict((n, lazynn.LazyLinear(3)) for n in names[:half])
    outer["inner"] = inner
    return nn.Sequential(outer)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(NAMES, min_size=1, max_size=6, unique=True).filter(lambda n: "inner" not in n)
)
def test_any_module_name_is_quoted_and_read_back(names: list[str]) -> None:
    model = named_model(names)
    graph = graph_of(model, (2, 4))
    nodes = {a["tooltip"]: a["label"] for n, a in graph.nodes.items() if "tooltip" in a}
    half = len(names) // 2
    paths = names[:half] + [f"inner.{n}" for n in names[half:]]
    assert sorted(nodes) == sorted(paths)
    for path, label in nodes.items():
        assert label.startswith(f"{path.removeprefix('inner.')} (LazyLinear -> Linear)\n")
    labels = [a["label"] for _, _, a in graph.edges]
    assert labels == ["[2, 4]"] + ["[2, 3]"] * len(names)
    assert len(path_through(graph)) == len(names) + 2


@pytest.mark.skipif(not has_dot(), reason="Graphviz's dot is not installed")
def test_graphviz_draws_the_names_as_written() -> None:
    names = ['say "hi"', "back\\slash", "a\\nb", "{x}", "<y>", "中文", "two\nlines"]
    text = lazynn.summary(named_model(names), (2, 4)).render(format="dot")
    shown = svg_texts(svg_of(text))
    for name in names[:3]:  # (the top level's: the inner ones are in the same way)
        assert f"{name} (LazyLinear -> Linear)" in shown
    assert "two" in shown
    assert "lines (LazyLinear -> Linear)" in shown
    assert "[2, 4]" in shown


@pytest.mark.skipif(not has_dot(), reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_graphviz_draws_every_golden_model(name: str) -> None:
    case = CASES[name]
    text = lazynn.summary(case.factory(), *case.examples).render(format="dot")
    shown = svg_texts(svg_of(text))
    graph = parse(text)
    for attrs in boxes(graph).values():
        assert all(line in shown for line in attrs["label"].split("\n"))
    assert all(a["label"] in shown for _, _, a in graph.edges)
