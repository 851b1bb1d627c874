"""What memory.inject puts in its <memories> block, within the token budget.

Rule kept here: the block is built from what it is given alone (the memories chosen, the
conversation summary, the messages found), never from the state, and every piece of stored text in
it is data: a tag that would close or forge the block, or a line that would read as an entry's
heading, is escaped (protocol/blocks.py); each part counts by retrieval/text.py's estimate_tokens.
"""

from __future__ import annotations

from typing import Any

from ...protocol import Memory
from ...protocol.blocks import MEMORIES_NOTE, escape_block_tags, escape_stored
from ..retrieval.text import estimate_tokens
from .prepared import GroupSummary


def fit_messages(group: str, hits: list[dict[str, Any]], budget: int | None, parts: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
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


def summary_part(found: GroupSummary | None) -> str | None:
    """The block's "Conversation summary" section for the domain's group (read into the batch's
    Prepared by the actor), or None when the group has no summary."""
    if found is None or not (found.summary.strip() or found.intents):
        return None
    lines = ["# Conversation summary", ""]
    if found.summary.strip():
        lines.append(escape_stored(found.summary.strip()))
    if found.intents:
        lines += ["", "Likely next:"] + [f"- {escape_stored(intent)}" for intent in found.intents]
    return "\n".join(lines)


def fit_memories(chosen: list[Memory], budget: int | None, head: str | None = None) -> tuple[list[str], list[Memory]]:
    """The summary section first (when given and it fits), then each memory's full text, else its
    overview, else its abstract, within the token budget; stored text is data: a tag that would
    close or forge the block, or a line that would read as an entry's heading, is escaped
    (protocol/blocks.py)."""
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
