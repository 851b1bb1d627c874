"""Tier 2: cross-run key-value records with tags, and the mutations that change them.

Rule kept here: every mutation carries the whole resulting record, so replaying one twice gives
the same state; overwriting a key keeps its record_id and created_at. An import may give a new
key's record_id and times (its history); an overwrite keeps the held record's id and created_at.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import (
    CrossRunRecord,
    ProtocolError,
    new_id,
    normalize_timestamp,
)
from ...protocol import methods as m
from ..tier import TierState, Undo, handles


def imported_time(field: str, value: str | None, default: str) -> str:
    """An import's timestamp param as RFC 3339 (`default` when not given); invalid_params naming
    the field when it is not one."""
    if value is None:
        return default
    try:
        return normalize_timestamp(value)
    except (TypeError, ValueError):
        raise ProtocolError("invalid_params", f"invalid params: {field} {value!r} is not an RFC 3339 timestamp", field=field) from None


class PutRecord(msgspec.Struct, tag="persistent.put"):
    record: CrossRunRecord


class DeleteKey(msgspec.Struct, tag="persistent.delete"):
    key: str


class PersistentState(TierState):
    """Cross-run key-value records with a tag index."""

    name = "persistent"

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, CrossRunRecord] = {}
        self._by_tag: dict[str, dict[str, None]] = {}

    # handlers
    @handles("persistent.remember")
    def do_remember(self, p: m.PersistentRemember) -> CrossRunRecord:
        old = self.records.get(p.key)
        created = imported_time("created_at", p.created_at, self.now())
        updated = imported_time("updated_at", p.updated_at, self.now() if p.created_at is None else created)
        record = CrossRunRecord(
            record_id=old.record_id if old else (p.record_id or new_id()),
            key=p.key,
            value=p.value,
            tags=list(dict.fromkeys(p.tags)),
            source_session=p.source_session,
            created_at=old.created_at if old else created,
            updated_at=updated,
        )
        self.commit(PutRecord(record))
        return record

    @handles("persistent.recall")
    def do_recall(self, p: m.PersistentKey) -> CrossRunRecord | None:
        return self.records.get(p.key)

    @handles("persistent.by_tag")
    def do_by_tag(self, p: m.PersistentByTag) -> list[CrossRunRecord]:
        return [self.records[k] for k in self._by_tag.get(p.tag, ())]

    @handles("persistent.forget")
    def do_forget(self, p: m.PersistentKey) -> dict[str, bool]:
        if p.key not in self.records:
            return {"deleted": False}
        self.commit(DeleteKey(p.key))
        return {"deleted": True}

    @handles("persistent.keys")
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
        # an overwrite keeps the key's place (EurekaClaw's dict, and so persistent.json's order)
        old = self.records.get(key) if record is not None else self.records.pop(key, None)
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


