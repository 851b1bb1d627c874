"""The checks of tier 4's params that the handlers make before they change anything.

Rule kept here: each check looks at the params alone (never at the state) and raises
invalid_params naming the field, so a refused request changes nothing; the other tiers that take a
domain (tier 1's events, the jobs that write memories) check it with the same function.
"""

from __future__ import annotations

import unicodedata

from ...protocol import Memory, ProtocolError, normalize_timestamp
from ...protocol import methods as m
from ..redact import SECRET_KINDS, detect
from .strength import epoch

MIN_CONFIDENCE = 0.5  # EurekaClaw keeps insights at confidence >= 0.5


def validate_domain(domain: str) -> None:
    """A domain names a folder (memories/<slug>/): none outside its own, none holding a secret."""
    parts = domain.replace("\\", "/").split("/")
    if "\x00" in domain or any(part in (".", "..") for part in parts):
        raise ProtocolError("invalid_params", f"invalid params: domain {domain!r} would name a folder outside its own", field="domain")
    secrets = detect([domain], SECRET_KINDS) if domain else []
    if secrets:
        raise ProtocolError(
            "invalid_params", f"invalid params: the domain holds a secret ({', '.join(secrets)}): a domain is a folder name",
            field="domain",
        )


def check_text(field: str, value: str) -> None:
    if not value.strip():
        raise ProtocolError("invalid_params", f"invalid params: {field} is empty", field=field)


def time_param(field: str, value: str | None) -> str | None:
    """A timestamp param as RFC 3339 (None stays None); invalid_params naming the field otherwise."""
    if value is None:
        return None
    try:
        return normalize_timestamp(value)
    except (TypeError, ValueError):
        raise ProtocolError("invalid_params", f"invalid params: {field} {value!r} is not an RFC 3339 timestamp", field=field) from None


def check_order(valid_from: str, valid_until: str | None) -> None:
    if valid_until is not None and epoch(valid_until) <= epoch(valid_from):
        raise ProtocolError(
            "invalid_params", f"invalid params: valid_until {valid_until} is not after valid_from {valid_from}", field="valid_until"
        )


def validity(valid_from: str | None, valid_until: str | None, now: str) -> tuple[str, str | None]:
    """A new memory's validity: from `valid_from` (default now), until `valid_until` (default open)."""
    start = time_param("valid_from", valid_from) or now
    end = time_param("valid_until", valid_until)
    check_order(start, end)
    return start, end


def check_title(title: str) -> None:
    """A title is one line: it is the `# title` line of the memory's file (and a frontmatter value),
    so a control character (Unicode category Cc: newlines, tabs, NUL, DEL, C1) or a line or
    paragraph separator (U+2028, U+2029) is refused rather than written into the file."""
    check_text("title", title)
    bad = next((ch for ch in title if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise ProtocolError(
            "invalid_params", f"invalid params: title holds the control character U+{ord(bad):04X} (a title is one line)", field="title"
        )


def updated_text(old: Memory, p: m.MemoryUpdate) -> tuple[str, str, str | None]:
    """(title, content, the client's abstract) of a memory.update: what its vector is computed from."""
    title = p.title.strip() if p.title is not None else old.title
    content = p.content.strip() if p.content is not None else old.content
    return title, content, p.abstract  # without one, a changed text gets a derived abstract
