"""A data root's files read as EurekaClaw's own manager reads them, for the daemon away.

Rule kept here: what EurekaClaw (v0.2.0) would answer from the same files, and nothing more —
<memory>/persistent.json (key -> CrossRunRecord as JSON), <memory>/knowledge_graph.json
({"nodes": {id: KnowledgeNode}, "edges": [[from, to, relation]]}), memories/<slug>/_index.json and
the .md files it names. Files that are missing or unreadable read as empty (as EurekaClaw's loaders
log and go on). Standard library only: the client never imports the daemon. A file is parsed again
only when its size or modification time changed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ._models import CrossRunRecord, KnowledgeNode, local_aware, naive_utc

__all__ = ["RootFiles"]

log = logging.getLogger("eurekamem.client")


def _str_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _record(key: str, raw: Any) -> CrossRunRecord | None:
    if not isinstance(raw, dict):
        return None
    try:
        return CrossRunRecord(
            record_id=str(raw.get("record_id", "")),
            key=str(raw.get("key", key)),
            value=raw.get("value"),
            tags=_str_list(raw.get("tags")),
            source_session=str(raw.get("source_session", "")),
            created_at=naive_utc(str(raw["created_at"])),
            updated_at=local_aware(str(raw["updated_at"])),
        )
    except (KeyError, ValueError, TypeError):
        return None


def _node(node_id: str, raw: Any) -> KnowledgeNode | None:
    if not isinstance(raw, dict):
        return None
    try:
        return KnowledgeNode(
            node_id=str(raw.get("node_id", node_id)),
            theorem_name=str(raw["theorem_name"]),
            formal_statement=str(raw["formal_statement"]),
            domain=str(raw.get("domain", "")),
            session_id=str(raw.get("session_id", "")),
            related_to=_str_list(raw.get("related_to")),
            tags=_str_list(raw.get("tags")),
            created_at=naive_utc(str(raw["created_at"])),
        )
    except (KeyError, ValueError, TypeError):
        return None


class RootFiles:
    """The EurekaClaw files of one data root (memory_dir: where persistent.json and
    knowledge_graph.json are; data_dir: the root, whose memories/ holds tier 4)."""

    def __init__(self, memory_dir: Path, data_dir: Path) -> None:
        self.memory_dir = memory_dir
        self.data_dir = data_dir
        self._cache: dict[Path, tuple[tuple[int, int], Any]] = {}
        self._lock = threading.Lock()

    def _json(self, path: Path) -> Any:
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # half written by another program, or not JSON
            log.warning("%s not readable while eurekamem is away: %s", path, exc)
            return None
        with self._lock:
            self._cache[path] = (stamp, doc)
        return doc

    def records(self) -> dict[str, CrossRunRecord]:
        """persistent.json's records, in the file's (EurekaClaw's dict) order."""
        doc = self._json(self.memory_dir / "persistent.json")
        out: dict[str, CrossRunRecord] = {}
        if isinstance(doc, dict):
            for key, raw in doc.items():
                record = _record(key, raw)
                if record is not None:
                    out[key] = record
        return out

    def graph(self) -> tuple[dict[str, KnowledgeNode], list[tuple[str, str, str]]]:
        """knowledge_graph.json's nodes and edges (duplicates kept, as EurekaClaw keeps them)."""
        doc = self._json(self.memory_dir / "knowledge_graph.json")
        nodes: dict[str, KnowledgeNode] = {}
        edges: list[tuple[str, str, str]] = []
        if isinstance(doc, dict):
            raw_nodes = doc.get("nodes")
            if isinstance(raw_nodes, dict):
                for node_id, raw in raw_nodes.items():
                    node = _node(str(node_id), raw)
                    if node is not None:
                        nodes[node.node_id] = node
            raw_edges = doc.get("edges")
            if isinstance(raw_edges, list):
                for edge in raw_edges:
                    if isinstance(edge, list) and len(edge) >= 3:
                        edges.append((str(edge[0]), str(edge[1]), str(edge[2])))
        return nodes, edges

    def domain_memories(self, slug: str) -> list[tuple[str, Path]] | None:
        """memories/<slug>/'s memories as EurekaClaw's load_for_injection lists them: (created_at,
        file) for each _index.json entry whose file exists, in the index's order; None when the
        folder does not exist (EurekaClaw answers "" then)."""
        folder = self.data_dir / "memories" / slug
        if not folder.is_dir():
            return None
        index = self._json(folder / "_index.json")
        out: list[tuple[str, Path]] = []
        if isinstance(index, dict):
            for filename, data in index.items():
                path = folder / str(filename)
                if path.is_file():
                    created = data.get("created_at") if isinstance(data, dict) else None
                    out.append((str(created) if created is not None else "0001-01-01T00:00:00", path))
        return out
