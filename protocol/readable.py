"""The readable projection's Markdown: a domain's MEMORY.md, GLOBAL.md, and search results in the
same form, for people (and for an agent that loads the text whole).

Rule kept here: one rendering for every reader. The daemon writes MEMORY.md / GLOBAL.md with
`render_readable` and answers memory.list's `readable` with it; the command line prints
`eurekamem memories search` with `render_hits`; both build each line with `memory_line`, whose text
is collapsed to one line and escaped (link brackets, `<`), so no stored text can break the list,
forge a link or open an HTML tag; a group's summary is quoted (`quoted`), so it cannot forge a
heading or a memory line. Sans-IO and dependency-free like the rest of protocol/: it reads
the fields it needs by name from a Memory or from the plain JSON dict of one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .categories import MEMORY_CATEGORIES

_NON_WORD = re.compile(r"[^\w]")


def domain_slug(domain: str) -> str:
    """A domain's identity and folder name, EurekaClaw's: `re.sub(r"[^\\w]", "_", domain.lower())[:30]`,
    "general" for no domain (domains with the same slug are the same domain)."""
    return _NON_WORD.sub("_", domain.lower())[:30] if domain else "general"

CATEGORY_HEADINGS: dict[str, str] = {
    "domain_knowledge": "Domain knowledge",
    "proof_strategy": "Proof strategies",
    "open_problems": "Open problems",
    "pitfalls": "Pitfalls",
    "fact": "Facts",
    "preference": "Preferences",
    "skill": "Skills",
    "goal": "Goals",
    "context": "Context",
}


GENERATED_NOTE = (
    "<!-- Written by eurekamem from the memory files; regenerated after every change (edits here are lost). -->"
)


def _field(memory: Any, name: str) -> Any:
    return memory.get(name) if isinstance(memory, dict) else getattr(memory, name)


def inline(text: str) -> str:
    """Text for one Markdown list line: white space collapsed, link brackets and HTML escaped."""
    text = " ".join(text.split())
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("<", "&lt;")


def quoted(text: str) -> list[str]:
    """A block of untrusted text (a group's summary, made from its messages) as a Markdown quote:
    each line behind `> ` and its `<` escaped, so no line of it is a heading, a list item or a tag
    of the file itself (it cannot forge a category or a memory of the projection)."""
    return [f"> {line}".rstrip() for line in text.strip().replace("<", "&lt;").splitlines()]


def memory_line(memory: Any, link: str, notes: Sequence[str] = ()) -> str:
    """`- [title](link): abstract`, then each note in parentheses."""
    line = f"- [{inline(_field(memory, 'title'))}]({link}): {inline(_field(memory, 'abstract') or '')}"
    return line + "".join(f" ({note})" for note in notes)


def render_readable(
    domain: str,
    entries: list[tuple[Any, float]],
    *,
    is_global: bool,
    has_global: bool,
    summary: str | None = None,
) -> str:
    """MEMORY.md of a domain (its local memories) or GLOBAL.md (every global memory): by category
    in MEMORY_CATEGORIES' order, strongest first (then newest), each as its title linking its
    file (relative to the file written) and its L0 abstract."""
    if is_global:
        lines = ["# Global memories", "", "Seen from every domain."]
    else:
        lines = [f"# Memories: {inline(domain)}"]
        if has_global:
            lines += ["", "Global memories, seen from every domain too: [GLOBAL.md](../GLOBAL.md)."]
    lines += ["", GENERATED_NOTE, ""]
    if summary and summary.strip():
        lines += ["## Summary", "", *quoted(summary), ""]
    by_category: dict[str, list[tuple[Any, float]]] = {}
    for memory, power in entries:
        by_category.setdefault(memory.category, []).append((memory, power))
    if not entries:
        lines += ["No active memories.", ""]
    for category in MEMORY_CATEGORIES:
        items = by_category.get(category)
        if not items:
            continue
        items.sort(key=lambda item: item[0].created_at, reverse=True)
        items.sort(key=lambda item: -item[1])  # stable: equal strength keeps newest first
        lines += [f"## {CATEGORY_HEADINGS.get(category, category)}", ""]
        for memory, _ in items:
            parts = memory.file.split("/")  # memories/<slug>/<name>.md
            link = "/".join(parts[1:]) if is_global else parts[-1]
            notes = [f"from {inline(memory.domain)}"] if is_global else []
            if memory.pinned:
                notes.append("pinned")
            lines.append(memory_line(memory, link, notes))
        lines.append("")
    return "\n".join(lines)


def render_hits(query: str, domain: str | None, hits: Sequence[dict[str, Any]]) -> str:
    """memory.search's hits (the JSON answer, best first) as MEMORY.md shows memories: under their
    category's heading (the categories in the order of their best hit, each best first), each its
    title linking its file (relative to the data root) and its L0 abstract, then its score, its id's
    first 8 characters, and its domain when that is not the one searched."""
    where = f" in {inline(domain)}" if domain is not None else ""
    lines = [f"# Memories for {inline(query)!r}{where}", "",
             "Best first within each category; links are relative to the data root.", ""]
    by_category: dict[str, list[dict[str, Any]]] = {}
    for hit in hits:
        by_category.setdefault(hit["memory"]["category"], []).append(hit)
    for category, items in by_category.items():  # dicts keep insertion order: by each one's best hit
        lines += [f"## {CATEGORY_HEADINGS.get(category, category)}", ""]
        for hit in items:
            memory = hit["memory"]
            notes = [f"score {hit['score']:.3f}", memory["id"][:8]]
            theirs = memory.get("domain") or ""
            if domain is None or domain_slug(theirs) != domain_slug(domain):
                notes.append(f"from {inline(theirs or 'general')}")
            if memory.get("scope") == "global":
                notes.append("global")
            if memory.get("pinned"):
                notes.append("pinned")
            if memory.get("status") == "archived":
                notes.append("archived")
            lines.append(memory_line(memory, memory["file"], notes))
        lines.append("")
    return "\n".join(lines)
