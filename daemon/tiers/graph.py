"""Tier 3: the knowledge graph of theorems and lemmas (networkx underneath) and its mutations.

Rule kept here: an edge names two nodes that exist; every mutation carries a whole node or edge,
so replay is idempotent. The index of normalised statements (for a job that must not add a second
node for a statement already proved) is kept by `apply` and `load`, never written separately.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import msgspec
import networkx as nx

from ...protocol import (
    KnowledgeNode,
    ProtocolError,
    new_id,
)
from ...protocol import methods as m
from ..tier import TierState, Undo, handles


class PutNode(msgspec.Struct, tag="graph.node"):
    node: KnowledgeNode


class PutEdge(msgspec.Struct, tag="graph.edge"):
    from_id: str
    to_id: str
    relation: str


_SPACE_AND_DOLLARS = re.compile(r"[\s$]+")


def normalise_statement(statement: str) -> str:
    """What two statements of the same theorem share: NFKC, case-folded, without white space or
    TeX's `$`, without a final full stop. "Let $X$ be sub-Gaussian." and "let X be sub-gaussian"
    match; a changed symbol does not."""
    text = _SPACE_AND_DOLLARS.sub("", unicodedata.normalize("NFKC", statement).casefold())
    return text.rstrip(".。")


class GraphState(TierState):
    """Theorem nodes and typed directed edges; BFS over the undirected view, as EurekaClaw does."""

    name = "graph"

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, KnowledgeNode] = {}
        # ordered set of (from, to, relation); the value: how often EurekaClaw's file listed it (None: once)
        self.edges: dict[tuple[str, str, str], int | None] = {}
        self._adjacent = nx.Graph()  # undirected, edge attribute "n" counts the typed edges behind it
        self._by_statement: dict[str, dict[str, None]] = {}  # normalised statement -> node ids, oldest first

    def load(self, nodes: dict[str, KnowledgeNode]) -> None:
        """Nodes read from a snapshot (no journal record)."""
        for node in nodes.values():
            self._set_node(node.node_id, node)

    def node_with_statement(self, statement: str) -> KnowledgeNode | None:
        """The oldest node whose formal statement normalises as `statement` does, or None."""
        key = normalise_statement(statement)
        ids = self._by_statement.get(key) if key else None
        return self.nodes[next(iter(ids))] if ids else None

    def _set_node(self, node_id: str, node: KnowledgeNode | None) -> None:
        old = self.nodes.get(node_id)
        if old is not None:
            ids = self._by_statement.get(normalise_statement(old.formal_statement))
            if ids is not None:
                ids.pop(node_id, None)
                if not ids:
                    del self._by_statement[normalise_statement(old.formal_statement)]
        if node is None:
            self.nodes.pop(node_id, None)
            return
        self.nodes[node_id] = node
        key = normalise_statement(node.formal_statement)
        if key:
            self._by_statement.setdefault(key, {})[node_id] = None

    @handles("graph.add_theorem")
    def do_add_theorem(self, p: m.GraphAddTheorem) -> KnowledgeNode:
        from .persistent import imported_time

        if p.node_id is not None and p.node_id in self.nodes:
            raise ProtocolError("invalid_params", f"invalid params: node_id {p.node_id!r} is held already", field="node_id")
        created = imported_time("created_at", p.created_at, self.now())
        node = KnowledgeNode(
            node_id=p.node_id or new_id(),
            theorem_name=p.theorem_name,
            formal_statement=p.formal_statement,
            domain=p.domain,
            session_id=p.session_id,
            tags=list(dict.fromkeys(p.tags)),
            created_at=created,
        )
        self.commit(PutNode(node))
        return node

    @handles("graph.link")
    def do_link(self, p: m.GraphLink) -> dict[str, str]:
        for field, node_id in (("from_id", p.from_id), ("to_id", p.to_id)):
            if node_id not in self.nodes:
                raise ProtocolError("not_found", f"{field}: no node with id {node_id!r}", field=field, id=node_id)
        if (p.from_id, p.to_id, p.relation) not in self.edges:
            self.commit(PutEdge(p.from_id, p.to_id, p.relation))
        return {"from_id": p.from_id, "to_id": p.to_id, "relation": p.relation}

    @handles("graph.get")
    def do_get(self, p: m.GraphNodeRef) -> KnowledgeNode:
        return self._node(p.node_id)

    @handles("graph.related")
    def do_related(self, p: m.GraphRelated) -> list[KnowledgeNode]:
        self._node(p.node_id)
        if p.node_id not in self._adjacent:
            return []
        reached = nx.single_source_shortest_path_length(self._adjacent, p.node_id, cutoff=p.depth)
        return [self.nodes[n] for n in reached if n != p.node_id and n in self.nodes]

    @handles("graph.search")
    def do_search(self, p: m.GraphSearch) -> list[KnowledgeNode]:
        query = p.query.lower()
        domain = p.domain.lower() if p.domain is not None else None
        out: list[KnowledgeNode] = []
        for node in self.nodes.values():
            if domain is not None and domain not in node.domain.lower():
                continue
            if p.tag is not None and p.tag not in node.tags:
                continue
            if query and query not in node.theorem_name.lower() and query not in node.formal_statement.lower():
                continue
            out.append(node)
            if len(out) >= p.limit:
                break
        return out

    @handles("graph.stats")
    def do_stats(self, p: m.Empty) -> dict[str, Any]:
        relations: dict[str, int] = {r: 0 for r in m.RELATIONS}
        for _, _, relation in self.edges:
            relations[relation] = relations.get(relation, 0) + 1
        return {"nodes": len(self.nodes), "edges": len(self.edges), "relations": relations}

    @handles("graph.export")
    def do_export(self, p: m.GraphExport) -> dict[str, Any]:
        graph = self.to_networkx()
        if p.format == "graphml":
            return {"format": "graphml", "data": "\n".join(nx.generate_graphml(graph))}
        return {"format": "node_link", "data": nx.node_link_data(graph, edges="edges")}

    def to_networkx(self) -> nx.MultiDiGraph:
        graph = nx.MultiDiGraph()
        for node_id, node in self.nodes.items():
            graph.add_node(
                node_id,
                theorem_name=node.theorem_name,
                formal_statement=node.formal_statement,
                domain=node.domain,
                session_id=node.session_id,
                tags=",".join(node.tags),
                created_at=node.created_at,
            )
        for from_id, to_id, relation in self.edges:
            graph.add_edge(from_id, to_id, key=relation, relation=relation)
        return graph

    def _node(self, node_id: str) -> KnowledgeNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise ProtocolError("not_found", f"no node with id {node_id!r}", id=node_id)
        return node

    def keep_copies(self, edges: dict[tuple[str, str, str], int]) -> None:
        """How often EurekaClaw's knowledge_graph.json listed each edge (its add_edge appends
        duplicates): the graph, its answers and graph.link hold an edge once, the snapshot file
        lists it that many times again (daemon/storage/eurekaclaw.py)."""
        for edge, copies in edges.items():
            if edge in self.edges and copies > 1:
                self.edges[edge] = copies

    # mutations
    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, PutNode):
            node_id = mutation.node.node_id
            old = self.nodes.get(node_id)
            self._set_node(node_id, mutation.node)
            return lambda: self._set_node(node_id, old)
        if isinstance(mutation, PutEdge):
            edge = (mutation.from_id, mutation.to_id, mutation.relation)
            if edge in self.edges:
                return lambda: None
            self.edges[edge] = None
            self._connect(edge[0], edge[1], +1)

            def undo_edge() -> None:
                del self.edges[edge]
                self._connect(edge[0], edge[1], -1)

            return undo_edge
        raise TypeError(f"not a graph mutation: {mutation!r}")

    def _connect(self, a: str, b: str, delta: int) -> None:
        data = self._adjacent.get_edge_data(a, b)
        count = (data["n"] if data else 0) + delta
        if count > 0:
            self._adjacent.add_edge(a, b, n=count)
        elif data:
            self._adjacent.remove_edge(a, b)
            for end in (a, b):
                if end in self._adjacent and self._adjacent.degree(end) == 0:
                    self._adjacent.remove_node(end)

    def counts(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "edges": len(self.edges)}


