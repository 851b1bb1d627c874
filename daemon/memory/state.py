"""Tier 4 state: the memory.* handlers, `apply` and the upkeep of every index (MemoryState).

Rule kept here: the MemoryActor runs everything in this module in a worker thread, one batch at a
time, so the state has one owner and the event loop never waits on an embedding or an index.
Changes go through `apply` (PutMemory / PurgeMemory, in records.py, carry the whole memory and its
vector) so replay equals run time; embeddings are computed before the handlers run, in one batch
per request batch.
Access counts are statistics: they change without a journal record and are saved with snapshots.
Versions: a PutMemory with `version` > 0 is a new version of its memory (created, merged, updated,
archived) and carries the decision and its reason; `apply` keeps the superseded version in the
memory's history, keyed by version number, so replaying a record the state already holds (or an
older one before a newer) ends with the same history (memory.history).

MemoryState is one object built of parts, each in a module of its own over the data of data.py:
search.py (filters, the two retrievers, the person boost, fusion), dedup.py (near duplicates and
merges), projection.py (what the files owe; a file read back as a memory). Each part keeps only
the state it owns; the actor calls MemoryState alone, and `_put` / `_purge` here keep every part's
index in step. Plain functions do the rest: params.py checks params, prepared.py reads a batch's
requests before it runs, inject.py builds memory.inject's block, columns.py holds the filters' rows.
"""

from __future__ import annotations

import heapq
import logging
import uuid
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from ...protocol import MEMORY_CATEGORIES, Memory, MemoryVersion, ProtocolError, domain_slug
from ...protocol import methods as m
from ...protocol.blocks import MEMORIES_NOTE
from ..retrieval.lexical import LexicalIndex
from ..retrieval.text import estimate_tokens
from ..retrieval.vectors import VectorStore
from ..tier import HANDLERS, Undo, handles
from .data import memory_text
from .dedup import Dedup
from .format import derive_abstract, derive_overview, fingerprint
from .inject import fit_memories, fit_messages, summary_part
from .params import (
    MIN_CONFIDENCE,
    check_order,
    check_text,
    check_title,
    time_param,
    updated_text,
    validate_domain,
    validity,
)
from .prepared import Prepared
from .projection import Projection, memory_from_text
from .records import MaintenanceRecord, MemorySnapshot, PurgeMemory, PutMemory, VersionEntry
from .review import PutReview, apply_review
from .search import Search
from .strength import epoch, outlook

log = logging.getLogger("eurekamem.memory")


MAX_VERSIONS = 100  # versions kept in a memory's history (the oldest go first)


MAINTENANCE_RUNS_KEPT = 8


class MemoryState(Search, Dedup, Projection):
    """Tier 4's one state: its data (data.py) and parts, the handlers, `apply` (module rule)."""

    name = "memory"

    def run(self, name: str, params: Any, prepared: Prepared) -> Any:
        self._prepared = prepared
        return HANDLERS[name].fn(self, params)

    @handles("memory.add")
    def do_add(self, p: m.MemoryAdd) -> dict[str, Any]:
        return self.add(p)

    def add(self, p: m.MemoryAdd, reason: str = "") -> dict[str, Any]:
        """memory.add: skipped, merged into a near duplicate (by rule), or created (with `reason`)."""
        validate_domain(p.domain)
        check_title(p.title)
        check_text("content", p.content)
        if p.scope == "global" and self.share_policy(p.domain or "general") == "never":
            raise ProtocolError("invalid_params", f"invalid params: domain {p.domain!r} never shares its memories (share_policy never)", field="scope")
        now = self.stamp()
        valid_from, valid_until = validity(p.valid_from, p.valid_until, now)
        time_param("refers_to", p.refers_to)
        slug = domain_slug(p.domain)
        fp = fingerprint(p.title, p.content)
        if p.dedup:
            self.deduplicated.add(slug)  # the decision reads the domain's memories (concurrency.py)
            if p.confidence < MIN_CONFIDENCE:
                return {"decision": "skipped", "memory": None, "reason": f"confidence {p.confidence!r} is below {MIN_CONFIDENCE}"}
            same = self._fingerprints.get((slug, fp))
            if same is not None and self.valid_now(self.memories[same]):  # a closed fact is no duplicate
                return {"decision": "skipped", "memory": self.memories[same], "reason": "exact duplicate (same fingerprint)"}
        vector = self._passage_vector(p.title, p.content, p.abstract)
        if p.dedup:
            twin, why = self._near_duplicate(slug, p, vector)
            if twin is not None:
                return {"decision": "merged", "memory": self._merge(twin, p, vector, why), "reason": why}
        memory = self.create(p, vector, reason)
        return {"decision": "created", "memory": memory, **({"reason": reason} if reason else {})}

    def create(self, p: m.MemoryAdd, vector: np.ndarray, reason: str = "") -> Memory:
        """A new memory from `p` (checked by the caller), version 1."""
        slug = domain_slug(p.domain)
        fp = fingerprint(p.title, p.content)
        now = time_param("created_at", p.created_at) or self.stamp()  # an import's history, else now
        updated = time_param("updated_at", p.updated_at) or now
        if p.id is not None and p.id in self.memories:
            raise ProtocolError("invalid_params", f"invalid params: id {p.id!r} is held already", field="id")
        valid_from, valid_until = validity(p.valid_from, p.valid_until, now)
        memory = Memory(
            id=p.id or str(uuid.uuid4()),
            domain=p.domain or "general",
            category=p.category,
            title=p.title.strip(),
            content=p.content.strip(),
            abstract=(p.abstract or derive_abstract(p.content)).strip(),
            overview=(p.overview or derive_overview(p.content)).strip(),
            confidence=round(float(p.confidence), 4),
            tags=list(dict.fromkeys(p.tags)),
            scope=p.scope,
            source_session=p.source_session,
            fingerprint=fp,
            created_at=now,
            updated_at=updated,
            file=self._new_file(slug, p.title, fp, now),
            pinned=p.pinned,
            valid_from=valid_from,
            valid_until=valid_until,
            raw=(not p.dedup) if p.raw is None else p.raw,
            source_message_ids=list(dict.fromkeys(p.source_message_ids)),
            attributed_to=(p.attributed_to or "").strip() or None,
            refers_to=time_param("refers_to", p.refers_to),
        )
        self.commit(PutMemory(memory, self.model, vector.astype(np.float32).tobytes(), 1, "created", reason))
        return memory

    @handles("memory.add_many")
    def do_add_many(self, p: m.MemoryAddMany) -> list[Any]:
        out: list[Any] = []
        for item in p.items:
            try:
                out.append(self.do_add(item))
            except ProtocolError as exc:  # one bad item fails alone, with its index
                out.append({"decision": "error", "memory": None, "reason": exc.message, "kind": exc.kind})
        return out

    @handles("memory.get")
    def do_get(self, p: m.MemoryGet) -> Memory:
        memory = self.existing_memory(p.id)
        if p.domain is not None and memory.scope != "global" and domain_slug(memory.domain) != domain_slug(p.domain):
            raise ProtocolError("not_found", f"no memory with id {p.id!r} in domain {p.domain!r}", id=p.id)  # local elsewhere
        return memory

    @handles("memory.list")
    def do_list(self, p: m.MemoryList) -> dict[str, Any]:
        """Newest first by created_at (as text), ties in the order the memories came. The filter
        is one numpy pass over the columns and only the newest offset + limit are sorted."""
        if p.domain is not None:
            validate_domain(p.domain)
        labels = self.columns.labels(
            slug=None if p.domain is None else domain_slug(p.domain),
            include_global=p.include_global,
            status=p.status,
            categories=None if p.category is None else [p.category],
        )
        end = p.offset + p.limit
        page = self._strongest_page(labels, p.offset, end) if p.order == "strongest" else self._newest_page(labels, p.offset, end)
        return {"total": int(labels.shape[0]), "memories": page}

    def _strongest_page(self, labels: np.ndarray, start: int, end: int) -> list[Memory]:
        """Positions start..end of `labels`' memories strongest first, then by created_at (text)
        descending, then as they came: MEMORY.md's order within a category. Strength of every match in
        one numpy pass; a partition keeps the strongest `end` (at the edge's strength, its newest by
        the `created` column, ties kept), which one lexsort orders; the text decides only within a
        run of equal (strength, created) that the page touches, as in _newest_page."""
        cols = self.columns
        power = cols.strengths(labels, self.wall(), self.settings)
        if end < labels.shape[0]:  # only the strongest `end` (and the ties at the edge) are sorted
            edge = np.partition(power, labels.shape[0] - end)[labels.shape[0] - end]
            above = power > edge
            at_edge = labels[power == edge]
            newest = cols.newest(at_edge, end - int(above.sum()))  # the edge's strength: its newest, ties kept
            kept = at_edge if newest is None else newest
            labels = np.concatenate((labels[above], kept))
            power = np.concatenate((power[above], np.full(kept.shape[0], edge)))
        created = np.nan_to_num(cols.created[labels], nan=-np.inf)
        order = np.lexsort((cols.seq[labels], -created, -power))
        ranked, power, created = labels[order], power[order], created[order]
        stop = min(end, ranked.shape[0])
        if start >= stop:
            return []
        edges = np.flatnonzero((power == power[start]) & (created == created[start]))
        lo = int(edges[0])
        edges = np.flatnonzero((power == power[stop - 1]) & (created == created[stop - 1]))
        hi = int(edges[-1]) + 1
        block = [(self.memories[self._id_of[label]], -value) for label, value in zip(ranked[lo:hi].tolist(), power[lo:hi].tolist())]
        block.sort(key=lambda pair: pair[0].created_at, reverse=True)  # stable: ties keep seq's order
        block.sort(key=lambda pair: pair[1])  # stable: strongest first, each strength's run newest first
        return [mem for mem, _ in block[start - lo : stop - lo]]

    @handles("memory.strength")
    def do_strength(self, p: m.MemoryStrength) -> list[dict[str, Any]]:
        memories = [self.existing_memory(memory_id) for memory_id in p.ids]  # every id checked first
        labels = np.fromiter((self._label[memory.id] for memory in memories), dtype=np.int64, count=len(memories))
        power = self.columns.strengths(labels, self.wall(), self.settings).tolist()  # all at once, as a page's
        return [outlook(memory, value, self.settings) for memory, value in zip(memories, power)]

    def _newest_page(self, labels: np.ndarray, start: int, end: int) -> list[Memory]:
        """Positions start..end of `labels`' memories by created_at (text) descending, then seq.
        numpy ranks the newest `end` by the `created` column; the text decides only within a run of
        equal `created` values that the page touches (the column never orders two texts the other
        way, see columns.wall_clock), so Python sorts about a page, not the domain."""
        newest = self.columns.newest(labels, end)
        if newest is None:  # a created_at the daemon did not write: the text order, all of it
            ranked = labels[np.argsort(self.columns.seq[labels], kind="stable")]
            every = [self.memories[self._id_of[label]] for label in ranked.tolist()]
            every.sort(key=lambda mem: mem.created_at, reverse=True)  # stable: ties keep seq's order
            return every[start:end]
        order = np.lexsort((self.columns.seq[newest], -self.columns.created[newest]))
        ranked, keys = newest[order], -self.columns.created[newest][order]
        stop = min(end, ranked.shape[0])
        if start >= stop:
            return []
        lo = int(np.searchsorted(keys, keys[start], "left"))
        hi = int(np.searchsorted(keys, keys[stop - 1], "right"))
        block = [self.memories[self._id_of[label]] for label in ranked[lo:hi].tolist()]
        block.sort(key=lambda mem: mem.created_at, reverse=True)  # stable: ties keep seq's order
        return block[start - lo : stop - lo]

    @handles("memory.domains")
    def do_domains(self, p: m.MemoryDomains) -> dict[str, Any]:
        """Each domain's memories counted by category and status, and the global ones: one numpy
        pass over the columns (never a walk over the memories)."""
        if p.domain is not None:
            validate_domain(p.domain)
            slug = domain_slug(p.domain)
            number = self.columns.domain_ids.get(slug)
            tables = [] if number is None else [(slug, self.columns.counts(number)[0])]
        else:
            counts = self.columns.counts()
            tables = [(slug, counts[number]) for slug, number in sorted(self.columns.domain_ids.items())]
        domains = []
        for slug, table in tables:
            members = self._domains.get(slug)
            if not members or not table.any():
                continue
            newest_put = self.memories[next(reversed(members))]  # the name the domain was last written with
            domains.append({"domain": newest_put.domain, "slug": slug, **_count_table(table)})
        return {"domains": domains, "global": _count_table(self.columns.global_counts()), "total": len(self.memories)}

    @handles("memory.update")
    def do_update(self, p: m.MemoryUpdate) -> Memory:
        old = self.existing_memory(p.id)
        if p.title is not None:
            check_title(p.title)
        if p.content is not None:
            check_text("content", p.content)
        if p.scope == "global" and old.scope != "global":
            raise ProtocolError(
                "invalid_params", "invalid params: a local memory becomes global through memory.promote and its review", field="scope"
            )
        title, content, _ = updated_text(old, p)
        changed_text = title != old.title or content != old.content
        valid_from = old.valid_from if p.valid_from is UNSET else time_param("valid_from", p.valid_from)
        valid_until = old.valid_until if p.valid_until is UNSET else time_param("valid_until", p.valid_until)
        check_order(valid_from or old.created_at, valid_until)
        memory = msgspec.structs.replace(
            old,
            title=title,
            content=content,
            category=p.category or old.category,
            confidence=old.confidence if p.confidence is None else round(float(p.confidence), 4),
            tags=old.tags if p.tags is None else list(dict.fromkeys(p.tags)),
            scope=p.scope or old.scope,
            abstract=p.abstract if p.abstract is not None else (derive_abstract(content) if changed_text else old.abstract),
            overview=p.overview if p.overview is not None else (derive_overview(content) if changed_text else old.overview),
            fingerprint=fingerprint(title, content),
            updated_at=self.stamp(),
            pinned=old.pinned if p.pinned is None else p.pinned,
            valid_from=valid_from,
            valid_until=valid_until,
            # a fact reopened here (valid_until: null) is nobody's old version any more
            superseded_by=None if p.valid_until is None else old.superseded_by,
            attributed_to=old.attributed_to if p.attributed_to is UNSET else p.attributed_to,
        )
        version = self.version_of(old.id) + 1
        if changed_text:
            vector = self._passage_vector(title, content, updated_text(old, p)[2])
            self.commit(PutMemory(memory, self.model, vector.astype(np.float32).tobytes(), version, "updated"))
        else:
            vector_bytes = self.vector_bytes(old.id)
            self.commit(PutMemory(memory, self.model_of.get(old.id, ""), vector_bytes, version, "updated"))
        return memory

    @handles("memory.delete")
    def do_delete(self, p: m.MemoryDelete) -> dict[str, Any]:
        old = self.existing_memory(p.id)
        if p.purge:
            self.commit(PurgeMemory(old.id))
            return {"id": old.id, "status": "purged"}
        if old.status != "archived":
            self.archive(old, "memory.delete")
        return {"id": old.id, "status": "archived"}

    @handles("memory.history")
    def do_history(self, p: m.MemoryHistory) -> list[MemoryVersion]:
        current = self.existing_memory(p.id)
        entries = self.history.get(p.id) or [VersionEntry(1, current.created_at, "created", "")]
        return [
            MemoryVersion(version=e.version, at=e.at, decision=e.decision, reason=e.reason, memory=e.memory or current)
            for e in entries
        ]

    def archive(self, old: Memory, reason: str, **changes: Any) -> Memory:
        """Archive a memory (its file moves to _archive/), with the reason and any other changes."""
        slug = domain_slug(old.domain)
        name = old.file.rsplit("/", 1)[-1].removesuffix(".md")
        file = self._free_name(f"{self.files_root}/{slug}/_archive/{name}", old.fingerprint)  # unique at every move
        archived = msgspec.structs.replace(
            old, status="archived", updated_at=self.stamp(), file=file, archived_reason=reason, **changes
        )
        self.keep(archived, old, "archived", reason)
        return archived

    @handles("memory.restore")
    def do_restore(self, p: m.MemoryRef) -> Memory:
        """An archived memory active again, its file back in its domain's folder. Its strength's
        clock starts again (last_used = now), so the next maintenance does not archive it at once."""
        old = self.existing_memory(p.id)
        if old.status != "archived":
            raise ProtocolError(
                "invalid_params", f"invalid params: memory {old.id!r} is {old.status}, not archived: nothing to restore", field="id"
            )
        slug = domain_slug(old.domain)
        name = old.file.rsplit("/", 1)[-1].removesuffix(".md")
        now = self.stamp()
        restored = msgspec.structs.replace(
            old,
            status="active",
            file=self._free_name(f"{self.files_root}/{slug}/{name}", old.fingerprint),
            archived_reason="",
            superseded_by=old.superseded_by if old.valid_until is not None else None,  # a merged duplicate stands alone again
            last_used=now,
            updated_at=now,
        )
        self.keep(restored, old, "restored", "memory.restore")
        return restored

    @handles("memory.feedback")
    def do_feedback(self, p: m.MemoryFeedback) -> dict[str, Any]:
        """used: reinforces (last_used, used_count); ignored: counted; wrong: confidence lowered by
        wrong_penalty, and below 0.5 the memory is archived (unless pinned). Archived memories are
        left as they are (not counted in `updated`); an unknown id changes nothing at all."""
        memories = [self.existing_memory(memory_id) for memory_id in dict.fromkeys(p.ids)]  # not_found before any change
        now = self.stamp()
        updated = 0
        archived: list[str] = []
        for old in memories:
            if old.status != "active":
                continue
            if p.signal == "used":
                self.keep(msgspec.structs.replace(old, used_count=old.used_count + 1, last_used=now, updated_at=now), old)
            elif p.signal == "ignored":
                self.keep(msgspec.structs.replace(old, ignored_count=old.ignored_count + 1, updated_at=now), old)
            else:
                confidence = round(max(0.0, old.confidence - self.settings.wrong_penalty), 4)
                changed = msgspec.structs.replace(old, confidence=confidence, wrong_count=old.wrong_count + 1, updated_at=now)
                if confidence < MIN_CONFIDENCE and not old.pinned:
                    self.archive(changed, f"reported wrong {changed.wrong_count} times: confidence {confidence} is below {MIN_CONFIDENCE}")
                    archived.append(old.id)
                else:
                    self.keep(changed, old)
            updated += 1
        return {"updated": updated, "archived": archived}

    def close_fact(self, memory_id: str, *, until: str | None = None, superseded_by: str | None = None) -> Memory:
        """Close a fact that stopped being true (valid_until = `until`, default now), linking the
        memory that replaces it; it stays active and searchable with include_expired or an as_of
        before `until`. The learning loop's MERGE on a conflict calls supersede(), which uses this."""
        old = self.existing_memory(memory_id)
        if superseded_by is not None:
            self.existing_memory(superseded_by)
            if superseded_by == memory_id:
                raise ProtocolError("invalid_params", "invalid params: a memory cannot supersede itself", field="id")
        until = self.stamp() if until is None else time_param("valid_until", until)
        check_order(old.valid_from or old.created_at, until)
        closed = msgspec.structs.replace(old, valid_until=until, superseded_by=superseded_by, updated_at=self.stamp())
        self.keep(closed, old, "closed", f"superseded by {superseded_by}" if superseded_by else "no longer true")
        return closed

    def supersede(self, old_id: str, new_id: str) -> Memory:
        """The MERGE-on-conflict of the learning loop's judge: the old version is closed when the
        new one becomes valid (its valid_from; now if that is earlier than the old one's start)
        and names the new one in superseded_by. Returns the closed old version."""
        old, new = self.existing_memory(old_id), self.existing_memory(new_id)
        start = new.valid_from or new.created_at
        if epoch(start) <= epoch(old.valid_from or old.created_at):
            start = self.stamp()
        return self.close_fact(old_id, until=start, superseded_by=new.id)

    @handles("memory.search")
    def do_search(self, p: m.MemorySearch) -> list[dict[str, Any]]:
        if p.domain is not None:
            validate_domain(p.domain)
        time_param("as_of", p.as_of)
        return self.search(p)

    @handles("memory.inject")
    def do_inject(self, p: m.MemoryInject) -> dict[str, Any]:
        validate_domain(p.domain)
        if p.messages and (p.group is None or p.query is None):
            field = "group" if p.group is None else "query"
            raise ProtocolError("invalid_params", f"invalid params: messages needs a group and a query ({field} is missing)", field=field)
        if p.min_score is not None and p.query is None:
            raise ProtocolError("invalid_params", "invalid params: min_score needs a query (it floors the search's score)", field="query")
        if p.query is not None:
            hits = self.search(m.MemorySearch(query=p.query, domain=p.domain, k=p.k, min_score=p.min_score))
            chosen = [hit["memory"] for hit in hits]
        else:
            chosen = []
        if not chosen and p.min_score is None:  # no query, or nothing matched: the strongest first, then the newest
            at = self.wall()
            labels = self.columns.labels(slug=domain_slug(p.domain), include_global=True, valid_at=at)  # active, valid now
            newest = sorted((self.memories[self._id_of[label]] for label in labels.tolist()), key=lambda mem: mem.created_at, reverse=True)
            power = self.columns.strengths(np.asarray([self._label[mem.id] for mem in newest], dtype=np.int64), at, self.settings)
            chosen = [newest[i] for i in np.argsort(-power, kind="stable")[: p.k].tolist()]  # stable: ties stay newest first
        found: list[dict[str, Any]] | str = []
        if p.messages and p.group is not None and p.query is not None:
            found = self._prepared.messages.get((p.group, p.query, p.messages), "the conversation tier was not asked")
        head = summary_part(self._prepared.summaries.get(domain_slug(p.domain))) if p.include_summary else None
        parts, used = fit_memories(chosen, p.token_budget, head)
        message_parts, messages = fit_messages(p.group or "", found if isinstance(found, list) else [], p.token_budget, parts)
        now = self.stamp()
        for memory in used:  # an access, not journaled (statistics)
            self.memories[memory.id] = msgspec.structs.replace(
                self.memories[memory.id], access_count=self.memories[memory.id].access_count + 1, last_accessed=now
            )
        summary_in = head is not None and bool(parts) and parts[0] == head
        extra: dict[str, Any] = {"summary": summary_in} if p.include_summary else {}
        if p.messages:
            extra["messages"] = messages
            if isinstance(found, str):
                extra["messages_error"] = found
        if not parts and not message_parts:
            return {"text": "", "ids": [], "tokens": 0, **extra}
        text = "\n\n".join(["<memories>", MEMORIES_NOTE, *parts, *message_parts, "</memories>"])
        return {"text": text, "ids": [mem.id for mem in used], "tokens": estimate_tokens(text), **extra}

    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, PutMemory):
            memory_id = mutation.memory.id
            before = self._snapshot_one(memory_id)
            history = self.history.get(memory_id)
            if mutation.version > 0:
                self._record_version(mutation)
            self._put(mutation.memory, mutation.model, mutation.vector, rewrite=not mutation.from_file)

            def undo_put() -> None:
                self._restore(memory_id, before)
                self._set_history(memory_id, history)

            return undo_put
        if isinstance(mutation, PurgeMemory):
            before = self._snapshot_one(mutation.id)
            history = self.history.pop(mutation.id, None)
            self._purge(mutation.id)

            def undo_purge() -> None:
                self._restore(mutation.id, before)
                self._set_history(mutation.id, history)

            return undo_purge
        if isinstance(mutation, PutReview):
            return apply_review(self, mutation)
        if isinstance(mutation, MaintenanceRecord):
            runs = list(self.maintenance_runs)
            kept = [run for run in self.maintenance_runs if run.job_id != mutation.job_id] + [mutation]
            self.maintenance_runs = kept[-MAINTENANCE_RUNS_KEPT:]

            def undo() -> None:
                self.maintenance_runs = runs

            return undo
        raise TypeError(f"not a memory mutation: {mutation!r}")

    def _record_version(self, mutation: PutMemory) -> None:
        """A new version arrives: the versions from it on are replaced, the current one (if older)
        is kept with its text (see the module's rule)."""
        memory_id = mutation.memory.id
        current = self.memories.get(memory_id)
        entries = [e for e in self.history.get(memory_id, ()) if e.version < mutation.version]
        if not entries and current is not None and mutation.version > 1:  # older than versioning: its first entry
            entries = [VersionEntry(mutation.version - 1, current.updated_at, "created", "")]
        if entries and entries[-1].memory is None:
            entries[-1] = msgspec.structs.replace(entries[-1], memory=current)
        entries.append(VersionEntry(mutation.version, mutation.memory.updated_at, mutation.decision, mutation.reason))
        self.history[memory_id] = entries[-MAX_VERSIONS:]

    def _set_history(self, memory_id: str, entries: list[VersionEntry] | None) -> None:
        if entries is None:
            self.history.pop(memory_id, None)
        else:
            self.history[memory_id] = entries

    def _snapshot_one(self, memory_id: str) -> tuple[Memory, str, bytes] | None:
        memory = self.memories.get(memory_id)
        if memory is None:
            return None
        return memory, self.model_of.get(memory_id, ""), self.vector_bytes(memory_id)

    def _restore(self, memory_id: str, before: tuple[Memory, str, bytes] | None) -> None:
        if before is None:
            self._purge(memory_id)
        else:
            self._put(*before)

    def _put(self, memory: Memory, model: str, vector: bytes, *, rewrite: bool = True) -> None:
        """Index a memory; its file is written again (and its domain's _index.json) only when the
        memory changed, and with rewrite=False (read from its file) only _index.json."""
        old = self.memories.get(memory.id)
        slug = domain_slug(memory.domain)
        if old is not None:
            self._unindex(old)
            if old.file != memory.file:
                self.removed_files[old.file] = None
        label = self._label.get(memory.id)
        if label is None:
            if self._free_labels:
                label = heapq.heappop(self._free_labels)
            else:
                label = self._next_label
                self._next_label += 1
            self._label[memory.id] = label
            self._id_of[label] = memory.id
        self.memories[memory.id] = memory
        self._index_person(memory)
        self._active += (memory.status == "active") - (old is not None and old.status == "active")
        self.columns.set(label, memory, slug, fresh=old is None)
        self._domains.setdefault(slug, {})[memory.id] = None
        if memory.scope == "global":
            self._global[memory.id] = None
        else:
            self._global.pop(memory.id, None)
        self._files[memory.file] = memory.id
        if memory.status == "active":
            self._fingerprints[(slug, memory.fingerprint)] = memory.id
        if vector and model == self.model:
            # a change of metadata only (feedback, archive, validity) carries the same vector:
            # hnswlib is not asked to re-insert it
            if old is None or self.model_of.get(memory.id) != model or self.vector_bytes(memory.id) != vector:
                self.vectors.add(np.asarray([label], dtype=np.int64), np.frombuffer(vector, dtype=np.float32)[None, :])
            self._set_model(memory.id, model)
        elif label in self.vectors:
            self.vectors.remove(label)
            self._set_model(memory.id, "")
        else:
            self._set_model(memory.id, model if vector else "")
        if old is None or memory_text(old) != memory_text(memory):  # the same text: the same BM25 terms
            self.lexical.add(label, memory_text(memory))
        if memory.scope == "global" or (old is not None and old.scope == "global"):
            self.global_dirty = True
        self._revisions += 1
        self._revision[memory.id] = self._revisions
        if old is None or old != memory:  # a new vector alone (re-embedding) changes no file
            self._changed(memory)
            if not rewrite:
                self.dirty.pop(memory.id, None)
        else:
            self._version += 1

    def _purge(self, memory_id: str) -> None:
        """Erase a memory from every structure: its vector (in hnswlib too, see VectorStore.remove),
        its BM25 terms (LexicalIndex.remove drops the words no other memory holds), the caches; its
        file goes with the next projection and its journal records with the next snapshot."""
        old = self.memories.pop(memory_id, None)
        if old is None:
            return
        self._active -= old.status == "active"
        self._unindex(old)
        self.removed_files[old.file] = None
        self.model_of.pop(memory_id, None)
        self._unembedded.pop(memory_id, None)
        self._word_sets.pop(memory_id, None)
        label = self._label.pop(memory_id)
        del self._id_of[label]
        self.columns.clear(label)
        self.vectors.remove(label, erase=True)
        if self.previous is not None:
            self.previous[1].remove(label, erase=True)
        self.lexical.remove(label)
        heapq.heappush(self._free_labels, label)
        slug = domain_slug(old.domain)
        self._domains.get(slug, {}).pop(memory_id, None)
        self._global.pop(memory_id, None)
        self.dirty.pop(memory_id, None)
        self.dirty_domains[slug] = None
        self._allowed_cache.clear()
        self._valid_cache.clear()
        self._revision.pop(memory_id, None)
        if old.scope == "global":
            self.global_dirty = True
        self._version += 1

    def _unindex(self, memory: Memory) -> None:
        self._unindex_person(memory)
        slug = domain_slug(memory.domain)
        if self._fingerprints.get((slug, memory.fingerprint)) == memory.id:
            del self._fingerprints[(slug, memory.fingerprint)]
        if self._files.get(memory.file) == memory.id:
            del self._files[memory.file]
        if domain_slug(memory.domain) in self._domains:
            self._domains[slug].pop(memory.id, None)

    def counts(self) -> dict[str, int]:
        return {
            "memories": len(self.memories),
            "active": self._active,
            "domains": len(self._domains),
            "vectors": len(self.vectors),
            "unembedded": len(self._unembedded),
            **self.review.counts(),
        }

    def missing_vectors(self, limit: int) -> list[str]:
        """Ids of memories without a vector of the current model (imported, or a changed model)."""
        out: list[str] = []
        for memory_id in self._unembedded:  # kept up to date by _set_model: no scan of every memory
            out.append(memory_id)
            if len(out) >= limit:
                break
        if not out and self.previous is not None:
            log.info("tier 4: every memory has a %s vector; the %s index is retired", self.model, self.previous[0])
            self.previous = None
            self.previous_stem = ""  # the next snapshot deletes its files
        return out

    def snapshot_document(self) -> MemorySnapshot:
        return MemorySnapshot(
            model=self.model,
            memories=list(self.memories.values()),
            labels=dict(self._label),
            models=dict(self.model_of),
            next_label=self._next_label,
            vectors_fingerprint=self.vectors.fingerprint(),
            previous_model=self.previous[0] if self.previous else "",
            previous_fingerprint=self.previous[1].fingerprint() if self.previous else "",
            lexical=self.lexical.dump(),
            history=dict(self.history),
            vectors_stem=self.vectors_stem,
            previous_stem=self.previous_stem if self.previous else "",
            reviews=list(self.review.items.values()),
            maintenance=list(self.maintenance_runs),
        )

    def load_snapshot(
        self,
        doc: MemorySnapshot,
        vectors: VectorStore | None,
        previous: tuple[str, VectorStore, Any] | None = None,
        previous_stem: str = "",
    ) -> None:
        """Rebuild from a snapshot; vectors of another model, or a stale vector file, are dropped
        (those memories are re-embedded in the background). `previous`, the old model's store and
        embedder after a change of model, keeps answering dense search until that is done."""
        usable = vectors is not None and doc.model == self.model and vectors.fingerprint() == doc.vectors_fingerprint
        if previous is not None:
            expected = doc.vectors_fingerprint if previous[0] == doc.model else doc.previous_fingerprint
            if previous[1].fingerprint() == expected:
                self.previous = previous
                self.previous_stem = previous_stem
                self.previous_saved_fingerprint = expected
        if usable and vectors is not None:
            self.vectors = vectors
            self.vectors_stem = doc.stem()
            self.saved_fingerprint = doc.vectors_fingerprint
        elif doc.memories:
            log.warning("tier 4: no usable vector file for model %s; memories will be re-embedded", self.model)
        self._next_label = doc.next_label
        slugs: dict[str, str] = {}  # a few domains, 100,000 memories: slug each domain once
        column_labels: list[int] = []
        column_slugs: list[str] = []
        for memory in doc.memories:
            label = doc.labels[memory.id]
            self._label[memory.id] = label
            self._id_of[label] = memory.id
            self.memories[memory.id] = memory
            self._index_person(memory)
            slug = slugs.get(memory.domain)
            if slug is None:
                slug = slugs[memory.domain] = domain_slug(memory.domain)
            column_labels.append(label)
            column_slugs.append(slug)
            self._domains.setdefault(slug, {})[memory.id] = None
            if memory.scope == "global":
                self._global[memory.id] = None
            self._files[memory.file] = memory.id
            if memory.status == "active":
                self._fingerprints[(slug, memory.fingerprint)] = memory.id
                self._active += 1
            has_vector = usable and label in self.vectors
            self._set_model(memory.id, doc.models.get(memory.id, "") if has_vector else "")
        self.columns.set_many(column_labels, doc.memories, column_slugs)
        self.review.load(doc.reviews)
        self.history = {memory_id: entries for memory_id, entries in doc.history.items() if memory_id in self.memories}
        self.maintenance_runs = list(doc.maintenance)[-MAINTENANCE_RUNS_KEPT:]
        self.lexical, self.lexical_from = self._restored_lexical(doc)
        used = np.fromiter(doc.labels.values(), dtype=np.int64, count=len(doc.labels))
        free = np.ones(self._next_label, dtype=bool)
        free[used[used < self._next_label]] = False
        self._free_labels = np.flatnonzero(free).tolist()  # ascending: already a heap
        if self.previous is not None:  # a label freed by a purge has no vector of the old model either
            for label in np.setdiff1d(self.previous[1].labels(), used).tolist():
                self.previous[1].remove(label, erase=True)
        self._version += 1

    def _restored_lexical(self, doc: MemorySnapshot) -> tuple[LexicalIndex, str]:
        """The snapshot's lexical index if it is there and holds exactly its memories, else one
        built from the texts (an older snapshot, another tokenizer)."""
        if doc.lexical is not None:
            try:
                index = LexicalIndex.restore(doc.lexical)
                if not index.stem:  # saved before issue 18's stemming: its terms are the unstemmed words
                    raise ValueError("the saved one holds unstemmed tokens")
            except ValueError as exc:
                log.warning("tier 4: rebuilding the lexical index: %s", exc)
            else:
                expected = np.sort(np.fromiter(doc.labels.values(), dtype=np.int64, count=len(doc.labels)))
                if np.array_equal(index.labels(), expected):
                    return index, "snapshot"
                log.warning("tier 4: rebuilding the lexical index: the saved one does not hold the snapshot's memories")
        index = LexicalIndex(stem=True)
        index.add_many((doc.labels[memory.id], memory_text(memory)) for memory in doc.memories)
        return index, "rebuilt"

    def import_file(self, relative: str, text: str, mtime: float) -> Memory | None:
        """One EurekaClaw .md file as a memory (no vector yet); None when it holds no text. The file
        stays as it is (it already shows the memory): only its domain's _index.json is written."""
        memory = memory_from_text(relative, text, mtime)
        if memory is None:
            return None
        self._put(memory, "", b"", rewrite=False)
        self.history[memory.id] = [VersionEntry(1, memory.updated_at, "imported", f"from {relative}")]
        return memory


def _count_table(table: np.ndarray) -> dict[str, Any]:
    """memory.domains' counts of one domain (or of the global memories) from its [category,
    (active, archived)] table: totals, and each category's that has any."""
    active, archived = (int(n) for n in table.sum(axis=0))
    categories = {
        name: {"active": int(row[0]), "archived": int(row[1])} for name, row in zip(MEMORY_CATEGORIES, table) if row.any()
    }
    return {"total": active + archived, "active": active, "archived": archived, "categories": categories}
