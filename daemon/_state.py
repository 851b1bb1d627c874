"""Tier state: the dicts, deques and graph that the tier actors own, and the mutations that change them.

Rule kept here: durable state changes only through `apply(mutation)`, the same function at run time
and at journal replay, and every mutation is state-based (it carries the whole resulting record), so
applying one twice, or re-applying those already folded into a snapshot, gives the same state.
`apply` returns an undo closure so that a batch whose journal write failed leaves no trace.
Handlers validate first and raise ProtocolError before changing anything.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Union

import msgspec
import networkx as nx

from eurekamem.protocol import (
    CrossRunRecord,
    EpisodicEntry,
    KnowledgeNode,
    ProtocolError,
    new_id,
    now_rfc3339,
)
from eurekamem.protocol import _methods as m

Undo = Callable[[], None]

# --- journaled mutations ------------------------------------------------------------------------


class PutRecord(msgspec.Struct, tag="persistent.put"):
    record: CrossRunRecord


class DeleteKey(msgspec.Struct, tag="persistent.delete"):
    key: str


class PutNode(msgspec.Struct, tag="graph.node"):
    node: KnowledgeNode


class PutEdge(msgspec.Struct, tag="graph.edge"):
    from_id: str
    to_id: str
    relation: str


RTYPE_MUTATION = 1  # journal record type of a msgpack-encoded mutation (the union is in _app.py)

mutation_encoder = msgspec.msgpack.Encoder()


class TierState:
    """Base: a tier's state plus the undo log of the batch in progress."""

    name = "?"

    def __init__(self) -> None:
        self.pending: list[Any] = []  # mutations of the batch in progress, in order
        self._undo: list[Undo] = []
        self._now: str | None = None

    def begin_batch(self) -> None:
        self._now = None

    def now(self) -> str:
        """The time of the batch in progress: one timestamp for every record a batch writes."""
        if self._now is None:
            self._now = now_rfc3339()
        return self._now

    def commit(self, mutation: Any) -> None:
        """Apply a mutation now and remember it (and how to undo it) for the batch's journal write."""
        self._undo.append(self.apply(mutation))
        self.pending.append(mutation)

    def take_pending(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def forget_undo(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        """Undo the batch in progress (its journal write failed)."""
        while self._undo:
            self._undo.pop()()
        self.pending.clear()

    def apply(self, mutation: Any) -> Undo:  # pragma: no cover - overridden
        raise NotImplementedError

    def handle(self, method: str, params: Any) -> Any:
        name = _HANDLER_NAMES.get(method)
        if name is None:
            name = _HANDLER_NAMES[method] = "do_" + method.split(".", 1)[1]
        return getattr(self, name)(params)


_HANDLER_NAMES: dict[str, str] = {}  # "persistent.recall" -> "do_recall" (the lookup stays per call: tests patch handlers)


# --- tier 1: episodic ---------------------------------------------------------------------------


class EpisodicState(TierState):
    """Per-session ring buffers in RAM (never journaled, as in EurekaClaw)."""

    name = "episodic"
    RING = 500

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[str, deque[EpisodicEntry]] = {}
        self.logged = 0

    def do_log(self, p: m.EpisodicLog) -> EpisodicEntry:
        entry = EpisodicEntry(
            entry_id=new_id(),
            session_id=p.session_id,
            agent_role=p.agent_role,
            content=p.content,
            metadata=p.metadata,
            timestamp=self.now(),
        )
        ring = self.sessions.get(p.session_id)
        if ring is None:
            ring = self.sessions[p.session_id] = deque(maxlen=self.RING)
        ring.append(entry)
        self.logged += 1
        return entry

    def do_recent(self, p: m.EpisodicRecent) -> list[EpisodicEntry]:
        entries = self.sessions.get(p.session_id, ())
        if p.agent_role is not None:
            entries = [e for e in entries if e.agent_role == p.agent_role]
        else:
            entries = list(entries)
        return entries[-p.n :]

    def do_search(self, p: m.EpisodicSearch) -> list[EpisodicEntry]:
        needle = p.query.lower()
        hits = [e for e in self.sessions.get(p.session_id, ()) if needle in e.content.lower()]
        return hits[-p.n :]

    def close_session(self, session_id: str) -> list[EpisodicEntry]:
        """Drop a session's buffer and return its events (the caller writes them to runs/)."""
        return list(self.sessions.pop(session_id, ()))

    def apply(self, mutation: Any) -> Undo:  # pragma: no cover - episodic is never journaled
        raise TypeError("episodic state is not journaled")

    def counts(self) -> dict[str, int]:
        return {"sessions": len(self.sessions), "events": sum(len(r) for r in self.sessions.values())}


# --- tier 2: persistent -------------------------------------------------------------------------


class PersistentState(TierState):
    """Cross-run key-value records with a tag index."""

    name = "persistent"

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, CrossRunRecord] = {}
        self._by_tag: dict[str, dict[str, None]] = {}

    # handlers
    def do_remember(self, p: m.PersistentRemember) -> CrossRunRecord:
        now = self.now()
        old = self.records.get(p.key)
        record = CrossRunRecord(
            record_id=old.record_id if old else new_id(),
            key=p.key,
            value=p.value,
            tags=list(dict.fromkeys(p.tags)),
            source_session=p.source_session,
            created_at=old.created_at if old else now,
            updated_at=now,
        )
        self.commit(PutRecord(record))
        return record

    def do_recall(self, p: m.PersistentKey) -> CrossRunRecord | None:
        return self.records.get(p.key)

    def do_by_tag(self, p: m.PersistentByTag) -> list[CrossRunRecord]:
        return [self.records[k] for k in self._by_tag.get(p.tag, ())]

    def do_forget(self, p: m.PersistentKey) -> dict[str, bool]:
        if p.key not in self.records:
            return {"deleted": False}
        self.commit(DeleteKey(p.key))
        return {"deleted": True}

    def do_keys(self, p: m.PersistentKeys) -> dict[str, list[str]]:
        keys = sorted(k for k in self.records if k.startswith(p.prefix))
        return {"keys": keys[: p.limit]}

    # mutations
    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, PutRecord):
            key = mutation.record.key
            old = self.records.get(key)
            self._set(key, mutation.record)
        elif isinstance(mutation, DeleteKey):
            key = mutation.key
            old = self.records.get(key)
            self._set(key, None)
        else:
            raise TypeError(f"not a persistent mutation: {mutation!r}")
        return lambda: self._set(key, old)

    def _set(self, key: str, record: CrossRunRecord | None) -> None:
        old = self.records.pop(key, None)
        if old is not None:
            for tag in old.tags:
                keys = self._by_tag.get(tag)
                if keys is not None:
                    keys.pop(key, None)
                    if not keys:
                        del self._by_tag[tag]
        if record is not None:
            self.records[key] = record
            for tag in record.tags:
                self._by_tag.setdefault(tag, {})[key] = None

    def counts(self) -> dict[str, int]:
        return {"records": len(self.records), "tags": len(self._by_tag)}


# --- tier 3: knowledge graph --------------------------------------------------------------------


class GraphState(TierState):
    """Theorem nodes and typed directed edges; BFS over the undirected view, as EurekaClaw does."""

    name = "graph"

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, KnowledgeNode] = {}
        self.edges: dict[tuple[str, str, str], None] = {}  # ordered set of (from, to, relation)
        self._adjacent = nx.Graph()  # undirected, edge attribute "n" counts the typed edges behind it

    def do_add_theorem(self, p: m.GraphAddTheorem) -> KnowledgeNode:
        node = KnowledgeNode(
            node_id=new_id(),
            theorem_name=p.theorem_name,
            formal_statement=p.formal_statement,
            domain=p.domain,
            session_id=p.session_id,
            tags=list(dict.fromkeys(p.tags)),
            created_at=self.now(),
        )
        self.commit(PutNode(node))
        return node

    def do_link(self, p: m.GraphLink) -> dict[str, str]:
        for field, node_id in (("from_id", p.from_id), ("to_id", p.to_id)):
            if node_id not in self.nodes:
                raise ProtocolError("not_found", f"{field}: no node with id {node_id!r}", field=field, id=node_id)
        if (p.from_id, p.to_id, p.relation) not in self.edges:
            self.commit(PutEdge(p.from_id, p.to_id, p.relation))
        return {"from_id": p.from_id, "to_id": p.to_id, "relation": p.relation}

    def do_get(self, p: m.GraphNodeRef) -> KnowledgeNode:
        return self._node(p.node_id)

    def do_related(self, p: m.GraphRelated) -> list[KnowledgeNode]:
        self._node(p.node_id)
        if p.node_id not in self._adjacent:
            return []
        reached = nx.single_source_shortest_path_length(self._adjacent, p.node_id, cutoff=p.depth)
        return [self.nodes[n] for n in reached if n != p.node_id and n in self.nodes]

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

    def do_stats(self, p: m.Empty) -> dict[str, Any]:
        relations: dict[str, int] = {r: 0 for r in m.RELATIONS}
        for _, _, relation in self.edges:
            relations[relation] = relations.get(relation, 0) + 1
        return {"nodes": len(self.nodes), "edges": len(self.edges), "relations": relations}

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

    # mutations
    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, PutNode):
            node_id = mutation.node.node_id
            old = self.nodes.get(node_id)
            self.nodes[node_id] = mutation.node

            def undo_node() -> None:
                if old is None:
                    del self.nodes[node_id]
                else:
                    self.nodes[node_id] = old

            return undo_node
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
