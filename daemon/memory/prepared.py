"""What a batch of tier 4 needs before its handlers run, read off the requests alone.

Rule kept here: every function here looks at a request's params only, never at the state, so the
actor can route a write (its lane, by what it will have embedded) and embed a batch's texts and
read its conversation summaries and messages without the state lock; `Prepared` carries what it
got into the batch.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from ...protocol import methods as m
from .params import MIN_CONFIDENCE


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
        # while the model changes: each query by the old model too, for the memories not re-embedded
        # yet (memory/search.py's dense_prev side), so no search embeds inside the batch
        self.previous_queries: dict[str, np.ndarray] = {}
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
