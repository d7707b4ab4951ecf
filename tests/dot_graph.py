"""DOT read back, for the tests of the summary's picture (``render(format="dot")``): a parser
of Graphviz's DOT grammar (https://graphviz.org/doc/info/lang.html), strict, with no comments,
ports or HTML strings (lazynn writes none), so that a test needs no Graphviz to check that
the text parses and to read its nodes, clusters and edges; and what Graphviz's ``dot`` draws
of it as SVG, read back as text, where ``dot`` is installed; and the path its edges make
from the input to the output.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

__all__ = ["Graph", "has_dot", "parse", "path_through", "svg_of", "svg_texts"]

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<name>[A-Za-z_\x80-\U0010ffff][A-Za-z_0-9\x80-\U0010ffff]*)
  | (?P<number>-?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?))
  | (?P<punct>->|--|[{}\[\]=;,:])
)""",
    re.VERBOSE | re.DOTALL,
)
_KEYWORDS = {"graph", "digraph", "subgraph", "node", "edge", "strict"}


@dataclass
class Graph:
    """A DOT graph, its strings decoded as Graphviz reads a label (``\\\\n`` and ``\\\\l``
    as line breaks): its name, attributes, nodes (by id, with their attributes), edges
    (tail, head, attributes) and clusters (by id, with their attributes and nodes)."""

    name: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)


def _decoded(raw: str, label: bool = False) -> str:
    """A quoted string's text, as Graphviz reads it: ``\\"`` a quote, ``\\\\`` a
    backslash, ``\\n``, ``\\l`` and ``\\r`` line ends (lines joined by ``\\n`` here;
    ``label``: a line end at the end adds no empty line, as a label shows it)."""
    lines, line, i = [], "", 0
    while i < len(raw):
        pair = raw[i : i + 2]
        if pair in ("\\n", "\\l", "\\r"):
            lines.append(line)
            line = ""
        elif pair in ('\\"', "\\\\"):
            line += pair[1]
        else:
            line += raw[i]
            i -= 1
        i += 2
    if line or not lines or not label:
        lines.append(line)
    return "\n".join(lines)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while text[at:].strip():
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise SyntaxError(f"DOT: unexpected text at {at}: {text[at : at + 30]!r}")
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "string":
            tokens.append(("id", value))
        elif kind == "name" and value.lower() in _KEYWORDS:
            tokens.append((value.lower(), value))
        elif kind in ("name", "number"):
            tokens.append(("id", value))
        else:
            tokens.append((value, value))
        at = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.graph = Graph()
        self.clusters: list[str] = []  # the clusters we are in

    def peek(self, ahead: int = 0) -> str:
        at = self.at + ahead
        return self.tokens[at][0] if at < len(self.tokens) else "end"

    def take(self, kind: str) -> str:
        if self.peek() != kind:
            raise SyntaxError(f"DOT: expected {kind!r} at token {self.at}, found {self.peek()!r}")
        self.at += 1
        value = self.tokens[self.at - 1][1]
        return _decoded(value[1:-1]) if value.startswith('"') else value

    def value(self, key: str) -> str:
        """``= ID``: the value of attribute ``key`` (a label read as Graphviz shows it)."""
        self.take("=")
        value = self.take("id")
        raw = self.tokens[self.at - 1][1]
        return _decoded(raw[1:-1], label=True) if key == "label" and raw[0] == '"' else value

    def graph_(self) -> Graph:
        if self.peek() == "strict":
            self.take("strict")
        if self.peek() != "digraph":
            raise SyntaxError("DOT: expected a digraph")
        self.take("digraph")
        if self.peek() == "id":
            self.graph.name = self.take("id")
        self.body(self.graph.attributes)
        if self.peek() != "end":
            raise SyntaxError("DOT: text after the graph")
        return self.graph

    def body(self, attributes: dict[str, str]) -> None:
        self.take("{")
        while self.peek() != "}":
            self.statement(attributes)
            if self.peek() == ";":
                self.take(";")
        self.take("}")

    def attributes(self) -> dict[str, str]:
        found: dict[str, str] = {}
        while self.peek() == "[":
            self.take("[")
            while self.peek() != "]":
                key = self.take("id")
                found[key] = self.value(key)
                if self.peek() in (",", ";"):
                    self.take(self.peek())
            self.take("]")
        return found

    def statement(self, attributes: dict[str, str]) -> None:
        kind = self.peek()
        if kind in ("graph", "node", "edge"):
            self.take(kind)
            self.attributes()
        elif kind == "subgraph" or kind == "{":
            self.subgraph()
        elif kind == "id" and self.peek(1) == "=":
            key = self.take("id")
            attributes[key] = self.value(key)
        elif kind == "id":
            ends = [self.node_id()]
            while self.peek() == "->":
                self.take("->")
                ends.append(self.node_id())
            found = self.attributes()
            if len(ends) == 1:
                self.graph.nodes.setdefault(ends[0], {}).update(found)
                for cluster in self.clusters:
                    self.graph.members[cluster].append(ends[0])
            for tail, head in itertools.pairwise(ends):
                self.graph.edges.append((tail, head, found))
        else:
            raise SyntaxError(f"DOT: unexpected {kind!r} at token {self.at}")

    def node_id(self) -> str:
        name = self.take("id")
        if self.peek() == ":":
            raise SyntaxError("DOT: ports are not expected")
        return name

    def subgraph(self) -> None:
        name = ""
        if self.peek() == "subgraph":
            self.take("subgraph")
            if self.peek() == "id":
                name = self.take("id")
        attributes: dict[str, str] = {}
        cluster = name.startswith("cluster")
        if cluster:
            if name in self.graph.clusters:
                raise SyntaxError(f"DOT: cluster {name!r} twice")
            self.graph.clusters[name] = attributes
            self.graph.members[name] = []
            self.clusters.append(name)
        self.body(attributes)
        if cluster:
            self.clusters.pop()


def parse(text: str) -> Graph:
    """``text`` as a :class:`Graph`; a ``SyntaxError`` where it is not DOT (of lazynn's
    kind: a digraph without comments, ports or HTML labels)."""
    return _Parser(text).graph_()


def path_through(graph: Graph) -> list[str]:
    """The nodes from ``input`` to ``output``, following the edges (one out of each)."""
    after = {tail: head for tail, head, _ in graph.edges}
    assert len(after) == len(graph.edges), "a node with two edges out"
    path = ["input"]
    while path[-1] != "output":
        assert path[-1] in after, f"the path stops at {path[-1]!r}"
        path.append(after[path[-1]])
    return path


def has_dot() -> bool:
    """Whether Graphviz's ``dot`` program is installed."""
    return shutil.which("dot") is not None


def svg_of(dot: str) -> str:
    """``dot`` drawn as SVG by Graphviz (raises where dot refuses it)."""
    done = subprocess.run(
        ["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout


def svg_texts(svg: str) -> list[str]:
    """The lines of text an SVG shows (its ``<text>`` elements), in order."""
    root = ElementTree.fromstring(svg)
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "text"]
