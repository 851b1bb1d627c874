"""What a conversation extraction asks the LLM for (job kind `conversation.extract`): the answer's shape.

The LLM layer (daemon/llm) checks an answer against ConversationInsights before the job sees it:
unknown fields, a type that is not one of the five, confidence outside 0..1, empty text, more than
MAX_MEMORIES memories or more than 3 intents are refused and asked once more (then the job fails
with the reason). The job checks what the schema cannot (daemon/jobs/conversation.py): every
`source_messages` entry must be one of the local ids (M1, M2, ...) the prompt showed, and `when`
must parse as a date or an RFC 3339 timestamp.

How the five types land in tier 4 (PROTOCOL.md, "conversation.flush"): `type` is the memory's
category (tier 4 has the categories fact, preference, skill, goal and context); `title`, `abstract`
(L0), `overview` (L1), `content` (L2) and `confidence` are the memory's; the source messages' ids
become the memory's `source_message_ids`; `attributed_to` its `attributed_to` (who it is about: a
participant's name as the messages give it, "" for the group as a whole); `when`, resolved against
the messages' dates, its `refers_to`; its `valid_from` is the time of its newest source message
(when the group said it, so a memory extracted from an old conversation is valid from then).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from ...protocol import ASSISTANT_CATEGORIES, AssistantCategory

MEMORY_TYPES = ASSISTANT_CATEGORIES
MAX_MEMORIES = 24  # memories in one answer
MAX_SOURCES = 64  # source messages of one memory
MAX_INTENTS = 3

MemoryType = AssistantCategory
Title = Annotated[str, Meta(min_length=1, max_length=200)]
Abstract = Annotated[str, Meta(min_length=1, max_length=400)]
Overview = Annotated[str, Meta(min_length=1, max_length=2000)]
Content = Annotated[str, Meta(min_length=1, max_length=4000)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]
LocalId = Annotated[str, Meta(min_length=2, max_length=16)]  # M1, M2, ... as the prompt shows them
Person = Annotated[str, Meta(max_length=256)]
When = Annotated[str, Meta(min_length=4, max_length=64)]
SummaryText = Annotated[str, Meta(max_length=4000)]
Intent = Annotated[str, Meta(min_length=1, max_length=300)]


class ExtractedMemory(msgspec.Struct, forbid_unknown_fields=True):
    """One memory the group's new messages establish."""

    type: MemoryType  # fact | preference | skill | goal | context: the tier-4 category
    title: Title  # a few words
    abstract: Abstract  # L0: one line of at most 20 words
    overview: Overview  # L1: two to four sentences that stand alone
    content: Content  # L2: the full, self-contained statement (names and dates spelled out)
    confidence: Confidence  # 0..1; below 0.5 it is not kept
    source_messages: Annotated[list[LocalId], Meta(min_length=1, max_length=MAX_SOURCES)]  # M ids it came from
    attributed_to: Person = ""  # who it is about (a participant's name as the messages give it); "" = the group
    when: When | None = None  # the date or time it refers to, resolved against the messages' dates; null: none


class ConversationInsights(msgspec.Struct, forbid_unknown_fields=True):
    """What one extraction of a group's new messages gives: memories, the rolling summary, intents."""

    summary: SummaryText  # the group's updated rolling summary (the old one plus what the new messages add)
    memories: Annotated[list[ExtractedMemory], Meta(max_length=MAX_MEMORIES)] = []
    intents: Annotated[list[Intent], Meta(max_length=MAX_INTENTS)] = []  # the group's likely next requests
