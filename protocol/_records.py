"""Records as they travel on the wire and sit in the snapshots, with EurekaClaw's field names.

Timestamps are RFC 3339 strings (PROTOCOL.md §6), not datetime objects: they are stored, journaled
and sent exactly as written, in both framings, and parsed only by those who need a datetime.
"""

from __future__ import annotations

import datetime as _dt
import os
import random
from typing import Any

import msgspec


class Record(msgspec.Struct):
    """The base of every record and result: typed fields, and dict-style reading for code written
    against the plain JSON answers (`r["memory"]["file"]`, `r.get("reason")`, `dict(r)`).

    `key in r` and `r.get(key)` treat a field that is None as absent, as the JSON answer leaves
    optional members out; `r[key]` raises KeyError only for a name that is not a field."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__struct_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self.__struct_fields__ else None
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return key in self.__struct_fields__ and getattr(self, str(key)) is not None

    def keys(self) -> tuple[str, ...]:
        return self.__struct_fields__

    def to_dict(self) -> dict[str, Any]:
        """The record as the plain JSON-like data the daemon sent (nested records too)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class EpisodicEntry(Record, kw_only=True):
    entry_id: str
    session_id: str
    agent_role: str
    content: str
    metadata: dict[str, Any] = {}
    timestamp: str


class CrossRunRecord(Record, kw_only=True):
    record_id: str
    key: str
    value: Any
    tags: list[str] = []
    source_session: str = ""
    created_at: str
    updated_at: str


class KnowledgeNode(Record, kw_only=True):
    node_id: str
    theorem_name: str
    formal_statement: str
    domain: str = ""
    session_id: str = ""
    related_to: list[str] = []
    tags: list[str] = []
    created_at: str


class Edge(Record, kw_only=True):
    from_id: str
    to_id: str
    relation: str


_ids = random.Random(int.from_bytes(os.urandom(32), "big"))


def new_id() -> str:
    """A random (version 4) UUID string, made cheaply: ids name records, they are not secrets."""
    h = (_random_bits(128) & _UUID_KEEP | _UUID_SET).to_bytes(16, "big").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_random_bits = _ids.getrandbits
_UUID_KEEP = ~((0xF000 << 64) | (0xC000 << 48))  # the version and variant bits are set, not random:
_UUID_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def now_rfc3339() -> str:
    """The current time as an RFC 3339 string in UTC with microseconds."""
    return _dt.datetime.now(_dt.UTC).isoformat()


def normalize_timestamp(value: Any) -> str:
    """Read a timestamp leniently (naive means UTC, offsets kept, 'Z' accepted) as RFC 3339.

    Raises ValueError when the value is not a timestamp at all.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _dt.datetime.fromtimestamp(float(value), _dt.UTC).isoformat()
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"not a timestamp: {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = _dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.UTC)
    return parsed.isoformat()


# Tier 4's categories: protocol/categories.py (light, for the CLI's parser).


class Memory(Record, kw_only=True):
    """Tier 4: one insight or memory; `content` is L2 (full), `overview` L1, `abstract` L0."""

    id: str
    domain: str
    category: str
    title: str
    content: str
    abstract: str
    overview: str
    confidence: float
    tags: list[str] = []
    scope: str = "local"  # local | global (global: visible from every domain)
    source_session: str = ""
    fingerprint: str
    created_at: str
    updated_at: str
    access_count: int = 0
    last_accessed: str | None = None
    status: str = "active"  # active | archived
    file: str  # relative to the data root: memories/<domain_slug>/<YYYYMMDD>_<slug>.md
    # The lifecycle (issue 13), appended with defaults so that older journals, snapshots and files
    # read as they were: a memory without these fields is unpinned, valid from its creation on and
    # never closed, never used.
    pinned: bool = False  # never decays, never archived by maintenance nor by `wrong` feedback
    valid_from: str | None = None  # when the fact became true (null: from created_at)
    valid_until: str | None = None  # when it stopped being true (null: still true); closed, not deleted
    superseded_by: str | None = None  # the memory that replaced it (a closed fact, a merged duplicate)
    last_used: str | None = None  # the last `used` feedback (null: never)
    used_count: int = 0  # memory.feedback signals, counted
    ignored_count: int = 0
    wrong_count: int = 0
    archived_reason: str = ""  # why it was archived ("" while active)
    raw: bool = False  # stored with dedup false (raw material): maintenance never consolidates it
    # the person the memory is about or said by (a conversation's sender; null: nobody in particular);
    # memory.search boosts it when the query names that person
    attributed_to: str | None = None
    # Conversation memories: the ids of the group's messages it was extracted from, the time it refers to.
    source_message_ids: list[str] = []
    refers_to: str | None = None


SKILL_SOURCES: tuple[str, ...] = ("seed", "distilled", "manual")


SKILL_STATUSES: tuple[str, ...] = ("draft", "active")


class Skill(Record, kw_only=True):
    """A skill: EurekaClaw's SkillMeta fields, then `status` and `body` (the Markdown after the frontmatter).

    `name` is also its folder: skills/<name>/SKILL.md. `success_rate` is null until the first use."""

    name: str
    version: str = "1.0"
    tags: list[str] = []
    agent_roles: list[str] = []
    pipeline_stages: list[str] = []
    description: str = ""
    source: str = "seed"  # seed | distilled | manual (EurekaClaw's default is seed)
    created_at: str
    usage_count: int = 0
    success_rate: float | None = None
    status: str = "active"  # draft | active: a draft is never injected until skills.confirm
    body: str = ""


# --- results: what the methods answer, typed for the clients (the daemon sends the same as JSON) ----


class MemoryAddResult(Record, kw_only=True):
    """memory.add (and each item of memory.add_many): `decision` is created, merged, skipped (or,
    in add_many, error with `kind`); `memory` the stored, merged-into or existing memory."""

    decision: str
    memory: Memory | None = None
    reason: str | None = None
    kind: str | None = None


class SearchWhy(Record, kw_only=True):
    """Each retriever's 1-based rank and raw score (cosine, BM25); None where it did not return the hit."""

    dense_rank: int | None = None
    lexical_rank: int | None = None
    dense_score: float | None = None
    lexical_score: float | None = None
    cosine: float | None = None  # the query's cosine with the memory's vector (what the score reads)
    lexical_coverage: float | None = None  # share of the query's tokens its text holds (the score reads it)
    fused: float | None = None  # the reciprocal-rank fusion, / its maximum: the hits' relevance
    strength: float | None = None  # the memory's strength (hybrid hits are ordered by fused x its factor)


class MemoryHit(Record, kw_only=True):
    """One memory.search result; `score` is calibrated, 0..1 (PROTOCOL.md, "Hybrid search")."""

    memory: Memory
    score: float
    why: SearchWhy = msgspec.field(default_factory=SearchWhy)


class MemoryPage(Record, kw_only=True):
    """memory.list: `total` matches before paging, `memories` this page, newest first; with
    `readable: true`, `readable` is the text of the domain's MEMORY.md (no domain: GLOBAL.md)."""

    total: int
    memories: list[Memory] = []
    readable: str | None = None


class MemoryDeleted(Record, kw_only=True):
    id: str
    status: str  # archived | purged


class MemoryFeedbackResult(Record, kw_only=True):
    """memory.feedback: how many memories changed; the ids that `wrong` archived."""

    updated: int
    archived: list[str] = []


class InjectedMessage(Record, kw_only=True):
    """One conversation message memory.inject put into its block (asked for with `group` and `messages`)."""

    id: str
    sender: str = ""
    timestamp: str = ""
    score: float = 0.0


class Injection(Record, kw_only=True):
    """memory.inject: EurekaClaw's <memories> block, the ids in it, its estimated tokens; with `messages`
    asked for, the conversation messages in it (and why none, when the conversation tier could not answer)."""

    text: str
    ids: list[str] = []
    tokens: int = 0
    messages: list[InjectedMessage] = []
    messages_error: str | None = None


class SkillHit(Record, kw_only=True):
    skill: Skill
    score: float
    why: SearchWhy = msgspec.field(default_factory=SearchWhy)


class SkillsInjection(Record, kw_only=True):
    """skills.inject: the <skills> block of an agent's system prompt, the names in it, its tokens."""

    text: str
    names: list[str] = []
    tokens: int = 0


class Link(Record, kw_only=True):
    from_id: str
    to_id: str
    relation: str


class GraphStats(Record, kw_only=True):
    nodes: int
    edges: int
    relations: dict[str, int] = {}


REVIEW_KINDS: tuple[str, ...] = ("promote", "proposal")  # a client's memory.promote; the learning loop's


class ReviewItem(Record, kw_only=True):
    """A request that a local memory become global, and what was decided.

    `state` is pending until review.approve (approved) or review.reject (refused); the automatic
    check and the domain's share policy may decide at once. `*_by` are the names clients gave
    (`by`; "daemon" for what the daemon decided itself), `*_uid` the peers' uids as the kernel
    reported them (null for the daemon's own work). No text of the memory is kept here: a purge
    erases it from the queue too."""

    id: str
    memory_id: str
    kind: str  # promote | proposal
    state: str  # pending | approved | refused
    domain: str
    fingerprint: str  # of the memory's text when asked: a later change makes the request stale
    reason: str = ""  # why promote (the requester's words)
    requested_at: str
    requested_by: str = ""
    requested_uid: int | None = None
    decided_at: str | None = None
    decided_by: str = ""
    decided_uid: int | None = None
    decision_reason: str = ""  # why approved or refused (the automatic check, the policy, the reviewer)


class ReviewView(ReviewItem, kw_only=True):
    """A request as review.list, review.approve and review.reject answer it: the ReviewItem and its
    memory as it is now (None once purged)."""

    memory: Memory | None = None


class Promotion(Record, kw_only=True):
    """memory.promote: the request's id, its state, and why when the check or the policy decided at once."""

    review_id: str
    state: str  # pending | approved | refused
    reason: str | None = None


class MemoryVersion(Record, kw_only=True):
    """One entry of memory.history: a version of a memory and the decision that made it."""

    version: int  # 1 for the first; each change of text, tags, confidence or status adds one
    at: str  # when that version was written
    decision: str  # created | merged | updated | archived | promoted | imported
    reason: str = ""  # why (the dedup rule and its figure, or the judge's words)
    memory: Memory


JOB_STATES: tuple[str, ...] = ("queued", "running", "done", "failed", "cancelled")


class JobTokens(Record, kw_only=True):
    input: int = 0
    output: int = 0


class Job(Record, kw_only=True):
    """A unit of background work (an extraction after session.close), as jobs.* return it."""

    id: str
    kind: str  # "session.extract"
    state: str  # queued | running | done | failed | cancelled
    created_at: str
    started_at: str | None = None  # of the latest attempt
    finished_at: str | None = None
    attempts: int = 0  # times it was started (a restart of the daemon during a run counts)
    error: str | None = None  # why it failed (state failed), or why it was cancelled
    result: Any = None  # what it did (state done)
    tokens: JobTokens = msgspec.field(default_factory=JobTokens)  # LLM tokens over every attempt
    waiting_reason: str | None = None  # why a queued job is not running now (no LLM, backing off, ...)
