"""docs/summary.md's picture: the README's example model (its "Example" section), as
``render(format="dot")`` gives it (docs/images/summary-example.dot) and as Graphviz draws it
(docs/images/summary-example.svg). After an intended change of the rendering, regenerate both
(the SVG where Graphviz's dot is installed) with

    LAZYNN_REGEN_GOLDEN=1 python -m pytest tests/docs/test_summary_picture.py

and look at the SVG before committing.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from torch import nn

import lazynn
from dot_graph import has_dot, parse, svg_of, svg_texts
from paths import ROOT

DOT = ROOT / "docs" / "images" / "summary-example.dot"
SVG = ROOT / "docs" / "images" / "summary-example.svg"
REGEN = os.environ.get("LAZYNN_REGEN_GOLDEN") == "1"
#: the README's example model and input, as its "Example" section writes them
LAYERS = """\
>>> model = nn.Sequential(
...     lazynn.LazyConv2d(8, 3), lazynn.LazyBatchNorm2d(), nn.ReLU(),
...     nn.Flatten(), lazynn.LazyLinear(10),
... )"""
EXAMPLE = (2, 3, 16, 16)


def readme_model() -> nn.Sequential:
    return nn.Sequential(
        lazynn.LazyConv2d(8, 3),
        lazynn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.Flatten(),
        lazynn.LazyLinear(10),
    )


def rendered() -> str:
    return lazynn.summary(readme_model(), EXAMPLE).render(format="dot") + "\n"


def lines_of(dot: str) -> Counter[str]:
    """The lines of text of a DOT graph's labels (each label's lines, each edge's shapes)."""
    graph = parse(dot)
    labels = [a["label"] for a in [*graph.nodes.values(), *graph.clusters.values()]]
    labels += [a["label"] for _, _, a in graph.edges] + [graph.attributes["label"]]
    return Counter(line for label in labels for line in label.split("\n"))


def test_the_model_is_the_readmes() -> None:
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Example", 1)[1].split("\n## ", 1)[0]
    assert LAYERS in example
    assert f"model(torch.randn{EXAMPLE})" in example


def test_the_committed_dot_is_what_render_gives() -> None:
    if REGEN:
        DOT.parent.mkdir(exist_ok=True)
        DOT.write_text(rendered())
        if has_dot():
            SVG.write_text(svg_of(rendered()))
        pytest.skip(f"regenerated {DOT}" + (f" and {SVG}" if has_dot() else ""))
    assert DOT.read_text() == rendered()


def test_the_committed_svg_shows_every_label_of_the_dot() -> None:
    svg = SVG.read_text()
    assert len(svg) > 5000
    shown = Counter(svg_texts(svg))
    assert shown == lines_of(DOT.read_text())
    assert "4 (LazyLinear -> Linear)" in shown
    assert "[2, 1568]" in shown


@pytest.mark.skipif(not has_dot(), reason="Graphviz's dot is not installed")
def test_graphviz_draws_the_committed_dot_with_the_committed_svgs_labels() -> None:
    assert Counter(svg_texts(svg_of(DOT.read_text()))) == Counter(svg_texts(SVG.read_text()))


def test_the_summary_page_shows_the_picture() -> None:
    page = (ROOT / "docs" / "summary.md").read_text()
    assert "](images/summary-example.svg)" in page
