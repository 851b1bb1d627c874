"""A model of EurekaClaw's MemoryManager (v0.2.0, commit 39ee390), written from reading its code.

Not EurekaClaw's code: our own small re-implementation of what its manager observably does, so
that tests can run the same calls against it and against eurekamem's drop-in. What it models:

- records (eurekaclaw/types/memory.py): EpisodicEntry.timestamp, CrossRunRecord.created_at and
  KnowledgeNode.created_at are naive UTC (utcnow); CrossRunRecord.updated_at is aware local
  (now().astimezone()); lists default to [] (tags kept as given, duplicates too);
- episodic (memory/episodic.py): a ring of 500 per manager; get_recent filters by role only when
  the role is truthy, then returns entries[-n:];
- persistent (memory/persistent.py): put makes a new record every time (new id, new created_at),
  the dict keeps a key's first position; get returns the value; get_by_tag in dict order; the
  store is a JSON file, so values come back as their JSON form after a reload;
- graph (memory/knowledge_graph.py): add_edge only when both ids exist, any relation string,
  duplicates kept; find_related is BFS for `depth` rounds over both directions (a set: no order);
- `.persistent` and `.graph` (PersistentMemory, KnowledgeGraph): search_keys / all_records /
  get_by_tag / delete in dict order, put answering the record; search_by_domain (case-insensitive
  substring), search_by_tag, all_nodes in insertion order, stats counting duplicate edges, and
  to_networkx a DiGraph (node fields but related_to as attributes, the edge's relation);
- retrieve_relevant_theorems (memory/manager.py): its lexical scoring and sort;
- load_for_injection: reads memories/<slug>/_index.json and the files it names, newest first by
  the index's created_at (the embedding path needs vectors in the index, which the daemon does not
  write, so with or without a query it is the newest k), strips the frontmatter with
  re.sub(r"^---\\n.*?---\\n", "", text, flags=re.DOTALL), .strip(), [:400], joined by blank lines.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
import uuid
from collections import deque
from pathlib import Path
from typing import Any


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@dataclasses.dataclass
class RefEntry:
    entry_id: str
    session_id: str
    agent_role: str
    content: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    timestamp: dt.datetime = dataclasses.field(default_factory=utcnow)


@dataclasses.dataclass
class RefRecord:
    record_id: str
    key: str
    value: Any
    tags: list[str] = dataclasses.field(default_factory=list)
    source_session: str = ""
    created_at: dt.datetime = dataclasses.field(default_factory=utcnow)
    updated_at: dt.datetime = dataclasses.field(default_factory=utcnow)


@dataclasses.dataclass
class RefNode:
    node_id: str
    theorem_name: str
    formal_statement: str
    domain: str = ""
    session_id: str = ""
    related_to: list[str] = dataclasses.field(default_factory=list)
    tags: list[str] = dataclasses.field(default_factory=list)
    created_at: dt.datetime = dataclasses.field(default_factory=utcnow)


def _json_form(value: Any) -> Any:
    """A value as EurekaClaw's persistent.json gives it back (pydantic's JSON mode, then json.loads):
    tuples and sets as lists, NaN and the infinities as null, other objects as their str()."""
    def mode_json(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, (list, tuple, set, frozenset)):
            return [mode_json(x) for x in v]
        if isinstance(v, dict):
            return {k: mode_json(x) for k, x in v.items()}
        return v

    return json.loads(json.dumps(mode_json(value), default=str))


class ReferenceManager:
    def __init__(self, session_id: str, data_root: Path) -> None:
        self.session_id = session_id
        self.root = data_root
        self._ring: deque[RefEntry] = deque(maxlen=500)
        self._data: dict[str, RefRecord] = {}
        self._nodes: dict[str, RefNode] = {}
        self._edges: list[tuple[str, str, str]] = []

    def reload(self) -> None:
        """What a restart of EurekaClaw does to tier 2: values through JSON."""
        for record in self._data.values():
            record.value = _json_form(record.value)

    # tier 1
    def log_event(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> RefEntry:
        entry = RefEntry(str(uuid.uuid4()), self.session_id, agent_role, content, dict(metadata or {}))
        self._ring.append(entry)
        return entry

    def recent_events(self, n: int = 20, agent_role: str | None = None) -> list[RefEntry]:
        entries = list(self._ring)
        if agent_role:
            entries = [e for e in entries if e.agent_role == agent_role]
        return entries[-n:]

    # tier 2
    def remember(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> None:
        self._data[key] = RefRecord(
            str(uuid.uuid4()), key, value, list(tags or []), source_session,
            updated_at=dt.datetime.now().astimezone(),
        )

    def recall(self, key: str) -> Any | None:
        record = self._data.get(key)
        return record.value if record else None

    def recall_by_tag(self, tag: str) -> list[RefRecord]:
        return [r for r in self._data.values() if tag in r.tags]

    # tier 3
    def add_theorem(
        self, theorem_name: str, formal_statement: str, domain: str = "", session_id: str = "",
        tags: list[str] | None = None,
    ) -> RefNode:
        node = RefNode(str(uuid.uuid4()), theorem_name, formal_statement, domain, session_id, tags=list(tags or []))
        self._nodes[node.node_id] = node
        return node

    def link_theorems(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        if from_id in self._nodes and to_id in self._nodes:
            self._edges.append((from_id, to_id, relation))

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[RefNode]:
        visited = {node_id}
        frontier = {node_id}
        for _ in range(depth):
            step: set[str] = set()
            for nid in frontier:
                step |= {e[1] for e in self._edges if e[0] == nid} | {e[0] for e in self._edges if e[1] == nid}
            step -= visited
            visited |= step
            frontier = step
        visited.discard(node_id)
        return [self._nodes[n] for n in visited if n in self._nodes]

    def retrieve_relevant_theorems(self, query: str, domain: str = "", limit: int = 5) -> list[RefNode]:
        stop = {"theorem", "lemma", "proof", "result", "using", "show", "bound"}

        def tokens(text: str) -> set[str]:
            return {t for t in re.findall(r"[A-Za-z][A-Za-z0-9_]{2,}", text.lower()) if t not in stop}

        wanted = tokens(query)
        if not wanted and not domain:
            return []
        pool = [n for n in self._nodes.values() if domain.lower() in n.domain.lower()] if domain else []
        if not pool:
            pool = list(self._nodes.values())
        scored = []
        for node in pool:
            score = len(wanted & tokens(f"{node.theorem_name}\n{node.formal_statement}"))
            if domain and domain.lower() in node.domain.lower():
                score += 2
            if score > 0:
                scored.append((score, node))
        scored.sort(key=lambda item: (-item[0], item[1].created_at))
        return [node for _s, node in scored[:limit]]

    # .persistent and .graph: EurekaClaw's PersistentMemory and KnowledgeGraph over the same state
    @property
    def persistent(self) -> RefPersistent:
        return RefPersistent(self)

    @property
    def graph(self) -> RefGraph:
        return RefGraph(self)

    # tier 4
    def load_for_injection(self, domain: str, k: int = 4, query: str | None = None) -> str:
        slug = re.sub(r"[^\w]", "_", domain.lower())[:30] if domain else "general"
        folder = self.root / "memories" / slug
        if not folder.exists():
            return ""
        index_path = folder / "_index.json"
        try:
            index = json.loads(index_path.read_text()) if index_path.exists() else {}
        except ValueError:
            index = {}
        found = [
            {"path": folder / name, "created_at": data.get("created_at", dt.datetime.min.isoformat())}
            for name, data in index.items()
            if (folder / name).exists()
        ]
        found.sort(key=lambda item: item["created_at"], reverse=True)
        parts = ["<memories>"]
        for item in found[:k]:
            text = item["path"].read_text(encoding="utf-8")
            parts.append(re.sub(r"^---\n.*?---\n", "", text, flags=re.DOTALL).strip()[:400])
        parts.append("</memories>")
        return "\n\n".join(parts)


class RefPersistent:
    def __init__(self, manager: ReferenceManager) -> None:
        self._m = manager

    def put(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> RefRecord:
        self._m.remember(key, value, tags, source_session)
        return self._m._data[key]

    def get(self, key: str) -> Any | None:
        return self._m.recall(key)

    def get_by_tag(self, tag: str) -> list[RefRecord]:
        return self._m.recall_by_tag(tag)

    def search_keys(self, prefix: str) -> list[RefRecord]:
        return [r for r in self._m._data.values() if r.key.startswith(prefix)]

    def delete(self, key: str) -> None:
        self._m._data.pop(key, None)

    def all_records(self) -> list[RefRecord]:
        return list(self._m._data.values())


class RefGraph:
    def __init__(self, manager: ReferenceManager) -> None:
        self._m = manager

    def add_theorem(
        self, theorem_name: str, formal_statement: str, domain: str = "", session_id: str = "",
        tags: list[str] | None = None,
    ) -> RefNode:
        return self._m.add_theorem(theorem_name, formal_statement, domain, session_id, tags)

    def add_edge(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        self._m.link_theorems(from_id, to_id, relation)

    def find_related(self, node_id: str, depth: int = 2) -> list[RefNode]:
        return self._m.find_related_theorems(node_id, depth)

    def search_by_domain(self, domain: str) -> list[RefNode]:
        return [n for n in self._m._nodes.values() if domain.lower() in n.domain.lower()]

    def search_by_tag(self, tag: str) -> list[RefNode]:
        return [n for n in self._m._nodes.values() if tag in n.tags]

    def all_nodes(self) -> list[RefNode]:
        return list(self._m._nodes.values())

    def to_networkx(self) -> Any:
        import networkx as nx

        graph = nx.DiGraph()
        for node_id, node in self._m._nodes.items():
            graph.add_node(node_id, **{k: v for k, v in dataclasses.asdict(node).items() if k != "related_to"})
        for from_id, to_id, relation in self._m._edges:
            graph.add_edge(from_id, to_id, relation=relation)
        return graph

    def stats(self) -> dict[str, int]:
        return {"nodes": len(self._m._nodes), "edges": len(self._m._edges)}


def pydantic_models() -> dict[str, Any]:
    """EurekaClaw's record types (eurekaclaw/types/memory.py) restated field by field as pydantic
    models, by name (EpisodicEntry, CrossRunRecord, KnowledgeNode): naive created_at/timestamp from
    utcnow, as its defaults. pydantic comes with the test extra (the mcp SDK needs it)."""
    import pydantic

    class EpisodicEntry(pydantic.BaseModel):
        entry_id: str
        session_id: str
        agent_role: str
        content: str
        metadata: dict[str, Any] = pydantic.Field(default_factory=dict)
        timestamp: dt.datetime = pydantic.Field(default_factory=utcnow)

    class CrossRunRecord(pydantic.BaseModel):
        record_id: str
        key: str
        value: Any
        tags: list[str] = pydantic.Field(default_factory=list)
        source_session: str = ""
        created_at: dt.datetime = pydantic.Field(default_factory=utcnow)
        updated_at: dt.datetime = pydantic.Field(default_factory=utcnow)

    class KnowledgeNode(pydantic.BaseModel):
        node_id: str
        theorem_name: str
        formal_statement: str
        domain: str = ""
        session_id: str = ""
        related_to: list[str] = pydantic.Field(default_factory=list)
        tags: list[str] = pydantic.Field(default_factory=list)
        created_at: dt.datetime = pydantic.Field(default_factory=utcnow)

    return {"EpisodicEntry": EpisodicEntry, "CrossRunRecord": CrossRunRecord, "KnowledgeNode": KnowledgeNode}
