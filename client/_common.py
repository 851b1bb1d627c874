"""What the sync and async clients share: encoding requests, decoding replies, the typed results.

Only the standard library, msgspec and eurekamem.protocol; nothing here does I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

from ..protocol import (
    DEFAULT_MAX_FRAME_BYTES,
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
from ._errors import ConnectionLost, EurekamemError, TooLarge, error_from_wire

# The largest request payload we send: frames are smaller than 16 MiB, so that a binary connection
# always starts with 0x00 (PROTOCOL.md §2). Larger requests fail here, without touching the socket.
MAX_REQUEST_BYTES = DEFAULT_MAX_FRAME_BYTES - 1
# Replies may be bigger than requests (graph.export, say); this only guards against nonsense.
MAX_REPLY_BYTES = 1 << 30
# Under glibc's mmap threshold (128 KiB): the async client's receive_some allocates this much per read,
# and from 128 KiB on each allocation is a fresh mmap (~8 us a read instead of ~1).
RECV_BYTES = 64 * 1024
# Seconds a call may take when the caller names no timeout: no call of either client waits for ever.
DEFAULT_TIMEOUT = 60.0


def bounded_timeout(timeout: float | None) -> float:
    """A call's timeout: `timeout` seconds (finite, > 0), or DEFAULT_TIMEOUT for None."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    value = float(timeout)
    if not (0 < value < float("inf")):
        raise ValueError(f"timeout must be a finite number of seconds above 0, not {timeout!r}")
    return value

_MISSING = msgspec.Raw(b"")

T = TypeVar("T")


class Reply(msgspec.Struct):
    """One JSON-RPC answer; `result` stays raw MessagePack until the caller decodes it."""

    id: Any = None
    result: msgspec.Raw = _MISSING
    error: Any = None


_reply_decoder = msgspec.msgpack.Decoder(Reply)


def decode_reply(frame: bytes) -> Reply:
    try:
        reply = _reply_decoder.decode(frame)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ConnectionLost(f"malformed reply from server: {exc}") from None
    if reply.error is None and reply.result is _MISSING:
        # A `result` of nil arrives as Raw(b"\xc0"); only a reply with neither member lands here.
        raise ConnectionLost(f"malformed reply from server (neither result nor error), id={reply.id!r}")
    return reply


def _enc_hook(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)  # pydantic models, EurekaClaw's TheoryState among them
    if callable(dump):
        return dump(mode="json")
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"cannot send an object of type {type(obj).__name__}")


def to_wire(params: Any) -> Any:
    """Params as plain JSON-like data, so both framings carry the same values.

    datetimes become RFC 3339 strings, bytes base64 strings, Structs/dataclasses/pydantic models
    dicts, tuples and sets lists (msgspec.to_builtins).
    """
    return msgspec.to_builtins(params, enc_hook=_enc_hook, str_keys=True)


class RequestEncoder:
    """Encodes requests as binary frames (4-byte big-endian length + MessagePack). Not thread-safe."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def frame(self, request_id: int | None, method: str, params: Any) -> bytearray:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if request_id is not None:
            message["id"] = request_id
        buf = bytearray(4)
        self._encoder.encode_into(message, buf, 4)
        size = len(buf) - 4
        if size > MAX_REQUEST_BYTES:
            raise TooLarge(
                f"request for {method} is {size} bytes; frames must stay under {MAX_REQUEST_BYTES + 1} bytes"
            )
        buf[:4] = size.to_bytes(4, "big")
        return buf


def make_params(params: Any, kw: dict[str, Any]) -> Any:
    if params is None:
        params = {}
    if kw:
        if not isinstance(params, dict):
            raise TypeError("keyword params need `params` to be a dict or None")
        params = {**params, **kw}
    return to_wire(params)


_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def decode_result(raw: msgspec.Raw, result_type: Any = Any) -> Any:
    decoder = _decoders.get(result_type)
    if decoder is None:
        decoder = _decoders[result_type] = msgspec.msgpack.Decoder(result_type)
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise EurekamemError(
            f"unexpected result shape from server ({exc})", kind="bad_result"
        ) from None


def outcome(reply: Reply, result_type: Any = Any, post: Callable[[Any], Any] | None = None) -> Any:
    """The reply's value, or raise its typed error."""
    if reply.error is not None:
        raise error_from_wire(reply.error)
    value = decode_result(reply.result, result_type)
    return post(value) if post is not None else value


# --- the convenience methods, described once for both clients ---------------------------------


# Protocol methods with no op_* builder (so no convenience call; reached through call()), and why.
# tests/test_client_unit.py: every other method of protocol's METHODS has a builder here.
NO_CONVENIENCE: dict[str, str] = {
    "session.learned": "the EurekaClaw integration completes its extraction job through call()",
}


class Op(NamedTuple, Generic[T]):
    """One convenience call: its method and params, and how its result is decoded (into a T)."""

    method: str
    params: dict[str, Any]
    result_type: Any = Any
    post: Callable[[Any], Any] | None = None
    extra_wait: float = 0.0  # seconds the server may legitimately take beyond the usual


def _drop_none(**params: Any) -> dict[str, Any]:
    """Params without the ones left as None, so the server's defaults apply."""
    return {k: v for k, v in params.items() if v is not None}


def _theory_state(state: Any) -> Any:
    if state is None or isinstance(state, dict):
        return state
    dump = getattr(state, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return msgspec.to_builtins(state, enc_hook=_enc_hook)


def op_ping() -> Op[bool]:
    return Op("sys.ping", {}, post=lambda r: bool(r.get("pong")) if isinstance(r, dict) else bool(r))


def op_hello() -> Op[dict[str, Any]]:
    return Op("sys.hello", {})


def op_stats() -> Op[dict[str, Any]]:
    return Op("sys.stats", {})


def op_digest() -> Op[dict[str, Any]]:
    return Op("sys.digest", {})


def op_snapshot() -> Op[dict[str, Any]]:
    return Op("sys.snapshot", {})


def op_resume() -> Op[dict[str, Any]]:
    return Op("sys.resume", {})


def op_log_event(session_id: str, agent_role: str, content: str, metadata: dict[str, Any] | None) -> Op[EpisodicEntry]:
    params: dict[str, Any] = {"session_id": session_id, "agent_role": agent_role, "content": content}
    if metadata:
        params["metadata"] = metadata
    return Op("episodic.log", params, EpisodicEntry)


def op_recent(session_id: str, n: int, agent_role: str | None) -> Op[list[EpisodicEntry]]:
    return Op("episodic.recent", _drop_none(session_id=session_id, n=n, agent_role=agent_role), list[EpisodicEntry])


def op_search_events(session_id: str, query: str, n: int) -> Op[list[EpisodicEntry]]:
    return Op("episodic.search", {"session_id": session_id, "query": query, "n": n}, list[EpisodicEntry])


def op_close_session(session_id: str, domain: str | None, theory_state: Any, extract: bool) -> Op[str | None]:
    params = _drop_none(session_id=session_id, domain=domain, theory_state=_theory_state(theory_state))
    params["extract"] = extract
    return Op("session.close", params, post=lambda r: r.get("job_id") if isinstance(r, dict) else r)


def op_remember(key: str, value: Any, tags: list[str] | None, source_session: str) -> Op[CrossRunRecord]:
    params: dict[str, Any] = {"key": key, "value": value}
    if tags:
        params["tags"] = list(tags)
    if source_session:
        params["source_session"] = source_session
    return Op("persistent.remember", params, CrossRunRecord)


def op_recall(key: str) -> Op[CrossRunRecord | None]:
    return Op("persistent.recall", {"key": key}, CrossRunRecord | None)


def op_by_tag(tag: str) -> Op[list[CrossRunRecord]]:
    return Op("persistent.by_tag", {"tag": tag}, list[CrossRunRecord])


def op_forget(key: str) -> Op[bool]:
    return Op("persistent.forget", {"key": key}, post=lambda r: bool(r.get("deleted")) if isinstance(r, dict) else bool(r))


def _keys_list(result: Any) -> Any:
    return result.get("keys", []) if isinstance(result, dict) else result  # the daemon answers {"keys": [...]}


def op_keys(prefix: str, limit: int | None) -> Op[list[str]]:
    return Op("persistent.keys", _drop_none(prefix=prefix, limit=limit), post=_keys_list)


def op_add_theorem(
    theorem_name: str, formal_statement: str, domain: str, session_id: str, tags: list[str] | None
) -> Op[KnowledgeNode]:
    params: dict[str, Any] = {"theorem_name": theorem_name, "formal_statement": formal_statement}
    if domain:
        params["domain"] = domain
    if session_id:
        params["session_id"] = session_id
    if tags:
        params["tags"] = list(tags)
    return Op("graph.add_theorem", params, KnowledgeNode)


def op_link(from_id: str, to_id: str, relation: str) -> Op[Link]:
    return Op("graph.link", {"from_id": from_id, "to_id": to_id, "relation": relation}, Link)


def op_search_theorems(query: str, domain: str | None, tag: str | None, limit: int | None) -> Op[list[KnowledgeNode]]:
    return Op("graph.search", _drop_none(query=query, domain=domain, tag=tag, limit=limit), list[KnowledgeNode])


def op_graph_stats() -> Op[GraphStats]:
    return Op("graph.stats", {}, GraphStats)


def op_export_graph(fmt: str) -> Op[dict[str, Any]]:
    return Op("graph.export", {"format": fmt})


def op_related(node_id: str, depth: int) -> Op[list[KnowledgeNode]]:
    return Op("graph.related", {"node_id": node_id, "depth": depth}, list[KnowledgeNode])


def op_node(node_id: str) -> Op[KnowledgeNode]:
    return Op("graph.get", {"node_id": node_id}, KnowledgeNode)


def op_add_memory(
    domain: str,
    category: str,
    title: str,
    content: str,
    confidence: float | None,
    tags: list[str] | None,
    source_session: str | None,
    dedup: bool,
    **extra: Any,
) -> Op[MemoryAddResult]:
    params = _drop_none(
        domain=domain,
        category=category,
        title=title,
        content=content,
        confidence=confidence,
        tags=list(tags) if tags else None,
        source_session=source_session or None,
        **extra,
    )
    params["dedup"] = dedup
    return Op("memory.add", params, MemoryAddResult)


def op_add_memories(items: list[dict[str, Any]]) -> Op[list[MemoryAddResult]]:
    return Op("memory.add_many", {"items": [to_wire(item) for item in items]}, list[MemoryAddResult])


def op_search_memories(
    query: str, domain: str | None, k: int, categories: list[str] | None, **extra: Any
) -> Op[list[MemoryHit]]:
    return Op("memory.search", _drop_none(query=query, domain=domain, k=k, categories=categories, **extra), list[MemoryHit])


def op_inject(
    domain: str,
    k: int,
    query: str | None,
    token_budget: int | None,
    group: str | None = None,
    messages: int | None = None,
    include_summary: bool | None = None,
    min_score: float | None = None,
) -> Op[Injection]:
    params = _drop_none(
        domain=domain, k=k, query=query, token_budget=token_budget, group=group, messages=messages,
        include_summary=include_summary, min_score=min_score,
    )
    return Op("memory.inject", params, Injection)


def op_get_memory(memory_id: str) -> Op[Memory]:
    return Op("memory.get", {"id": memory_id}, Memory)


def op_list_memories(
    domain: str | None, category: str | None, status: str | None, limit: int | None, offset: int | None,
    readable: bool = False, order: str | None = None,
) -> Op[MemoryPage]:
    params = _drop_none(domain=domain, category=category, status=status, limit=limit, offset=offset, order=order)
    if readable:
        params["readable"] = True
    return Op("memory.list", params, MemoryPage)


def op_memory_strength(memory_ids: list[str]) -> Op[list[dict[str, Any]]]:
    return Op("memory.strength", {"ids": list(memory_ids)}, list[dict[str, Any]])


def op_memory_domains(domain: str | None) -> Op[dict[str, Any]]:
    return Op("memory.domains", _drop_none(domain=domain), dict[str, Any])


MEMORY_UPDATE_FIELDS = frozenset({
    "title", "content", "category", "confidence", "tags", "scope", "abstract", "overview", "pinned", "valid_from", "valid_until",
    "attributed_to",
})


NULLABLE_UPDATE_FIELDS = frozenset({"valid_from", "valid_until", "attributed_to"})  # None is sent: null clears them


def op_update_memory(memory_id: str, **fields: Any) -> Op[Memory]:
    unknown = set(fields) - MEMORY_UPDATE_FIELDS
    if unknown:
        raise TypeError(
            f"update_memory() got unknown fields: {', '.join(sorted(unknown))}; "
            f"it changes {', '.join(sorted(MEMORY_UPDATE_FIELDS))} (the domain cannot change)"
        )
    kept = {k: v for k, v in fields.items() if k in NULLABLE_UPDATE_FIELDS}
    others = _drop_none(**{k: v for k, v in fields.items() if k not in NULLABLE_UPDATE_FIELDS})
    return Op("memory.update", {"id": memory_id, **others, **kept}, Memory)


def op_delete_memory(memory_id: str, purge: bool) -> Op[MemoryDeleted]:
    return Op("memory.delete", {"id": memory_id, "purge": bool(purge)}, MemoryDeleted)


def op_restore_memory(memory_id: str) -> Op[Memory]:
    return Op("memory.restore", {"id": memory_id}, Memory)


def op_memory_feedback(ids: list[str], signal: str) -> Op[MemoryFeedbackResult]:
    return Op("memory.feedback", {"ids": list(ids), "signal": signal}, MemoryFeedbackResult)


def op_scan_skills() -> Op[dict[str, int]]:
    return Op("skills.scan", {})


def op_maintain() -> Op[str]:
    return Op("sys.maintain", {}, post=lambda r: r.get("job_id") if isinstance(r, dict) else r)


def op_job(job_id: str) -> Op[Job]:
    return Op("jobs.get", {"id": job_id}, Job)


def op_wait_job(job_id: str, timeout: float | None) -> Op[Job]:
    return Op("jobs.wait", _drop_none(id=job_id, timeout=timeout), Job, extra_wait=timeout or 0.0)


def op_jobs(state: str | None, kind: str | None, limit: int | None) -> Op[list[Job]]:
    return Op("jobs.list", _drop_none(state=state, kind=kind, limit=limit), list[Job])


def op_cancel_job(job_id: str) -> Op[Job]:
    return Op("jobs.cancel", {"id": job_id}, Job)


def op_retry_job(job_id: str) -> Op[Job]:
    return Op("jobs.retry", {"id": job_id}, Job)


def op_memory_history(memory_id: str) -> Op[list[MemoryVersion]]:
    return Op("memory.history", {"id": memory_id}, list[MemoryVersion])


def op_append_conversation(group: str, messages: list[dict[str, Any]]) -> Op[dict[str, Any]]:
    return Op("conversation.append", {"group": group, "messages": messages})


def op_conversation_get(group: str, since: str | None, limit: int | None) -> Op[list[dict[str, Any]]]:
    return Op("conversation.get", _drop_none(group=group, since=since, limit=limit))


def op_conversation_groups() -> Op[list[dict[str, Any]]]:
    return Op("conversation.groups", {})


def op_conversation_search(
    group: str, query: str, k: int, since: str | None, until: str | None
) -> Op[list[dict[str, Any]]]:
    return Op("conversation.search", _drop_none(group=group, query=query, k=k, since=since, until=until))


def op_summary(group: str) -> Op[dict[str, Any]]:
    return Op("conversation.summary", {"group": group})


def op_flush_conversation(group: str) -> Op[str | None]:
    """conversation.flush: the job's id, or None when the group has nothing new to extract."""
    return Op("conversation.flush", {"group": group}, post=lambda r: r.get("job_id") if isinstance(r, dict) else r)


FLUSH_WAIT = 30.0  # seconds flush(wait=True) waits for the job when no timeout is given (jobs.wait's default)


# --- skills ---------------------------------------------------------------------------------------

SKILL_FIELDS = frozenset(
    {
        "version", "tags", "agent_roles", "pipeline_stages", "description", "source", "status", "created_at",
        "usage_count", "success_rate",
    }
)


def op_list_skills(agent_role: str | None, tag: str | None, status: str | None) -> Op[list[Skill]]:
    return Op("skills.list", _drop_none(agent_role=agent_role, tag=tag, status=status), list[Skill])


def op_skill(name: str) -> Op[Skill]:
    return Op("skills.get", {"name": name}, Skill)


def op_search_skills(query: str, k: int, **extra: Any) -> Op[list[SkillHit]]:
    return Op("skills.search", _drop_none(query=query, k=k, **extra), list[SkillHit])


def op_put_skill(name: str, body: str, **fields: Any) -> Op[Skill]:
    unknown = set(fields) - SKILL_FIELDS
    if unknown:
        raise TypeError(f"put_skill() got unknown Skill fields: {', '.join(sorted(unknown))}")
    return Op("skills.put", _drop_none(name=name, body=body, **fields), Skill)


def op_record_skill_use(name: str, success: bool) -> Op[Skill]:
    return Op("skills.record_use", {"name": name, "success": bool(success)}, Skill)


def op_confirm_skill(name: str) -> Op[Skill]:
    return Op("skills.confirm", {"name": name}, Skill)


def op_discard_skill(name: str) -> Op[Skill]:
    return Op("skills.discard", {"name": name}, Skill)


def op_inject_skills(
    agent_role: str, pipeline_stage: str | None, query: str | None, k: int | None, token_budget: int | None
) -> Op[SkillsInjection]:
    params = _drop_none(agent_role=agent_role, pipeline_stage=pipeline_stage, query=query, k=k)
    return Op("skills.inject", {**params, **_drop_none(token_budget=token_budget)}, SkillsInjection)



# --- scopes and review: promotion of local memories to global ---------------------------------


def op_promote(memory_id: str, reason: str | None, by: str | None) -> Op[Promotion]:
    return Op("memory.promote", _drop_none(id=memory_id, reason=reason, by=by), Promotion)


def op_reviews(
    state: str | None, domain: str | None, limit: int | None, offset: int | None
) -> Op[list[ReviewView]]:
    return Op("review.list", _drop_none(state=state, domain=domain, limit=limit, offset=offset), list[ReviewView])


def op_approve(review_id: str, by: str | None) -> Op[ReviewView]:
    return Op("review.approve", _drop_none(id=review_id, by=by), ReviewView)


def op_reject(review_id: str, reason: str | None, by: str | None) -> Op[ReviewView]:
    return Op("review.reject", _drop_none(id=review_id, reason=reason, by=by), ReviewView)
