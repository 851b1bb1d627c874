"""What an extraction may learn from: a conversation's messages without the text the service (or the
assistant's harness) put there itself.

Rule kept here: the model that extracts memories never sees
- a message whose role is `system` or `tool` (system prompts, tool output marked as such);
- a block this daemon injects: `<memories>...</memories>` (memory.inject, with its summary and
  intents when include_summary asked for them), `<skills>...</skills>` (skills.inject), and their
  elements' `<memory>` and `<skill>` blocks, an unclosed one up to the end of the text (a block cut
  short is still injected text);
- the blocks agent harnesses wrap around what is not the user's words: `<system-reminder>`,
  `<system>`, `<tool_result>`, `<tool_output>`, `<tool_call>`, `<function_results>`,
  `<function_calls>`, and channel metadata: `<channel_metadata>`, `<metadata>`, `<channel>` blocks
  and lines of the form `[metadata ...]`, `[channel ...]`, `[meta ...]`;
- a closing tag of any of these whose opening was not in the message;
so that what memory.inject returned, fed back through a conversation, never becomes a memory again
(the recall -> re-extraction loop that fills peer systems with copies of one hallucination).

Tags are matched as a reader sees them, as protocol/blocks.py escapes them (one list of names and
one scanner for both): on a normalised view (each character NFKC-normalised, homoglyphs read as the
Latin letter they show, case ignored, zero-width, format and combining characters skipped, any
look-alike of `<`), while the cuts are made in the message's own text: what the model reads is the
message as written, less the blocks, never a normalised copy. Cleaning runs to a fixed point: a cut
can join the text around it into a new tag (`<mem<memories>x</memories>ories>`, or a stray closing
tag or metadata line between the halves), so passes repeat until one changes nothing. Each pass
costs one read of the text and removes at least one nesting level; a message that still changes
after MAX_PASSES passes (nesting no message needs) is withheld whole, as injected text.
A message left empty by this is not shown at all. The function is pure and counts what it removed.
"""

from __future__ import annotations

import bisect
import dataclasses
import re

from ...protocol.blocks import BLOCK_TAGS, CLOSERS, HARNESS_TAGS, Tag, TagNames, find_tags, is_unseen

SKIPPED_ROLES = frozenset({"system", "tool"})

INJECTED_TAGS = BLOCK_TAGS  # injected by this daemon (memory.inject, skills.inject) and their elements
MAX_PASSES = 16

_NAMES = TagNames(INJECTED_TAGS + HARNESS_TAGS)
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


def _closing_end(text: str, tag: Tag) -> int:
    """Where a closing tag ends: after its `>` (or a look-alike) when only spaces, hyphens and what a
    reader does not see lie before it."""
    i = tag.end
    while i < len(text) and text[i] not in CLOSERS and (text[i].isspace() or text[i] in "-_" or is_unseen(text[i])):
        i += 1
    return i + 1 if i < len(text) and text[i] in CLOSERS else tag.end


def _one_pass(text: str, counts: Stripped) -> str:
    """`text` less every block and stray closing tag seen in it (one read, left to right)."""
    tags = list(find_tags(text, _NAMES))
    if not tags:
        return text
    closings: dict[str, list[int]] = {}
    for index, tag in enumerate(tags):
        if tag.closing:
            closings.setdefault(tag.name, []).append(index)
    kept: list[str] = []
    last = 0
    index = 0
    while index < len(tags):
        tag = tags[index]
        if tag.start < last:  # inside what was cut already
            index += 1
            continue
        kept.append(text[last : tag.start])
        if tag.closing:  # its opening was not in this message
            last = _closing_end(text, tag)
            index += 1
            continue
        if tag.name in INJECTED_TAGS:
            counts.injected_blocks += 1
        else:
            counts.harness_blocks += 1
        ends = closings.get(tag.name, [])
        after = bisect.bisect_right(ends, index)
        if after == len(ends):  # unclosed: injected text up to the end
            last = len(text)
            break
        last = _closing_end(text, tags[ends[after]])
        index = ends[after] + 1
    kept.append(text[last:])
    return "".join(kept)


def clean_text(text: str, counts: Stripped | None = None) -> str:
    """`text` without injected blocks, harness blocks and metadata lines (see the module's rule)."""
    counts = counts if counts is not None else Stripped()
    for _ in range(MAX_PASSES):
        cleaned = _one_pass(text, counts)
        if "[" in cleaned:
            cleaned, n = _METADATA_LINE.subn("", cleaned)
            counts.harness_blocks += n
        if cleaned == text:
            return re.sub(r"\n{3,}", "\n\n", text).strip()
        text = cleaned
    counts.injected_blocks += 1  # still changing: nested past any honest need, withheld whole
    return ""


def usable_text(role: str, text: str, counts: Stripped) -> str:
    """What the extraction may see of one message ("": nothing)."""
    if role in SKIPPED_ROLES:
        counts.system_or_tool += 1
        return ""
    cleaned = clean_text(text, counts)
    if not cleaned:
        counts.emptied += 1
    return cleaned
