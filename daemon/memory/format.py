"""Tier 4 on disk in EurekaClaw's shapes: slugs, fingerprints, the .md files and _index.json.

Rule kept here: the names and formats are exactly EurekaClaw's (domain slug
`re.sub(r"[^\\w]", "_", domain.lower())[:30]` or "general"; file `YYYYMMDD_<slug>.md` with
`_<fp[:4]>` on a clash; frontmatter `category, title, domain, confidence, created_at` first; body
`# title`, blank line, content), values that need it are quoted so the frontmatter is valid YAML,
and reading is lenient: unquoted values with colons, missing headings, missing fields.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ...protocol import Memory

_NON_WORD = re.compile(r"[^\w]")


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])")


_WORD = re.compile(r"\S+")


def title_slug(title: str) -> str:
    return _NON_WORD.sub("_", title.lower())[:40]


def fingerprint(title: str, content: str) -> str:
    """The exact-duplicate key, the one definition every fingerprint is made by (the dedup, the
    judge, extraction, imports, the watch of memories/, `eurekamem verify`): of the text as a memory
    stores it, title and content each stripped (str.strip: every Unicode white space, U+2028,
    U+0085, NBSP, U+3000 ...), joined, lower-cased, sha256, 16 hex digits. That is EurekaClaw's
    sha256((title + content).strip().lower()) over its stripped content, and, a stored memory's
    parts being stripped already, the value every existing file and _index.json holds. (Stripping
    only the whole left the white space between the parts, title "T" + content U+2028 "text", which
    the stored text no longer has: the same text sent again stripped was no exact duplicate.)"""
    return hashlib.sha256((title.strip() + content.strip()).lower().encode()).hexdigest()[:16]


def word_set(text: str) -> frozenset[str]:
    """The words keyword overlap compares: lower-cased, split on white space."""
    return frozenset(text.lower().split())


def word_overlap(existing_words: frozenset[str], new_words: frozenset[str]) -> float:
    """EurekaClaw's fast near-duplicate test: the share of the new text's words found in the
    existing one (word sets made once: an add compares one new text with up to 50 others)."""
    return len(existing_words & new_words) / max(len(new_words), 1)


def derive_abstract(content: str, max_words: int = 20) -> str:
    """L0 without an LLM: the first sentence, at most max_words words (whole words only)."""
    text = " ".join(content.split(None, max_words + 1)[: max_words + 1])  # past word 21 nothing changes the answer
    first = _SENTENCE_END.split(text, maxsplit=1)[0] if text else ""
    words = first.split()
    if len(words) > max_words:
        return " ".join(words[:max_words]) + " …"
    if len(first) > 200 and len(words) <= 1:  # one long run without spaces (e.g. Chinese)
        return first[:60] + "…"
    return first


def derive_overview(content: str, max_words: int = 80) -> str:
    """L1 without an LLM: the first paragraph, at most max_words words."""
    paragraph = content.strip().split("\n\n", 1)[0]
    words = paragraph.split()
    if len(words) > max_words:
        return " ".join(words[:max_words]) + " …"
    if len(paragraph) > 600 and len(words) <= 1:
        return paragraph[:200] + "…"
    return " ".join(words)


_PLAIN = re.compile(r"^[\w .,()/+\-–—'’]*$", re.UNICODE)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text and _PLAIN.match(text) and text.strip() == text and text[0] not in "-?!&*'\"" and text.lower() not in ("true", "false", "null", "yes", "no", "~"):
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid YAML double-quoted scalar


def render_markdown(memory: Memory) -> str:
    lines = [
        "---",
        f"category: {_yaml_scalar(memory.category)}",
        f"title: {_yaml_scalar(memory.title)}",
        f"domain: {_yaml_scalar(memory.domain or 'general')}",
        f"confidence: {memory.confidence:.2f}",
        f"created_at: {_yaml_scalar(memory.created_at)}",
        f"id: {_yaml_scalar(memory.id)}",
        f"updated_at: {_yaml_scalar(memory.updated_at)}",
        f"scope: {memory.scope}",
        f"status: {memory.status}",
        f"fingerprint: {memory.fingerprint}",
        f"abstract: {_yaml_scalar(memory.abstract)}",
        f"tags: {json.dumps(memory.tags, ensure_ascii=False)}",
    ]
    if memory.source_session:
        lines.append(f"source_session: {_yaml_scalar(memory.source_session)}")
    # the lifecycle, each only when it is not its default (files without them read as defaults)
    if memory.pinned:
        lines.append("pinned: true")
    for name in ("valid_from", "valid_until", "superseded_by", "last_used"):
        value = getattr(memory, name)
        if value is not None:
            lines.append(f"{name}: {_yaml_scalar(value)}")
    for name in ("used_count", "ignored_count", "wrong_count"):
        if getattr(memory, name):
            lines.append(f"{name}: {getattr(memory, name)}")
    if memory.archived_reason:
        lines.append(f"archived_reason: {_yaml_scalar(' '.join(memory.archived_reason.split()))}")
    if memory.raw:
        lines.append("raw: true")
    # a conversation memory's origin (issue 12), each only when set
    if memory.source_message_ids:
        lines.append(f"source_message_ids: {json.dumps(memory.source_message_ids, ensure_ascii=False)}")
    if memory.attributed_to:
        lines.append(f"attributed_to: {_yaml_scalar(memory.attributed_to)}")
    if memory.refers_to is not None:
        lines.append(f"refers_to: {_yaml_scalar(memory.refers_to)}")
    lines += ["---", "", f"# {memory.title}", "", memory.content.rstrip("\n"), ""]
    return "\n".join(lines)


def parse_markdown(text: str) -> tuple[dict[str, Any], str, str | None]:
    """(frontmatter fields, content, title from a '# ' heading or None), read leniently."""
    fields: dict[str, Any] = {}
    body = text
    if text.startswith("---"):
        parts = text.split("\n", 1)
        rest = parts[1] if len(parts) > 1 else ""
        end = rest.find("\n---")
        if rest.startswith("---"):
            end = -1
            header, body = "", rest[3:]
        elif end >= 0:
            header, body = rest[:end], rest[end + 4 :]
        else:
            header, body = "", text
        for line in header.split("\n"):  # not splitlines(): a quoted value may hold U+2028 and the like
            if ":" not in line:
                continue
            key, _, value = line.partition(":")  # split at the first colon: values may hold colons
            fields[key.strip()] = _unquote(value.strip())
    body = body.lstrip("\n")
    heading = None
    if body.startswith("# "):
        first, _, remainder = body.partition("\n")
        heading = first[2:].strip()
        body = remainder.lstrip("\n")
    return fields, body.strip(), heading


def _unquote(value: str) -> Any:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return json.loads(value)
        except ValueError:
            return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if value.startswith("[") and value.endswith("]"):
        try:
            return json.loads(value)
        except ValueError:
            return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return value


def index_entry(memory: Memory, old: Any = None) -> dict[str, Any]:
    """One _index.json entry: EurekaClaw's keys first (no embedding floats: vectors live elsewhere).

    `old` is the entry the folder's _index.json holds for the memory's file; what it holds stays,
    ours merged in: its created_at as written (a file is created once; EurekaClaw's is its own
    `now()`, a little after the file's, and its load_for_injection sorts by it), its other keys,
    its embedding only while the memory's fingerprint is the one it was computed for."""
    entry = {
        "fingerprint": memory.fingerprint,
        "created_at": memory.created_at,
        "category": memory.category,
        "id": memory.id,
        "title": memory.title,
        "confidence": memory.confidence,
        "scope": memory.scope,
        "updated_at": memory.updated_at,
    }
    if not isinstance(old, dict):
        return entry
    kept = {k: v for k, v in old.items() if k != "embedding" or old.get("fingerprint") == memory.fingerprint}
    merged = {**kept, **entry}
    if isinstance(old.get("created_at"), str):
        merged["created_at"] = old["created_at"]
    return merged




# --- the readable projection: memories/<domain_slug>/MEMORY.md and memories/GLOBAL.md -------------

# Files of the readable projection: written by the daemon for people (and for an agent without a
# socket), never memories themselves, so every reader of memory files skips them.
READABLE_FILES = frozenset({"MEMORY.md", "GLOBAL.md"})


def memory_files(base: Any) -> list[Any]:
    """The memory files under memories/ (a pathlib.Path): <slug>/*.md and <slug>/_archive/*.md, sorted,
    without the readable projection's MEMORY.md and GLOBAL.md."""
    paths = sorted(base.glob("*/*.md")) + sorted(base.glob("*/_archive/*.md"))
    return [path for path in paths if path.name not in READABLE_FILES]
