"""EurekaClaw's snapshot files: persistent.json and knowledge_graph.json, read leniently, written exactly.

Rule kept here: reading never loses what a file holds — naive, offset and 'Z' timestamps are
normalised to RFC 3339, missing ids and timestamps are filled in, duplicate edges collapse to one
(counted: the file gets them back as often as it listed them), edges to unknown nodes are kept — and a file that cannot be read at all raises SnapshotReadError naming
the file, instead of starting with an empty tier. EurekaClaw's keys are any str; a key the protocol
cannot carry ("", or longer than MAX_KEY) is held under the name the drop-in sends for it
(client/_manager.py, _Names.fit) and written back as EurekaClaw gave it. Writing produces the shapes EurekaClaw's own code
writes (`json.dumps(indent=2)` of its pydantic models in JSON mode: its field order, ASCII escapes,
created_at naive UTC and updated_at aware local time), so EurekaClaw's own code reads them unchanged.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from ...protocol import (
    CrossRunRecord,
    KnowledgeNode,
    normalize_timestamp,
    now_rfc3339,
)
from ...protocol.methods import MAX_KEY

log = logging.getLogger("eurekamem.import")


class SnapshotReadError(Exception):
    """A snapshot file exists but is not readable as EurekaClaw's format."""


def _timestamp(value: Any, fallback: str) -> str:
    try:
        return normalize_timestamp(value)
    except (ValueError, TypeError):
        return fallback


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value if v is not None]
    return []


# EurekaClaw's persistent keys are any str (PersistentMemory.put("") and a 2,000-character key work);
# the protocol's are 1 to MAX_KEY characters. The drop-in sends such a key fitted, always the same
# way: "" as "~" + 16 hex digits of its sha256, an over-long key as its first MAX_KEY - 17 characters
# + "~" + the hash of the whole (client/_manager.py, _Names.fit; a test pins that both agree). So a
# record read from the file is held under the fitted key (the drop-in finds it), and the file gets
# EurekaClaw's key back (its own PersistentMemory.get finds it after an uninstall): "" from its
# fixed fitted name, an over-long key from the originals read from the files, remembered here for
# the process (the inverse of the fit for the keys seen; a daemon reads its persistent.json at every
# start). An over-long key first stored through the drop-in reaches the daemon fitted only, and
# stays so in the file.


def _short(text: str) -> str:
    return "~" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


_EMPTY_KEY = _short("")
_original_keys: dict[str, str] = {}  # fitted key -> the over-long key EurekaClaw wrote


def protocol_key(key: str) -> str:
    """The key the protocol (and the drop-in) uses for EurekaClaw's `key`."""
    if 0 < len(key) <= MAX_KEY:
        return key
    if not key:
        return _EMPTY_KEY
    fitted = key[: MAX_KEY - 17] + _short(key)
    _original_keys[fitted] = key
    return fitted


def eurekaclaw_key(key: str) -> str:
    """The key EurekaClaw gave for the protocol's `key` (itself, unless it was fitted)."""
    if key == _EMPTY_KEY:
        return ""
    return _original_keys.get(key, key) if len(key) == MAX_KEY else key


def read_persistent(data: bytes, name: str = "persistent.json") -> dict[str, CrossRunRecord]:
    try:
        raw = json.loads(data) if data.strip() else {}
    except ValueError as exc:
        raise SnapshotReadError(f"{name}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise SnapshotReadError(f"{name}: expected an object of key -> record, got {type(raw).__name__}")
    now = now_rfc3339()
    out: dict[str, CrossRunRecord] = {}
    for key, item in raw.items():
        if not isinstance(item, dict):
            item = {"value": item}  # a bare value under a key: keep it
        created = _timestamp(item.get("created_at"), now)
        fitted = protocol_key(str(item["key"]) if isinstance(item.get("key"), str) else key)
        out[fitted] = CrossRunRecord(
            record_id=str(item.get("record_id") or uuid.uuid4()),
            key=fitted,
            value=item.get("value"),
            tags=_str_list(item.get("tags")),
            source_session=str(item.get("source_session") or ""),
            created_at=created,
            updated_at=_timestamp(item.get("updated_at"), created),
        )
    return out


def read_graph(
    data: bytes, name: str = "knowledge_graph.json"
) -> tuple[dict[str, KnowledgeNode], dict[tuple[str, str, str], int]]:
    """The nodes by id, and each distinct edge with the number of times the file lists it
    (EurekaClaw's add_edge appends duplicates)."""
    try:
        raw = json.loads(data) if data.strip() else {}
    except ValueError as exc:
        raise SnapshotReadError(f"{name}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise SnapshotReadError(f"{name}: expected an object with nodes and edges")
    now = now_rfc3339()
    nodes: dict[str, KnowledgeNode] = {}
    raw_nodes = raw.get("nodes") or {}
    if isinstance(raw_nodes, list):  # tolerate a list of node objects
        raw_nodes = {str(n.get("node_id") or uuid.uuid4()): n for n in raw_nodes if isinstance(n, dict)}
    for node_id, item in raw_nodes.items():
        if not isinstance(item, dict):
            continue
        node_id = str(item.get("node_id") or node_id)
        nodes[node_id] = KnowledgeNode(
            node_id=node_id,
            theorem_name=str(item.get("theorem_name") or ""),
            formal_statement=str(item.get("formal_statement") or ""),
            domain=str(item.get("domain") or ""),
            session_id=str(item.get("session_id") or ""),
            related_to=_str_list(item.get("related_to")),
            tags=_str_list(item.get("tags")),
            created_at=_timestamp(item.get("created_at"), now),
        )
    edges: dict[tuple[str, str, str], int] = {}
    dropped = 0
    for item in raw.get("edges") or []:
        if isinstance(item, dict):
            item = [item.get("from_id", item.get("source")), item.get("to_id", item.get("target")), item.get("relation")]
        if not isinstance(item, (list, tuple)) or len(item) < 2 or item[0] is None or item[1] is None:
            dropped += 1
            continue
        relation = str(item[2]) if len(item) > 2 and item[2] else "uses"
        edge = (str(item[0]), str(item[1]), relation)
        edges[edge] = edges.get(edge, 0) + 1
    if dropped:
        log.warning("%s: %d edge entries were not [from, to, relation] and were skipped", name, dropped)
    return nodes, edges


# EurekaClaw's timestamps, as its pydantic models give them (eurekaclaw/types/memory.py): created_at
# naive UTC (`datetime.utcnow`), a CrossRunRecord's updated_at aware local time
# (`datetime.now().astimezone()`), each as pydantic's JSON mode writes it (an offset of zero as "Z").
# Its own code compares them (retrieve_relevant_theorems sorts nodes by created_at), so a file that
# mixed naive and aware values would make it raise TypeError.


def _parsed(value: str) -> _dt.datetime:
    when = _dt.datetime.fromisoformat(normalize_timestamp(value))
    return when if when.tzinfo is not None else when.replace(tzinfo=_dt.UTC)


def eurekaclaw_naive_utc(value: str) -> str:
    """An RFC 3339 timestamp as EurekaClaw writes a created_at: naive UTC."""
    return _parsed(value).astimezone(_dt.UTC).replace(tzinfo=None).isoformat()


def eurekaclaw_local(value: str) -> str:
    """An RFC 3339 timestamp as EurekaClaw writes an updated_at: local time with its offset."""
    text = _parsed(value).astimezone().isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _dumps(doc: Any) -> bytes:
    # EurekaClaw writes json.dumps(..., indent=2): ASCII escapes, its separators, no final newline
    return json.dumps(doc, indent=2).encode()


def write_persistent(records: dict[str, CrossRunRecord]) -> bytes:
    out = {}
    for key, record in records.items():
        doc = record.to_dict()
        doc["key"] = eurekaclaw_key(record.key)
        doc["created_at"] = eurekaclaw_naive_utc(record.created_at)
        doc["updated_at"] = eurekaclaw_local(record.updated_at)
        out[eurekaclaw_key(key)] = doc
    return _dumps(out)


def write_graph(nodes: dict[str, KnowledgeNode], edges: Mapping[tuple[str, str, str], int | None]) -> bytes:
    """`edges`: each distinct edge, with how often EurekaClaw's file listed it (None: once)."""
    out = {}
    for node_id, node in nodes.items():
        doc = node.to_dict()
        doc["theorem_name"] = eurekaclaw_key(node.theorem_name)  # the drop-in sends EurekaClaw's "" fitted
        doc["created_at"] = eurekaclaw_naive_utc(node.created_at)
        out[node_id] = doc
    return _dumps({"nodes": out, "edges": [list(e) for e, copies in edges.items() for _ in range(copies or 1)]})
