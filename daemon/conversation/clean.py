"""What an extraction may learn from: a conversation's messages without the text the service (or the
assistant's harness) put there itself.

Rule kept here: the model that extracts memories never sees
- a message whose role is `system` or `tool` (system prompts, tool output marked as such);
- a block this daemon injects: `<memories>...</memories>` (memory.inject, with its summary and
  intents when include_summary asked for them) and `<skills>...</skills>` (skills.inject), matched
  whatever the case and spacing of the tags (as protocol/_blocks.py escapes them), an unclosed one
  up to the end of the text (a block cut short is still injected text);
- the blocks agent harnesses wrap around what is not the user's words: `<system-reminder>`,
  `<system>`, `<tool_result>`, `<tool_output>`, `<tool_call>`, `<function_results>`,
  `<function_calls>`, and channel metadata: `<channel_metadata>`, `<metadata>`, `<channel>` blocks
  and lines of the form `[metadata ...]`, `[channel ...]`, `[meta ...]`;
so that what memory.inject returned, fed back through a conversation, never becomes a memory again
(the recall -> re-extraction loop that fills peer systems with copies of one hallucination).
A message left empty by this is not shown at all. The function is pure and counts what it removed.
"""

from __future__ import annotations

import dataclasses
import re

SKIPPED_ROLES = frozenset({"system", "tool"})

# injected by this daemon (memory.inject, skills.inject)
INJECTED_TAGS: tuple[str, ...] = ("memories", "skills")
# what harnesses and channel bridges wrap around text that is not the participants' own
HARNESS_TAGS: tuple[str, ...] = (
    "system-reminder",
    "system",
    "tool_result",
    "tool_output",
    "tool_call",
    "function_results",
    "function_calls",
    "channel_metadata",
    "metadata",
    "channel",
)


def _block(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(tag) for tag in sorted(tags, key=len, reverse=True))
    # <tag ...> up to the first </tag>, or, unclosed, to the end of the text
    return re.compile(rf"<\s*({names})(?![\w-])[^>]*>.*?(?:<\s*/\s*\1\s*>|\Z)", re.IGNORECASE | re.DOTALL)


_INJECTED = _block(INJECTED_TAGS)
_HARNESS = _block(HARNESS_TAGS)
_STRAY = re.compile(  # a closing tag whose opening was not in this message
    rf"<\s*/\s*(?:{'|'.join(re.escape(t) for t in INJECTED_TAGS + HARNESS_TAGS)})\s*>", re.IGNORECASE
)
_METADATA_LINE = re.compile(r"^[ \t]*\[(?:metadata|channel|meta)\b[^\]\n]*\][^\n]*$\n?", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass
class Stripped:
    """What cleaning removed from a window (the job's result reports it)."""

    system_or_tool: int = 0  # messages left out by their role
    injected_blocks: int = 0  # <memories> / <skills> blocks removed
    harness_blocks: int = 0  # harness and channel-metadata blocks and lines removed
    emptied: int = 0  # messages with nothing left

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def clean_text(text: str, counts: Stripped | None = None) -> str:
    """`text` without injected blocks, harness blocks and metadata lines (see the module's rule)."""
    counts = counts if counts is not None else Stripped()
    if "<" in text:
        text, n = _INJECTED.subn("", text)
        counts.injected_blocks += n
        text, n = _HARNESS.subn("", text)
        counts.harness_blocks += n
        text = _STRAY.sub("", text)
    if "[" in text:
        text, n = _METADATA_LINE.subn("", text)
        counts.harness_blocks += n
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def usable_text(role: str, text: str, counts: Stripped) -> str:
    """What the extraction may see of one message ("": nothing)."""
    if role in SKIPPED_ROLES:
        counts.system_or_tool += 1
        return ""
    cleaned = clean_text(text, counts)
    if not cleaned:
        counts.emptied += 1
    return cleaned
