"""The knowledge graph as a picture: nodes and typed edges laid out here, with networkx, into an SVG
that the page embeds as it is (no script draws it).

Rule kept here: every text of the graph (theorem names, ids) goes into the SVG through
`html.escape`, so a theorem named like markup is shown as text; layouts are seeded, so the same
graph gives the same picture (and Pictures keeps the last few, keyed by what they show). A picture
holds at most MAX_NODES theorems, and `select` says what it left out, so the page can.
"""

from __future__ import annotations

import math
import threading
from html import escape
from typing import Any, NamedTuple
from urllib.parse import quote

import networkx as nx

RELATIONS = ("uses", "generalizes", "specializes", "contradicts")
COLOURS = {"uses": "#4a6fa5", "generalizes": "#3c8c5a", "specializes": "#a5784a", "contradicts": "#c0392b"}
MAX_NODES = 300  # a bigger picture is unreadable and slow to lay out: the page says what it left out and how to narrow
WIDTH, HEIGHT, MARGIN = 900, 640, 40
LABEL_ROOM = 200  # on the right of the rightmost node: its name (28 characters at most)


class Whole:
    """graph.export's node-link data as plain tables (nodes by id, edges, each node's neighbours in
    either direction): what `select` needs, without building a networkx graph of every theorem."""

    def __init__(self, export: dict[str, Any]) -> None:
        self.nodes: dict[str, dict[str, Any]] = {node["id"]: node for node in export.get("nodes", [])}
        self.edges: list[tuple[str, str, str]] = [
            (edge["source"], edge["target"], edge.get("key", "uses")) for edge in export.get("edges", export.get("links", []))
        ]
        self.near: dict[str, list[str]] = {n: [] for n in self.nodes}
        for a, b, _ in self.edges:
            self.near.setdefault(a, []).append(b)
            self.near.setdefault(b, []).append(a)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def degree(self, node: str) -> int:
        return len(self.near.get(node, ()))

    def domain(self, node: str) -> str:
        return str(self.nodes.get(node, {}).get("domain", ""))

    def name(self, node: str) -> str:
        return str(self.nodes.get(node, {}).get("theorem_name", node))


def build(export: dict[str, Any]) -> Whole:
    """The graph of graph.export's node-link data (nodes with their fields, edges keyed by relation)."""
    return Whole(export)


class Part(NamedTuple):
    """What the page draws, and what it left out to stay at MAX_NODES."""

    graph: nx.MultiDiGraph
    matched: int  # theorems the question matched (the domain's, or the neighbourhood's)
    left_out: dict[str, int]  # domain -> how many of its matched theorems were not drawn, most first
    farthest: int | None  # for a neighbourhood cut short: the depth of the nearest theorem left out


def _within(g: Whole, centre: str, depth: int) -> dict[str, int]:
    """Each theorem within `depth` hops of `centre`, either direction, and its distance."""
    distance = {centre: 0}
    frontier = [centre]
    for hop in range(1, depth + 1):
        reached = []
        for n in frontier:
            for m in g.near.get(n, ()):
                if m not in distance:
                    distance[m] = hop
                    reached.append(m)
        frontier = reached
    return distance


def select(g: Whole, domain: str = "", centre: str | None = None, depth: int = 1) -> Part:
    """The part to draw: a theorem's neighbourhood within `depth` hops (either direction; the nearest
    first when it holds more than MAX_NODES), else the theorems whose domain contains `domain`
    (case-insensitive; the most connected first when more than MAX_NODES match)."""
    farthest = None
    if centre is not None and centre in g:
        near = _within(g, centre, depth)
        ordered = sorted(near, key=lambda n: (near[n], -g.degree(n), n))
        if len(ordered) > MAX_NODES:
            farthest = near[ordered[MAX_NODES]]
    else:
        wanted = domain.lower()
        ordered = sorted((n for n in g.nodes if wanted in g.domain(n).lower()), key=lambda n: (-g.degree(n), n))
    left: dict[str, int] = {}
    for n in ordered[MAX_NODES:]:
        left[g.domain(n)] = left.get(g.domain(n), 0) + 1
    drawn = set(ordered[:MAX_NODES])
    sub = nx.MultiDiGraph()
    for n in ordered[:MAX_NODES]:
        sub.add_node(n, **{k: v for k, v in g.nodes[n].items() if k != "id"})
    for a, b, relation in g.edges:
        if a in drawn and b in drawn:
            sub.add_edge(a, b, key=relation, relation=relation)
    return Part(sub, len(ordered), dict(sorted(left.items(), key=lambda item: (-item[1], item[0]))), farthest)


def domains(g: Whole) -> dict[str, int]:
    """Each domain's theorem count, by name: the page's ways to narrow the picture."""
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[g.domain(n)] = counts.get(g.domain(n), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: item[0].lower()))


def _positions(g: nx.MultiDiGraph) -> dict[str, tuple[float, float]]:
    if len(g) == 0:
        return {}
    if len(g) == 1:
        return {next(iter(g)): (WIDTH / 2, HEIGHT / 2)}
    # each iteration is quadratic in the nodes: fewer for a big picture (20 at 300), which settles well enough
    iterations = max(20, min(50, 5000 // len(g)))
    raw = nx.spring_layout(nx.Graph(g), seed=7, k=1.5 / math.sqrt(len(g)), iterations=iterations)
    xs = [float(p[0]) for p in raw.values()]
    ys = [float(p[1]) for p in raw.values()]
    span_x = (max(xs) - min(xs)) or 1.0
    span_y = (max(ys) - min(ys)) or 1.0
    return {
        n: (MARGIN + (float(p[0]) - min(xs)) / span_x * (WIDTH - MARGIN - LABEL_ROOM),
            MARGIN + (float(p[1]) - min(ys)) / span_y * (HEIGHT - 2 * MARGIN))
        for n, p in raw.items()
    }


class Pictures:
    """The last few pictures drawn, by what they show (their nodes with names and their edges), so a
    page seen again, or by another request, is not laid out again."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.drawn: dict[Any, str] = {}
        self.lock = threading.Lock()  # pages draw in worker threads, two at a time perhaps

    def get(self, g: nx.MultiDiGraph, centre: str | None) -> str:
        key = (centre, tuple(sorted((str(n), str(g.nodes[n].get("theorem_name", n))) for n in g)),
               tuple(sorted((str(a), str(b), str(k)) for a, b, k in g.edges(keys=True))))
        with self.lock:
            picture = self.drawn.get(key)
        if picture is None:
            picture = svg(g, centre=centre)  # outside the lock: another page need not wait for this one
        with self.lock:
            self.drawn.pop(key, None)
            self.drawn[key] = picture  # the newest last
            while len(self.drawn) > self.size:
                del self.drawn[next(iter(self.drawn))]
        return picture


def svg(g: nx.MultiDiGraph, link: str = "/graph/node/", centre: str | None = None) -> str:
    """The SVG document: each edge an arrow coloured by its relation, each node a circle and its
    theorem name, linking to its statement (`link` + the node id)."""
    pos = _positions(g)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'role="img" aria-label="knowledge graph">',
        "<defs>",
    ]
    for relation, colour in COLOURS.items():
        out.append(
            f'<marker id="arrow-{relation}" viewBox="0 0 10 10" refX="18" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{colour}"/></marker>'
        )
    out.append("</defs>")
    for a, b, relation in g.edges(keys=True):
        (x1, y1), (x2, y2) = pos[a], pos[b]
        colour = COLOURS.get(relation, "#777")
        dash = ' stroke-dasharray="5 3"' if relation == "contradicts" else ""
        out.append(
            f'<line class="edge" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="1.6"{dash} marker-end="url(#arrow-{escape(relation)})"><title>{escape(relation)}</title></line>'
        )
    for n in g:
        x, y = pos[n]
        name = str(g.nodes[n].get("theorem_name", n))
        short = name if len(name) <= 28 else name[:27] + "…"
        fill = "#f4d03f" if n == centre else "#fff"
        out.append(
            f'<a class="node" href="{escape(link + quote(str(n), safe=""))}"><title>{escape(name)}</title>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="{fill}" stroke="#333" stroke-width="1.5"/>'
            f'<text x="{x + 12:.1f}" y="{y + 4:.1f}" font-size="12" font-family="sans-serif">{escape(short)}</text></a>'
        )
    out.append("</svg>")
    return "\n".join(out)
