"""The AsyncClient's convenience methods: generated from _calls.py by _generate.py; do not edit.

Run `make client-calls` after changing _calls.py (tests/test_client_unit.py fails while this file is
stale). Each method is its blocking twin's, as a coroutine: the same signature, docstring and op_*
builder, its request awaited through `self._run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from ..protocol import (
    CrossRunRecord,
    EpisodicEntry,
    GraphStats,
    Injection,
    Job,
    KnowledgeNode,
    Link,
    Memory,
    MemoryAddResult,
    MemoryDeleted,
    MemoryFeedbackResult,
    MemoryHit,
    MemoryPage,
    MemoryVersion,
    Promotion,
    ReviewView,
    Skill,
    SkillHit,
    SkillsInjection,
)
from . import _common as C

__all__ = ["AsyncCalls"]


class AsyncCalls:
    """The convenience calls of the AsyncClient, which supplies `_run` (a mixin)."""

    if TYPE_CHECKING:

        async def _run(self, op: C.Op[C.T]) -> C.T: ...

    # --- sys ------------------------------------------------------------------------------------

    async def ping(self) -> bool:
        """sys.ping: True when the daemon answers."""
        return await self._run(C.op_ping())

    async def hello(self) -> dict[str, Any]:
        """sys.hello: server name, version, protocol version, methods and limits."""
        return await self._run(C.op_hello())

    async def stats(self) -> dict[str, Any]:
        """sys.stats: counts per tier, journal, background work, requests and latencies (members may grow)."""
        return await self._run(C.op_stats())

    async def digest(self) -> dict[str, Any]:
        """sys.digest: per kind of durable record, how many this daemon holds and a checksum; under
        PostgreSQL with the change feed's seq it had applied (compare nodes with each other and the database)."""
        return await self._run(C.op_digest())

    async def snapshot(self) -> dict[str, Any]:
        """sys.snapshot: write every snapshot file now; {"seq": the journal sequence it covers}."""
        return await self._run(C.op_snapshot())

    async def resume(self) -> dict[str, Any]:
        """sys.resume: leave read-only mode after a journal failure; ReadOnly if the disk still refuses."""
        return await self._run(C.op_resume())

    # --- tier 1: episodic -----------------------------------------------------------------------

    async def log_event(
        self, session_id: str, agent_role: str, content: str, metadata: dict[str, Any] | None = None
    ) -> EpisodicEntry:
        """episodic.log: append an event to a session (created on first use); the entry as stored."""
        return await self._run(C.op_log_event(session_id, agent_role, content, metadata))

    async def recent(self, session_id: str, n: int = 20, agent_role: str | None = None) -> list[EpisodicEntry]:
        """episodic.recent: the session's last `n` events (1 to 500; of `agent_role` only if given), oldest first."""
        return await self._run(C.op_recent(session_id, n, agent_role))

    async def search_events(self, session_id: str, query: str, n: int = 20) -> list[EpisodicEntry]:
        """episodic.search: the last `n` events whose content contains `query` (case-insensitive)."""
        return await self._run(C.op_search_events(session_id, query, n))

    async def close_session(
        self, session_id: str, domain: str | None = None, theory_state: Any = None, extract: bool = True
    ) -> str | None:
        """session.close: write the session's events to runs/<session_id>/episodic.json; the extraction job's id, or None."""
        return await self._run(C.op_close_session(session_id, domain, theory_state, extract))

    # --- tier 2: persistent ---------------------------------------------------------------------

    async def remember(
        self, key: str, value: Any, tags: list[str] | None = None, source_session: str = ""
    ) -> CrossRunRecord:
        """persistent.remember: store `value` (any JSON) under `key`; an existing key keeps its record_id."""
        return await self._run(C.op_remember(key, value, tags, source_session))

    async def recall(self, key: str) -> CrossRunRecord | None:
        """persistent.recall: the record under `key`, or None."""
        return await self._run(C.op_recall(key))

    async def by_tag(self, tag: str) -> list[CrossRunRecord]:
        """persistent.by_tag: the records carrying `tag`."""
        return await self._run(C.op_by_tag(tag))

    async def forget(self, key: str) -> bool:
        """persistent.forget: delete `key`; False when it was absent."""
        return await self._run(C.op_forget(key))

    async def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """persistent.keys: the keys starting with `prefix`, sorted (at most `limit`, default 1000)."""
        return await self._run(C.op_keys(prefix, limit))

    # --- tier 3: knowledge graph ----------------------------------------------------------------

    async def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> KnowledgeNode:
        """graph.add_theorem: a new node (a new node_id every call)."""
        return await self._run(C.op_add_theorem(theorem_name, formal_statement, domain, session_id, tags))

    async def link(self, from_id: str, to_id: str, relation: str = "uses") -> Link:
        """graph.link: a directed relation: uses, generalizes, specializes or contradicts. NotFound for an unknown id."""
        return await self._run(C.op_link(from_id, to_id, relation))

    async def related(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        """graph.related: nodes within `depth` hops (0 to 16), either direction, nearest first."""
        return await self._run(C.op_related(node_id, depth))

    async def node(self, node_id: str) -> KnowledgeNode:
        """graph.get: one node; NotFound if absent."""
        return await self._run(C.op_node(node_id))

    async def search_theorems(
        self, query: str = "", domain: str | None = None, tag: str | None = None, limit: int | None = None
    ) -> list[KnowledgeNode]:
        """graph.search: nodes whose name or statement contains `query` (and whose domain contains `domain`, tags hold `tag`)."""
        return await self._run(C.op_search_theorems(query, domain, tag, limit))

    async def graph_stats(self) -> GraphStats:
        """graph.stats: node and edge counts, and the edges per relation."""
        return await self._run(C.op_graph_stats())

    async def export_graph(self, format: str = "node_link") -> dict[str, Any]:
        """graph.export: {"format", "data"}: networkx node-link JSON ("node_link") or a GraphML string ("graphml")."""
        return await self._run(C.op_export_graph(format))

    # --- tier 4: domain memories ----------------------------------------------------------------

    async def add_memory(
        self,
        domain: str,
        category: str,
        title: str,
        content: str,
        *,
        confidence: float | None = None,
        tags: list[str] | None = None,
        source_session: str | None = None,
        dedup: bool = True,
        **extra: Any,
    ) -> MemoryAddResult:
        """memory.add: `decision` created, merged (into a near duplicate) or skipped, with the `memory`.

        `category` is one of domain_knowledge, proof_strategy, open_problems, pitfalls, fact,
        preference, skill, goal, context; `extra` passes scope ("local"/"global"), abstract, overview.
        The result reads as a dict too: r["decision"], r["memory"]["file"]."""
        return await self._run(C.op_add_memory(domain, category, title, content, confidence, tags, source_session, dedup, **extra))

    async def add_memories(self, items: list[dict[str, Any]]) -> list[MemoryAddResult]:
        """memory.add_many: each item is memory.add's params (a dict); one result per item, in order
        (an item that failed a check has decision "error" and `kind`)."""
        return await self._run(C.op_add_memories(items))

    async def get_memory(self, memory_id: str) -> Memory:
        """memory.get: one memory (archived ones too); NotFound if absent."""
        return await self._run(C.op_get_memory(memory_id))

    async def list_memories(
        self,
        domain: str | None = None,
        category: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        readable: bool = False,
        order: str | None = None,
    ) -> MemoryPage:
        """memory.list: newest first, paged (`limit` default 50); `status` "active" (default), "archived" or "any".
        `total` counts every match before paging. readable=True: `readable` holds the domain's MEMORY.md
        text as the daemon would write it now (without a domain: GLOBAL.md's). order="strongest": MEMORY.md's
        order (strength, then newest)."""
        return await self._run(C.op_list_memories(domain, category, status, limit, offset, readable, order))

    async def memory_strength(self, memory_ids: list[str]) -> list[dict[str, Any]]:
        """memory.strength: each memory's `strength` now, `importance`, `half_life_days`, `since` (its clock's
        start), `pinned`, `fades_at` (under archive_floor) and `archivable_at` (when maintenance may archive it)."""
        return await self._run(C.op_memory_strength(memory_ids))

    async def memory_domains(self, domain: str | None = None) -> dict[str, Any]:
        """memory.domains: each domain's memory counts (`total`, `active`, `archived`, and per category
        `{"active": n, "archived": n}`), those of the global memories, and `total`; with `domain`, that one only."""
        return await self._run(C.op_memory_domains(domain))

    async def update_memory(self, memory_id: str, **fields: Any) -> Memory:
        """memory.update: change title, content, category, confidence, tags, scope, abstract or overview."""
        return await self._run(C.op_update_memory(memory_id, **fields))

    async def delete_memory(self, memory_id: str, purge: bool = False) -> MemoryDeleted:
        """memory.delete: archive the memory (its file moves to _archive/), or erase it with purge=True."""
        return await self._run(C.op_delete_memory(memory_id, purge))

    async def search_memories(
        self, query: str, domain: str | None = None, k: int = 10, categories: list[str] | None = None, **extra: Any
    ) -> list[MemoryHit]:
        """memory.search: hybrid (dense + BM25) search, best first. Each hit's `score` is calibrated
        (0..1, comparable across queries and models: 0.5 is the relevance floor, PROTOCOL.md);
        `extra` passes mode, scope, status, min_score, min_confidence, include_global."""
        return await self._run(C.op_search_memories(query, domain, k, categories, **extra))

    async def inject(
        self,
        domain: str,
        k: int = 4,
        query: str | None = None,
        token_budget: int | None = None,
        *,
        group: str | None = None,
        messages: int | None = None,
        include_summary: bool | None = None,
        min_score: float | None = None,
    ) -> Injection:
        """memory.inject: EurekaClaw's <memories> block (`text`), the `ids` in it and its estimated `tokens`;
        with `group` and `messages` (and a query), also that many of the group's best raw messages (`messages`);
        `include_summary`: a conversation group's rolling summary and predicted intents ahead of the memories;
        `min_score` (with a query): only memories the search scores at least that, fewer than k if so."""
        return await self._run(C.op_inject(domain, k, query, token_budget, group, messages, include_summary, min_score))

    async def promote_memory(self, memory_id: str, reason: str | None = None, by: str | None = None) -> Promotion:
        """memory.promote: ask for a local memory to become global: the request's `review_id`, its `state`
        (pending, approved or refused) and, when decided at once, the `reason`."""
        return await self._run(C.op_promote(memory_id, reason, by))

    async def reviews(
        self, state: str | None = None, domain: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> list[ReviewView]:
        """review.list: promotion requests, oldest first; `state` pending (the default), approved, refused or any."""
        return await self._run(C.op_reviews(state, domain, limit, offset))

    async def approve_review(self, review_id: str, by: str | None = None) -> ReviewView:
        """review.approve: the request's memory becomes global; the request as decided."""
        return await self._run(C.op_approve(review_id, by))

    async def reject_review(self, review_id: str, reason: str | None = None, by: str | None = None) -> ReviewView:
        """review.reject: the request is refused; the request as decided."""
        return await self._run(C.op_reject(review_id, reason, by))

    async def restore_memory(self, memory_id: str) -> Memory:
        """memory.restore: an archived memory active again, its file back from _archive/ (InvalidParams
        if it is not archived, NotFound if there is none)."""
        return await self._run(C.op_restore_memory(memory_id))

    async def memory_feedback(self, ids: list[str], signal: str) -> MemoryFeedbackResult:
        """memory.feedback: the injected memories `ids` were "used" (reinforces them), "ignored" or
        "wrong" (lowers their confidence; below 0.5 archives them): `updated`, `archived`."""
        return await self._run(C.op_memory_feedback(ids, signal))

    async def maintain(self) -> str:
        """sys.maintain: start tier 4's maintenance now; its job id (the report: stats()["memory"]["maintenance"])."""
        return await self._run(C.op_maintain())

    # --- conversations, jobs ----------------------------------------------------------------------

    async def append_messages(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """conversation.append: each message {"id", "role", "text", "sender"?, "timestamp"?, "session"?};
        ids already stored in the group are ignored (a resend is safe). {"appended": n, "ignored": n}."""
        return await self._run(C.op_append_conversation(group, messages))

    async def append_conversation(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The earlier name of append_messages."""
        return await self._run(C.op_append_conversation(group, messages))

    async def conversation_get(self, group: str, since: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """conversation.get: the group's messages in conversation order (the last `limit`; with
        `since`, the first `limit` at or after it)."""
        return await self._run(C.op_conversation_get(group, since, limit))

    async def conversation_groups(self) -> list[dict[str, Any]]:
        return await self._run(C.op_conversation_groups())

    async def conversation_search(
        self, group: str, query: str, k: int = 10, since: str | None = None, until: str | None = None
    ) -> list[dict[str, Any]]:
        """conversation.search: [{"message", "score", "why", "context"}], best first."""
        return await self._run(C.op_conversation_search(group, query, k, since, until))

    async def summary(self, group: str) -> dict[str, Any]:
        """conversation.summary: {"summary", "intents", "updated_at"} (empty until extraction has run)."""
        return await self._run(C.op_summary(group))

    @overload
    async def flush(self, group: str, wait: Literal[False] = False, timeout: None = None) -> str | None: ...

    @overload
    async def flush(self, group: str, wait: Literal[True], timeout: float | None = None) -> Job | None: ...

    @overload
    async def flush(self, group: str, wait: bool = False, *, timeout: float) -> Job | None: ...

    async def flush(self, group: str, wait: bool = False, timeout: float | None = None) -> Job | str | None:
        """conversation.flush: extract the group's new messages now (a burst of flushes makes one job).

        Without `wait` (and `timeout`): the extraction job's id, or None when the group has nothing new.
        With `wait=True` or a `timeout`: the Job once it has finished (jobs.wait), or as it is after
        `timeout` seconds (default 30); None when there was nothing to extract. NotFound for a group
        that has no messages at all."""
        job_id = await self._run(C.op_flush_conversation(group))
        if job_id is None or (not wait and timeout is None):
            return job_id
        return await self._run(C.op_wait_job(job_id, C.FLUSH_WAIT if timeout is None else timeout))

    async def flush_conversation(self, group: str) -> str | None:
        """conversation.flush: the extraction job's id, or None (flush(group) without waiting)."""
        return await self._run(C.op_flush_conversation(group))

    async def job(self, job_id: str) -> Job:
        """jobs.get: one job."""
        return await self._run(C.op_job(job_id))

    async def wait_job(self, job_id: str, timeout: float | None = None) -> Job:
        """jobs.wait: the job once it has finished, or as it is after `timeout` seconds."""
        return await self._run(C.op_wait_job(job_id, timeout))

    async def jobs(self, state: str | None = None, kind: str | None = None, limit: int | None = None) -> list[Job]:
        """jobs.list, newest first."""
        return await self._run(C.op_jobs(state, kind, limit))

    async def cancel_job(self, job_id: str) -> Job:
        return await self._run(C.op_cancel_job(job_id))

    async def retry_job(self, job_id: str) -> Job:
        return await self._run(C.op_retry_job(job_id))

    async def memory_history(self, memory_id: str) -> list[MemoryVersion]:
        """memory.history: the memory's versions, oldest first."""
        return await self._run(C.op_memory_history(memory_id))

    # --- skills: EurekaClaw's skills/<name>/SKILL.md ---------------------------------------------

    async def list_skills(
        self, agent_role: str | None = None, tag: str | None = None, status: str | None = None
    ) -> list[Skill]:
        """skills.list: by name; `status` "active", "draft" or "any" (the server's default: any)."""
        return await self._run(C.op_list_skills(agent_role, tag, status))

    async def skill(self, name: str) -> Skill:
        """skills.get; NotFound if there is no skill of that name."""
        return await self._run(C.op_skill(name))

    async def search_skills(self, query: str, k: int = 10, **extra: Any) -> list[SkillHit]:
        """skills.search: hits (`skill`, `score`, `why`) best first; `extra` passes status, mode."""
        return await self._run(C.op_search_skills(query, k, **extra))

    async def put_skill(self, name: str, body: str, **fields: Any) -> Skill:
        """skills.put: create or change a skill; a Skill field left out keeps its current value."""
        return await self._run(C.op_put_skill(name, body, **fields))

    async def record_skill_use(self, name: str, success: bool) -> Skill:
        """skills.record_use: one more use; success_rate moves as EurekaClaw's EMA (alpha 0.3)."""
        return await self._run(C.op_record_skill_use(name, success))

    async def confirm_skill(self, name: str) -> Skill:
        """skills.confirm: a draft becomes active (and injectable)."""
        return await self._run(C.op_confirm_skill(name))

    async def discard_skill(self, name: str) -> Skill:
        """skills.discard: a draft and its file are deleted (an active skill is refused); the draft as it was."""
        return await self._run(C.op_discard_skill(name))

    async def scan_skills(self) -> dict[str, int]:
        """skills.scan: read skills/ now (SKILL.md files others wrote, changed or removed); the counts
        {"new", "edit", "removed", "bad"}."""
        return await self._run(C.op_scan_skills())

    async def inject_skills(
        self,
        agent_role: str,
        pipeline_stage: str | None = None,
        query: str | None = None,
        k: int | None = None,
        token_budget: int | None = None,
    ) -> SkillsInjection:
        """skills.inject: the <skills> block of an agent's system prompt (`text`, `names`, `tokens`)."""
        return await self._run(C.op_inject_skills(agent_role, pipeline_stage, query, k, token_budget))
