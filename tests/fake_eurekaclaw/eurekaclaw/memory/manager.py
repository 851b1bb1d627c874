"""eurekaclaw.memory.manager.MemoryManager: EurekaClaw's public methods and signatures, kept in RAM
and in memory_dir/persistent.json (the stand-in for EurekaClaw's own tiers)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from eurekaclaw.config import settings
from eurekaclaw.types.memory import CrossRunRecord, EpisodicEntry, KnowledgeNode


class MemoryManager:
    """Unified read/write interface across all memory tiers."""

    def __init__(self, session_id: str, memory_dir: Path | None = None) -> None:
        memory_dir = memory_dir or settings.memory_dir
        memory_dir.mkdir(parents=True, exist_ok=True)
        self.session_id = session_id
        self._file = memory_dir / "persistent.json"
        self._events: list[EpisodicEntry] = []
        self._nodes: dict[str, KnowledgeNode] = {}
        self._edges: list[tuple[str, str, str]] = []

    def log_event(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> EpisodicEntry:
        entry = EpisodicEntry(session_id=self.session_id, agent_role=agent_role, content=content, metadata=metadata or {})
        self._events.append(entry)
        return entry

    def recent_events(self, n: int = 20, agent_role: str | None = None) -> list[EpisodicEntry]:
        entries = [e for e in self._events if e.agent_role == agent_role] if agent_role else self._events
        return entries[-n:]

    def _records(self) -> dict[str, Any]:
        return json.loads(self._file.read_text()) if self._file.exists() else {}

    def remember(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> None:
        records = self._records()
        records[key] = CrossRunRecord(key=key, value=value, tags=tags or [], source_session=source_session).model_dump(
            mode="json"
        )
        self._file.write_text(json.dumps(records))

    def recall(self, key: str) -> Any | None:
        record = self._records().get(key)
        return record["value"] if record else None

    def recall_by_tag(self, tag: str) -> list[CrossRunRecord]:
        return [CrossRunRecord.model_validate(r) for r in self._records().values() if tag in r["tags"]]

    def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> KnowledgeNode:
        node = KnowledgeNode(
            theorem_name=theorem_name, formal_statement=formal_statement, domain=domain, session_id=session_id,
            tags=tags or [],
        )
        self._nodes[node.node_id] = node
        return node

    def link_theorems(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        if from_id in self._nodes and to_id in self._nodes:
            self._edges.append((from_id, to_id, relation))

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        near = {b for a, b, _ in self._edges if a == node_id} | {a for a, b, _ in self._edges if b == node_id}
        return [self._nodes[i] for i in near]

    def retrieve_relevant_theorems(self, query: str, domain: str = "", limit: int = 5) -> list[KnowledgeNode]:
        words = set(query.lower().split())
        return [n for n in self._nodes.values() if words & set(n.theorem_name.lower().split())][:limit]

    def load_for_injection(self, domain: str, k: int = 4, query: str | None = None) -> str:
        slug = re.sub(r"[^\w]", "_", domain.lower())[:30] if domain else "general"
        folder = settings.eurekaclaw_dir / "memories" / slug
        if not folder.exists():
            return ""
        bodies = [p.read_text(encoding="utf-8")[:400] for p in sorted(folder.glob("*.md"))[:k]]
        return "\n\n".join(["<memories>", *bodies, "</memories>"])
