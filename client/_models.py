"""EurekaClaw's memory records as its MemoryManager returns them, without pydantic or EurekaClaw.

EurekaClaw's types (eurekaclaw/types/memory.py, v0.2.0) are pydantic models whose timestamps are
datetimes: `EpisodicEntry.timestamp`, `CrossRunRecord.created_at` and `KnowledgeNode.created_at`
are naive UTC (`datetime.utcnow`), while `CrossRunRecord.updated_at` is aware, in the local zone
(`datetime.now().astimezone()`). These Structs have the same names, fields, defaults and
timestamp kinds, compare equal field by field, and offer the pydantic calls agents use on them
(`model_dump`, `model_dump_json`, `model_copy`). The wire's records (eurekamem.protocol) carry RFC
3339 strings; `from_wire` turns them into these.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, cast

import msgspec

from ..protocol import CrossRunRecord as WireRecord
from ..protocol import EpisodicEntry as WireEntry
from ..protocol import KnowledgeNode as WireNode

__all__ = ["CrossRunRecord", "EpisodicEntry", "KnowledgeNode", "from_wire", "naive_utc", "local_aware"]


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC).replace(tzinfo=None)


def _parse(value: str) -> _dt.datetime:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = _dt.datetime.fromisoformat(text)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=_dt.UTC)


def naive_utc(value: str) -> _dt.datetime:
    """An RFC 3339 string as EurekaClaw's utcnow() datetimes are: UTC, without tzinfo."""
    return _parse(value).astimezone(_dt.UTC).replace(tzinfo=None)


def local_aware(value: str) -> _dt.datetime:
    """An RFC 3339 string as EurekaClaw's `datetime.now().astimezone()`: aware, in the local zone."""
    return _parse(value).astimezone()


class _Model(msgspec.Struct, kw_only=True):
    """The pydantic surface EurekaClaw's agents and UI use on records."""

    def model_dump(self, *, mode: str = "python", **_ignored: Any) -> dict[str, Any]:
        if mode == "json":
            return cast(dict[str, Any], msgspec.to_builtins(self))  # datetimes as ISO 8601, as pydantic's mode="json"
        return {f: _copy(getattr(self, f)) for f in self.__struct_fields__}

    def model_dump_json(self, *, indent: int | None = None, **_ignored: Any) -> str:
        data = msgspec.json.encode(self)
        return (msgspec.json.format(data, indent=indent) if indent else data).decode()

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any:
        fields = self.model_dump() if deep else {f: getattr(self, f) for f in self.__struct_fields__}
        fields.update(update or {})
        return type(self)(**fields)

    # pydantic v1 names, still accepted by pydantic v2 (with a warning there)
    def dict(self, **kw: Any) -> dict[str, Any]:
        return self.model_dump(**kw)

    def json(self, **kw: Any) -> str:
        return self.model_dump_json(**kw)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class EpisodicEntry(_Model, kw_only=True):
    """Within-session episodic memory entry."""

    entry_id: str
    session_id: str
    agent_role: str
    content: str
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    timestamp: _dt.datetime = msgspec.field(default_factory=_utcnow)


class CrossRunRecord(_Model, kw_only=True):
    """Cross-session persistent memory record."""

    record_id: str
    key: str
    value: Any
    tags: list[str] = msgspec.field(default_factory=list)
    source_session: str = ""
    created_at: _dt.datetime = msgspec.field(default_factory=_utcnow)
    updated_at: _dt.datetime = msgspec.field(default_factory=_utcnow)


class KnowledgeNode(_Model, kw_only=True):
    """Node in the cross-project theorem knowledge graph."""

    node_id: str
    theorem_name: str
    formal_statement: str
    domain: str = ""
    session_id: str = ""
    related_to: list[str] = msgspec.field(default_factory=list)
    tags: list[str] = msgspec.field(default_factory=list)
    created_at: _dt.datetime = msgspec.field(default_factory=_utcnow)


def from_wire(record: Any) -> Any:
    """A protocol record as the EurekaClaw-shaped model above (other values are returned as they are)."""
    if isinstance(record, WireEntry):
        return EpisodicEntry(
            entry_id=record.entry_id,
            session_id=record.session_id,
            agent_role=record.agent_role,
            content=record.content,
            metadata=record.metadata,
            timestamp=naive_utc(record.timestamp),
        )
    if isinstance(record, WireRecord):
        return CrossRunRecord(
            record_id=record.record_id,
            key=record.key,
            value=record.value,
            tags=record.tags,
            source_session=record.source_session,
            created_at=naive_utc(record.created_at),
            updated_at=local_aware(record.updated_at),
        )
    if isinstance(record, WireNode):
        return KnowledgeNode(
            node_id=record.node_id,
            theorem_name=record.theorem_name,
            formal_statement=record.formal_statement,
            domain=record.domain,
            session_id=record.session_id,
            related_to=record.related_to,
            tags=record.tags,
            created_at=naive_utc(record.created_at),
        )
    return record
