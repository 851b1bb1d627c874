"""Claude Code's session transcript (JSONL) read from a mark, as conversation messages.

Rules kept here:
- A read starts at the mark the last one left (a byte offset, with the file's identity and a digest
  of its first bytes and of the bytes just before it) and takes whole lines only: a last line without its newline is left
  for the next read unless it already parses as a JSON object (then it is whole: a cut object
  never parses). A file that was truncated, replaced (another inode) or rewritten (its first bytes
  or the bytes just before the mark differ) is read again from its start; that is safe because every message keeps the id
  it had (the line's `uuid`, else a digest of the line), and conversation.append ignores ids the
  group holds, so nothing is stored twice.
- Only what the user and the assistant said becomes a message: a user line's text, an assistant
  line's text. Lines the harness writes (`isMeta`, compaction summaries, sidechains of sub-agents,
  slash-command records, attachments, `summary`, `system`, `progress`, file snapshots) and the
  hooks' own injected context are left out; so is thinking. A tool call is kept as its name and
  outcome only (`[Bash: ok]`, `[Edit failed: <first line of the error, at most 200 characters>]`),
  never its input or its output. Injected `<memories>` blocks a user pastes back are left to the
  daemon, whose extraction never reads them (PROTOCOL.md, conversation.flush, step 2).
- A timestamp that does not parse is dropped (the daemon stamps the message), so that one odd line
  can never make the whole append refused, and every id is an Ident the daemon accepts.
Only the standard library: this runs in every hook process.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Mark", "Read", "messages_of", "read_since"]

TAIL = 64  # bytes before the mark whose digest says the file was not rewritten
MAX_READ = 64 * 1024 * 1024  # bytes one read takes at most (the rest waits for the next read)
MAX_TEXT = 8000  # characters of one message kept (the extraction reads ~12k tokens a window)
MAX_ERROR = 200  # characters of a failed tool's first error line
MAX_TOOLS = 256  # tool calls whose result has not been seen yet, remembered between reads
MAX_IDENT = 256  # the protocol's Ident
HARNESS_PREFIXES = (  # user lines Claude Code writes for itself: slash commands and their output
    "<command-name>", "<command-message>", "<command-args>", "<local-command-stdout>",
    "<local-command-stderr>", "<local-command-caveat>", "Caveat: The messages below were generated",
    "[Request interrupted by user",
)


@dataclass
class Mark:
    """Where the last read of a transcript ended."""

    offset: int = 0
    dev: int = 0
    ino: int = 0
    tail: str = ""  # blake2b of the file's first TAIL bytes and of the TAIL bytes before offset

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "dev": self.dev, "ino": self.ino, "tail": self.tail}

    @classmethod
    def from_dict(cls, raw: Any) -> Mark:
        if not isinstance(raw, dict):
            return cls()
        try:
            return cls(int(raw.get("offset", 0)), int(raw.get("dev", 0)), int(raw.get("ino", 0)), str(raw.get("tail", "")))
        except (TypeError, ValueError):
            return cls()


@dataclass
class Read:
    entries: list[dict[str, Any]]
    mark: Mark
    restarted: bool = False  # the file was read again from its start (truncated, replaced, rewritten)
    bad_lines: int = 0  # lines that were not JSON objects (skipped)
    more: bool = False  # MAX_READ stopped the read before the end


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _tail_of(f: Any, offset: int) -> str:
    f.seek(0)
    head = f.read(min(TAIL, offset))
    start = max(0, offset - TAIL)
    f.seek(start)
    return _digest(head + f.read(offset - start))


def read_since(path: str, mark: Mark) -> Read:
    """The transcript's entries after `mark`, and the mark after them. OSError if it cannot be read."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        start, restarted = mark.offset, False
        same_file = (mark.dev, mark.ino) == (st.st_dev, st.st_ino)
        if mark.offset and (not same_file or st.st_size < mark.offset or _tail_of(f, mark.offset) != mark.tail):
            start, restarted = 0, True
        f.seek(start)
        data = f.read(MAX_READ)
        more = start + len(data) < st.st_size
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")
        rest = data[end:]
        if rest.strip() and not more and _object(rest) is not None:  # whole, its newline not written yet
            lines.append(rest)
            end = len(data)
        tail = _tail_of(f, start + end)
    entries, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        entry = _object(line)
        if entry is None:
            bad += 1
            continue
        entry["_line_digest"] = _digest(line)
        entries.append(entry)
    return Read(entries, Mark(start + end, st.st_dev, st.st_ino, tail), restarted, bad, more)


def _object(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- entries -> messages --------------------------------------------------------------------------


@dataclass
class Tools:
    """Tool calls seen whose result has not been read yet: id -> name (oldest first, bounded)."""

    pending: dict[str, str] = field(default_factory=dict)

    def called(self, ident: str, name: str) -> None:
        self.pending[ident] = name
        while len(self.pending) > MAX_TOOLS:
            del self.pending[next(iter(self.pending))]

    def answered(self, ident: str) -> str:
        return self.pending.pop(ident, "tool")


def _ident(value: Any, fallback: str) -> str:
    if isinstance(value, str) and value and len(value) <= MAX_IDENT and "\x00" not in value:
        return value
    return fallback


def _timestamp(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return value


def _cut(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT].rstrip() + " [...]"


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]


def _error_line(content: Any) -> str:
    text = "\n".join(_texts(content)).strip()
    first = text.splitlines()[0] if text else ""
    return first[:MAX_ERROR]


def _skipped(entry: dict[str, Any]) -> bool:
    return bool(entry.get("isMeta") or entry.get("isCompactSummary") or entry.get("isSidechain")
                or entry.get("isVisibleInTranscriptOnly"))


def messages_of(entries: list[dict[str, Any]], tools: Tools, *, session: str, user: str) -> list[dict[str, Any]]:
    """conversation.append's messages for the entries (in order); `tools` carries tool calls across reads."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        kind = entry.get("type")
        message = entry.get("message")
        if kind not in ("user", "assistant") or not isinstance(message, dict) or _skipped(entry):
            continue
        ident = _ident(entry.get("uuid"), "cc-" + str(entry.get("_line_digest", "")))
        when = _timestamp(entry.get("timestamp"))
        content = message.get("content")
        base = {"session": session, **({"timestamp": when} if when else {})}
        if kind == "assistant":
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                    tools.called(block["id"], str(block.get("name") or "tool"))
            text = "\n\n".join(t.strip() for t in _texts(content) if t.strip())
            if text:
                out.append({"id": ident, "role": "assistant", "text": _cut(text), **base})
            continue
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                use = block.get("tool_use_id")
                name = tools.answered(use) if isinstance(use, str) else "tool"
                outcome = f"[{name} failed: {_error_line(block.get('content'))}]" if block.get("is_error") else f"[{name}: ok]"
                tool_id = _ident(f"tool-{use}" if isinstance(use, str) else None, f"{ident}-tool")
                out.append({"id": tool_id, "role": "assistant", "text": outcome, **base})
        text = "\n\n".join(t.strip() for t in _texts(content) if t.strip())
        if text and not text.startswith(HARNESS_PREFIXES):
            out.append({"id": ident, "role": "user", "sender": user, "text": _cut(text), **base})
    return out
