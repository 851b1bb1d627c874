"""EurekaClaw's MemoryManager attributes `.session`, `.persistent` and `.graph` (its EpisodicMemory,
PersistentMemory and KnowledgeGraph, v0.2.0) as views of a MemoryManager drop-in.

Rule kept here: a view holds no state and no file of its own; every call is the manager's (its
daemon calls, spool, circuit breaker and file fallback). EurekaClaw's own objects over the same
files would each keep a copy that the daemon's rewrites of persistent.json and
knowledge_graph.json make stale, and their saves would undo the daemon's writes. Records come
back through the manager's `_export` (ours, or EurekaClaw's pydantic types when routed). The manager
is typed Any here: client/_manager.py imports this module, not the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["GraphView", "PersistentView", "SessionView"]


class SessionView:
    """EurekaClaw's EpisodicMemory calls over a manager: record is log_event, get_recent
    recent_events, get_all / search / len over every event of the session, as EurekaClaw's over
    its ring (the daemon keeps the session's events, the manager its last 500 on top)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.session_id = manager.session_id

    def record(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> Any:
        return self._manager.log_event(agent_role, content, metadata)

    def get_recent(self, n: int = 20, agent_role: str | None = None) -> list[Any]:
        return list(self._manager.recent_events(n, agent_role))

    def get_all(self) -> list[Any]:
        return list(self._manager.recent_events(0))  # n = 0: every event, as EurekaClaw's entries[-0:]

    def search(self, keyword: str) -> list[Any]:
        kw = keyword.lower()
        return [e for e in self.get_all() if kw in e.content.lower()]

    def __len__(self) -> int:
        return len(self.get_all())


class PersistentView:
    """EurekaClaw's PersistentMemory calls over a manager (tier 2). Differences: search_keys and
    all_records list at most 10,000 records, first stored first (EurekaClaw: its dict's order,
    which is the same unless records were imported with older times)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.memory_dir: Path = manager._memory_dir

    def put(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> Any:
        """remember(), answering the record as EurekaClaw's put does."""
        return self._manager._export(self._manager._put(key, value, tags, source_session))

    def get(self, key: str) -> Any | None:
        return self._manager.recall(key)

    def get_by_tag(self, tag: str) -> list[Any]:
        return list(self._manager.recall_by_tag(tag))

    def search_keys(self, prefix: str) -> list[Any]:
        return [self._manager._export(r) for r in self._manager._stored_records(prefix)]

    def delete(self, key: str) -> None:
        self._manager._forget(key)

    def all_records(self) -> list[Any]:
        return self.search_keys("")


class GraphView:
    """EurekaClaw's KnowledgeGraph calls over a manager (tier 3). Differences: as the manager's
    link_theorems, add_edge takes the four relations only and a link made twice is one edge
    (EurekaClaw lists it twice, which stats() counts); the node lists hold at most 10,000 nodes."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.memory_dir: Path = manager._memory_dir

    def add_theorem(
        self, theorem_name: str, formal_statement: str, domain: str = "", session_id: str = "", tags: list[str] | None = None
    ) -> Any:
        return self._manager.add_theorem(theorem_name, formal_statement, domain, session_id, tags)

    def add_edge(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        self._manager.link_theorems(from_id, to_id, relation)

    def find_related(self, node_id: str, depth: int = 2) -> list[Any]:
        return list(self._manager.find_related_theorems(node_id, depth))

    def search_by_domain(self, domain: str) -> list[Any]:
        return [self._manager._export(n) for n in self._manager._graph_nodes(domain=domain)]

    def search_by_tag(self, tag: str) -> list[Any]:
        return [self._manager._export(n) for n in self._manager._graph_nodes(tag=tag)]

    def all_nodes(self) -> list[Any]:
        return [self._manager._export(n) for n in self._manager._graph_nodes()]

    def to_networkx(self) -> Any:
        """A networkx DiGraph as EurekaClaw's: each node's fields but related_to as its attributes,
        each edge's relation (networkx imported here, on first use)."""
        import networkx as nx

        graph = nx.DiGraph()
        for node in self.all_nodes():
            graph.add_node(node.node_id, **{k: v for k, v in node.model_dump().items() if k != "related_to"})
        for from_id, to_id, relation in self._manager._graph_edges():
            graph.add_edge(from_id, to_id, relation=relation)
        return graph

    def stats(self) -> dict[str, int]:
        return dict(self._manager._graph_stats())
