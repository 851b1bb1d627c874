"""Tier 4 in files: what the projection owes (memories/<slug>/*.md, _index.json, MEMORY.md and
GLOBAL.md), and a memory file read back as a Memory.

Rule kept here: the projection owes a file for every change of its memory (MemoryState._put and
_purge mark it here) and is told of each file it could not write (`redirty`), so every change
reaches the files at the next projection; what it owes is taken and cleared in one call under the
state's owner. A file read back (`memory_from_text`) is read leniently, as EurekaClaw writes it.
"""

from __future__ import annotations

import datetime as _dt
import json
import uuid
from typing import Any

import msgspec
import numpy as np

from ...protocol import MEMORY_CATEGORIES, Memory, domain_slug, normalize_timestamp
from ...protocol import methods as m
from .data import MemoryData
from .format import derive_abstract, derive_overview, fingerprint, parse_markdown
from .records import PutMemory


class Projection(MemoryData):
    """What the file projection owes, over MemoryData (module rule)."""

    def __init__(self, embedder: Any, files_root: str = "memories") -> None:
        super().__init__(embedder, files_root)
        self.dirty: dict[str, None] = {}  # ids whose file must be (re)written
        self.removed_files: dict[str, None] = {}  # files to delete or move
        self.dirty_domains: dict[str, None] = {}  # domain slugs whose _index.json must be rewritten
        self.global_dirty = False  # memories/GLOBAL.md must be rewritten

    def file_owner(self, relative: str) -> str | None:
        """The id of the memory whose file this is (relative to the data root), if any."""
        return self._files.get(relative)

    def is_dirty(self, memory_id: str) -> bool:
        """Does the projection still owe this memory's file?"""
        return memory_id in self.dirty

    def _changed(self, memory: Memory) -> None:
        self.dirty[memory.id] = None
        self.dirty_domains[domain_slug(memory.domain)] = None
        self._version += 1

    def separate_shared_files(self) -> list[str]:
        """Give every memory that shares its file with another (archives before issue 16 could)
        a name of its own, journaled like any change; the one keeping the name is rewritten too,
        since the file may hold the other's text. Returns the ids renamed."""
        owner: dict[str, Memory] = {}
        renamed: list[str] = []
        for memory in sorted(self.memories.values(), key=lambda mem: (mem.updated_at, mem.id)):
            kept = owner.get(memory.file)
            if kept is None:
                owner[memory.file] = memory
                continue
            base = memory.file.removesuffix(".md")
            moved = msgspec.structs.replace(memory, file=self._free_name(base, memory.fingerprint))
            self.commit(PutMemory(moved, self.model_of.get(memory.id, ""), self.vector_bytes(memory.id)))
            self._files[kept.file] = kept.id
            self._changed(kept)
            renamed.append(memory.id)
        return renamed

    def take_readable(self) -> list[tuple[str, str, list[tuple[Memory, float]], bool]]:
        """The readable projection owed (call it before take_projection, which clears the dirty
        domains): (file, domain, [(memory, strength)], whether GLOBAL.md lists anything) for
        memories/<slug>/MEMORY.md of each changed domain (its active local memories valid now)
        and for memories/GLOBAL.md (every global one) when a global memory changed."""
        now = self.wall()
        out = [self.readable_document(slug, now) for slug in self.dirty_domains]
        if self.global_dirty:
            self.global_dirty = False
            out.append(self.readable_document(None, now))
        return out

    def readable_document(
        self, slug: str | None, now: float | None = None, name: str | None = None
    ) -> tuple[str, str, list[tuple[Memory, float]], bool]:
        """What one file of the readable projection shows now: MEMORY.md of the domain `slug`
        (None: GLOBAL.md), as take_readable gives it (also for memory.list's `readable`); `name`
        titles a domain that holds no memory (else its slug does)."""
        now = self.wall() if now is None else now
        current = self._current_labels(now)
        has_global = bool(len(current)) and bool(self.columns.is_global[current].any())
        if slug is None:
            labels = self.columns.labels(scope="global", valid_at=now)
            return f"{self.files_root}/GLOBAL.md", "", self._with_strength(labels, now), has_global
        labels = self.columns.labels(slug=slug, scope="local", valid_at=now)
        ids = self._domains.get(slug) or {}
        title = self.memories[next(iter(ids))].domain if ids else (name if name is not None else slug)
        return f"{self.files_root}/{slug}/MEMORY.md", title, self._with_strength(labels, now), has_global

    def _with_strength(self, labels: np.ndarray, now: float) -> list[tuple[Memory, float]]:
        power = self.columns.strengths(labels, now, self.settings).tolist()
        return [(self.memories[self._id_of[label]], value) for label, value in zip(labels.tolist(), power)]

    def mark_readable_dirty(self) -> None:
        """Every MEMORY.md and GLOBAL.md is rewritten at the next projection (strength moves with
        time alone, and so does the order; maintenance calls this once a night)."""
        for slug in self._domains:
            self.dirty_domains[slug] = None
        self.global_dirty = True

    def take_projection(self) -> tuple[list[Memory], list[str], dict[str, list[Memory]]]:
        """What the file projector must write: changed memories, files to remove, domain indexes."""
        changed = [self.memories[i] for i in self.dirty if i in self.memories]
        removed = [f for f in self.removed_files if f not in self._files]
        indexes = {
            slug: [self.memories[i] for i in self._domains.get(slug, ()) if self.memories[i].status == "active"]
            for slug in self.dirty_domains
        }
        self.dirty.clear()
        self.removed_files.clear()
        self.dirty_domains.clear()
        return changed, removed, indexes

    def redirty(self, ids: list[str], removed: list[str], domains: list[str], readable_global: bool = False) -> None:
        """Put back a projection that could not be written."""
        if readable_global:
            self.global_dirty = True
        for memory_id in ids:
            if memory_id in self.memories:
                self.dirty[memory_id] = None
        for relative in removed:
            self.removed_files[relative] = None
        for slug in domains:
            self.dirty_domains[slug] = None


def memory_from_text(relative: str, text: str, mtime: float) -> Memory | None:
    """A memory file (EurekaClaw's, a person's or ours; relative to the data root) as a Memory,
    read leniently; None when it holds no text. The domain is the frontmatter's, else the file's
    folder's; the id the frontmatter's, else one derived from the path."""
    fields, content, heading = parse_markdown(text)
    parts = relative.split("/")
    folder = parts[-3] if len(parts) >= 4 and parts[-2] == "_archive" else parts[-2] if len(parts) >= 2 else "general"
    stem = parts[-1].removesuffix(".md")
    if len(stem) > 9 and stem[:8].isdigit() and stem[8] == "_":  # EurekaClaw's YYYYMMDD_<slug>
        stem = stem[9:]
    title = str(fields.get("title") or heading or stem.replace("_", " ").strip() or "untitled")
    if not content.strip():
        return None
    category = str(fields.get("category") or "domain_knowledge")
    if category not in MEMORY_CATEGORIES:
        category = "domain_knowledge"
    try:
        confidence = min(1.0, max(0.0, float(fields.get("confidence", 0.8))))
    except (TypeError, ValueError):
        confidence = 0.8
    if confidence != confidence:  # NaN
        confidence = 0.8
    fallback = _dt.datetime.fromtimestamp(mtime, _dt.UTC).isoformat()
    try:
        created = normalize_timestamp(fields.get("created_at"))
    except (TypeError, ValueError):
        created = fallback
    tags = fields.get("tags")
    domain = str(fields.get("domain") or folder)
    archived = "/_archive/" in relative
    return Memory(
        id=str(fields.get("id") or uuid.uuid5(uuid.NAMESPACE_URL, "eurekamem:" + relative)),
        domain=domain,
        category=category,
        title=title,
        content=content,
        abstract=str(fields.get("abstract") or derive_abstract(content)),
        overview=derive_overview(content),
        confidence=round(confidence, 4),
        tags=[str(t) for t in tags] if isinstance(tags, list) else [],
        scope="global" if fields.get("scope") == "global" else "local",
        source_session=str(fields.get("source_session") or ""),
        fingerprint=fingerprint(title, content),
        created_at=created,
        updated_at=_timestamp_or(fields.get("updated_at"), created),
        status="archived" if archived else "active",
        file=relative,
        # the lifecycle fields, as render_markdown writes them (absent in EurekaClaw's files)
        pinned=frontmatter_flag(fields.get("pinned")),
        valid_from=_timestamp_or(fields.get("valid_from"), None),
        valid_until=_timestamp_or(fields.get("valid_until"), None),
        superseded_by=str(fields["superseded_by"]) if fields.get("superseded_by") else None,
        last_used=_timestamp_or(fields.get("last_used"), None),
        used_count=_count(fields.get("used_count")),
        ignored_count=_count(fields.get("ignored_count")),
        wrong_count=_count(fields.get("wrong_count")),
        archived_reason=str(fields.get("archived_reason") or "") if archived else "",
        raw=frontmatter_flag(fields.get("raw")),
        attributed_to=str(fields["attributed_to"]) if fields.get("attributed_to") else None,
        source_message_ids=_id_list(fields.get("source_message_ids")),
        refers_to=_timestamp_or(fields.get("refers_to"), None),
    )


def _id_list(value: Any) -> list[str]:
    """source_message_ids as render_markdown writes it (a JSON list), or [] when absent or unreadable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(item) for item in value][: m.MAX_SOURCE_IDS] if isinstance(value, list) else []


def _timestamp_or(value: Any, fallback: Any) -> Any:
    try:
        return normalize_timestamp(value)
    except (TypeError, ValueError):
        return fallback


def frontmatter_flag(value: Any) -> bool:
    """A frontmatter boolean, read leniently (true / yes / 1)."""
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def _count(value: Any) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0
