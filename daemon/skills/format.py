"""EurekaClaw's SKILL.md: its frontmatter read leniently, and written the way EurekaClaw's registry writes it.

Rules kept here:
- Writing is EurekaClaw's `SkillRegistry.upsert`: `---`, the SkillMeta fields as PyYAML's block-style
  dump (keys sorted, a list one `- item` a line, null fields left out, strings that would read as
  something else quoted: `version: '1.0'`, the timestamp, naive UTC as EurekaClaw's utcnow() gives
  it), `---`, a blank line, then the body with no newline after it. Frontmatter entries the
  daemon does not read (`domain:`, `license:`, `metadata:` ...) are written back verbatim in their sorted place, and `status: draft` only for
  drafts (EurekaClaw's SkillMeta ignores keys it does not know).
- Reading never fails: whatever a program wrote gives a skill. The frontmatter is read as the YAML
  EurekaClaw's files use (plain, quoted and folded scalars, block and flow lists, comments, null);
  a field that does not parse takes its default, and the folder's name is the skill's name, as
  EurekaClaw's loader has it. parse(render(skill)) gives the skill back, field for field.
- A name is a folder under skills/: `name_problem` refuses any that could name another folder or
  hide there (`/`, `\\`, `.`, `..`, a leading dot, control characters, surrounding white space, more
  than 255 bytes) or break the `<skill name="...">` tag (`<`, `>`, `"`, `&`), and any that holds a
  secret (daemon/redact.py's detectors): it would be a path.
- `next_success_rate` is EurekaClaw's `update_stats` arithmetic, bit for bit: the first use gives
  exactly 1.0 or 0.0, every later one `0.7 * previous + 0.3 * outcome`.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import unicodedata
from typing import Any

from ...protocol import SKILL_SOURCES, Skill, normalize_timestamp
from ..redact import SECRET_KINDS, detect

MAX_NAME_BYTES = 255  # a folder name (NAME_MAX)

# control, format and surrogate characters, line and paragraph separators
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

_TAG_BREAKERS = frozenset('<>"&')

_KNOWN = frozenset(
    {
        "name",
        "version",
        "tags",
        "agent_roles",
        "pipeline_stages",
        "description",
        "source",
        "created_at",
        "usage_count",
        "success_rate",
        "status",
    }
)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a skill's name (its folder under skills/), or None when it can."""
    if not name:
        return "is empty"
    if name in (".", "..") or "/" in name or "\\" in name:
        return "would name a folder outside its own"
    if any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in name):
        return "has a control character"
    if name != name.strip():
        return "starts or ends with white space"
    if name.startswith("."):
        return "starts with a dot (a hidden folder)"
    if _TAG_BREAKERS & set(name):
        return 'has one of < > " & (it would break the <skill name="..."> tag)'
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"is longer than a folder name may be ({MAX_NAME_BYTES} bytes in UTF-8)"
    secrets = detect([name], SECRET_KINDS)  # the name is the folder: a secret would be a path
    return f"holds a secret ({', '.join(secrets)}): a skill's name is its folder" if secrets else None


def next_success_rate(previous: float | None, success: bool) -> float:
    """EurekaClaw's update: exactly 1.0 or 0.0 on first use, then an EMA with alpha 0.3."""
    outcome = 1.0 if success else 0.0
    if previous is None:
        return outcome
    return 0.7 * previous + 0.3 * outcome


def clean_body(text: str) -> str:
    """A body as it reads back from its file: line ends made \\n, surrounding white space stripped."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


# --- writing ------------------------------------------------------------------------------------------

# what YAML 1.1 (PyYAML's resolver) would read as something other than a string
_RESOLVES = re.compile(
    r"""^(?:
        y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
        |null|Null|NULL|~|=|<<
        |[-+]?0[xob][0-9a-fA-F_]+
        |[-+]?[0-9][0-9_]*(?:[.:][0-9_:]*)?(?:[eE][-+]?[0-9]+)?
        |[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*
    )$""",
    re.VERBOSE,
)

_INDICATORS = frozenset("-?:,[]{}#&*!|>'\"%@`.+ ")


def _plain_ok(text: str) -> bool:
    return (
        bool(text)
        and text.isprintable()
        and text[0] not in _INDICATORS
        and text[-1] != " "
        and ": " not in text
        and " #" not in text
        and not text.endswith(":")
        and not _RESOLVES.match(text)
    )


def _double_quoted(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == " " or ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def yaml_str(text: str) -> str:
    """A string as a one-line YAML scalar that reads back as exactly this string."""
    if _plain_ok(text):
        return text
    if all(ch == " " or ch.isprintable() for ch in text):
        return "'" + text.replace("'", "''") + "'"
    return _double_quoted(text)


def yaml_float(value: float) -> str:
    """PyYAML's representation of a finite float."""
    text = repr(float(value)).lower()
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text


def eurekaclaw_time(timestamp: str) -> str:
    """A skill's created_at as EurekaClaw writes its own (`datetime.utcnow()`, dumped by pydantic):
    a UTC time without its offset; another offset (a person's file) as given. Read back, a naive
    time means UTC, so parse(render(skill)) keeps it."""
    try:
        parsed = _dt.datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    if parsed.utcoffset() != _dt.timedelta(0):
        return timestamp
    return parsed.replace(tzinfo=None).isoformat()


def _yaml_list(items: list[str]) -> list[str]:
    return [f"- {yaml_str(item)}" for item in items] if items else []


def render_skill(skill: Skill, extra: str = "") -> str:
    """The SKILL.md text of a skill (see the module's rule); `extra` holds unread frontmatter entries."""
    entries: dict[str, list[str]] = {}

    def scalar(key: str, value: str) -> None:
        entries[key] = [f"{key}: {value}"]

    def listing(key: str, items: list[str]) -> None:
        entries[key] = [f"{key}:", *_yaml_list(items)] if items else [f"{key}: []"]

    listing("agent_roles", skill.agent_roles)
    scalar("created_at", yaml_str(eurekaclaw_time(skill.created_at)))
    scalar("description", yaml_str(skill.description))
    scalar("name", yaml_str(skill.name))
    listing("pipeline_stages", skill.pipeline_stages)
    scalar("source", yaml_str(skill.source))
    if skill.status == "draft":
        scalar("status", "draft")
    if skill.success_rate is not None:
        scalar("success_rate", yaml_float(skill.success_rate))
    listing("tags", skill.tags)
    scalar("usage_count", str(int(skill.usage_count)))
    scalar("version", yaml_str(skill.version))
    for key, lines in _entries(extra.split("\n")):
        if key not in entries:
            entries[key] = _trimmed(lines)
    lines = ["---"]
    for key in sorted(entries):
        lines.extend(entries[key])
    lines += ["---", "", skill.body.strip()]
    return "\n".join(lines)


# --- reading ------------------------------------------------------------------------------------------

_BOUNDARY = re.compile(r"^-{3,}\s*$")

_KEY_LINE = re.compile(r"""^(?P<key>[^\s#\-'"][^:]*?|"[^"]*"|'[^']*')[ \t]*:(?:[ \t]+(?P<rest>.*)|[ \t]*)$""")

_NULLS = frozenset({"", "~", "null", "Null", "NULL"})


class _Unparsed:
    """A value of a shape the reader does not take for a known field (a nested mapping, say)."""


UNPARSED = _Unparsed()


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """(the frontmatter's text or None, the body), as python-frontmatter splits: the text is stripped,
    must start with a line of three or more dashes, and the next such line closes it."""
    text = clean_body(text.lstrip("\ufeff"))
    lines = text.split("\n")
    if not _BOUNDARY.match(lines[0]):
        return None, text
    for index in range(1, len(lines)):
        if _BOUNDARY.match(lines[index]):
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1 :]).strip()
    return None, text


def _entries(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Top-level `key: ...` entries with the lines that belong to each (continuations, list items,
    comments and blank lines after it). Lines before the first key are dropped."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        match = _KEY_LINE.match(line) if line[:1] not in ("", " ", "\t", "#") else None
        if match is not None and not line.startswith("- ") and line != "-":
            key = match.group("key").strip()
            if key[:1] in "'\"" and len(key) >= 2:
                key = key[1:-1]
            out.append((key, [line]))
        elif out:
            out[-1][1].append(line)
    return out


def _trimmed(lines: list[str]) -> list[str]:
    """An entry's lines without the blank lines and comments that trail it."""
    end = len(lines)
    while end > 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return lines[:end]


def _fold(parts: list[str]) -> str:
    """YAML line folding: lines joined by one space, each empty line a newline."""
    out = parts[0] if parts else ""
    breaks = 0
    for part in parts[1:]:
        if not part:
            breaks += 1
            continue
        out += "\n" * breaks if breaks else " "
        breaks = 0
        out += part
    return out


def _strip_comment(text: str) -> str:
    """A plain scalar's text without a trailing ` # comment`."""
    at = text.find(" #")
    at2 = text.find("\t#")
    cut = min(a for a in (at, at2, len(text)) if a >= 0)
    return text[:cut].rstrip() if not text.startswith("#") else ""


def _fold_lines(raw: str) -> str:
    """A quoted scalar's content as YAML folds it: white space around each line break dropped,
    lines joined by one space, each empty line a newline."""
    lines = raw.split("\n")
    if len(lines) == 1:
        return raw
    parts = [lines[0].rstrip(" \t")] + [ln.strip(" \t") for ln in lines[1:-1]] + [lines[-1].lstrip(" \t")]
    return _fold(parts)


def _single_quoted(text: str) -> tuple[str, str] | None:
    """(value, what follows the closing quote) of a single-quoted scalar starting at text[0]."""
    i = 1
    raw: list[str] = []
    while i < len(text):
        ch = text[i]
        if ch == "'":
            if text[i + 1 : i + 2] != "'":
                return _fold_lines("".join(raw)), text[i + 1 :]
            i += 1  # '' is one quote
        raw.append(ch)
        i += 1
    return None


_ESCAPES = {
    "0": "\0",
    "a": "\a",
    "b": "\b",
    "t": "\t",
    "\t": "\t",
    "n": "\n",
    "v": "\v",
    "f": "\f",
    "r": "\r",
    "e": "\x1b",
    " ": " ",
    '"': '"',
    "/": "/",
    "\\": "\\",
    "N": "\x85",
    "_": "\xa0",
    "L": "\u2028",
    "P": "\u2029",
}

_HEX_LENGTH = {"x": 2, "u": 4, "U": 8}

_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] in _HEX_LENGTH and len(code) > 1:
        try:
            return chr(int(code[1:], 16))
        except (ValueError, OverflowError):
            return match.group(0)
    return _ESCAPES.get(code, code)


def _double_quoted_value(text: str) -> tuple[str, str] | None:
    """(value, what follows the closing quote) of a double-quoted scalar starting at text[0]."""
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            raw = text[1:i]
            # an escaped line break joins two lines without a space (the next one's indent dropped)
            raw = re.sub(r"(?<!\\)((?:\\\\)*)\\\n[ \t]*", r"\1", raw)
            return _ESCAPE.sub(_unescape, _fold_lines(raw)), text[i + 1 :]
        i += 1
    return None


def _scalar(text: str) -> Any:
    """One scalar written on one line (a list item, a flow item): str, or None for null."""
    text = text.strip()
    if text[:1] == "'":
        got = _single_quoted(text)
        return got[0] if got else text
    if text[:1] == '"':
        got2 = _double_quoted_value(text)
        return got2[0] if got2 else text
    plain = _strip_comment(text)
    return None if plain in _NULLS else plain


def _flow_list(text: str) -> Any:
    """A flow sequence `[a, 'b', "c"]` (text starts at `[`): a list of str, or UNPARSED."""
    items: list[Any] = []
    plain: list[str] = []
    quoted: str | None = None
    i = 1
    while i < len(text):
        ch = text[i]
        if ch in "'\"" and not "".join(plain).strip():
            got = (_single_quoted if ch == "'" else _double_quoted_value)(text[i:])
            if got is None:
                return UNPARSED
            quoted = got[0]
            i = len(text) - len(got[1])
            continue
        if ch in "[{":
            return UNPARSED
        if ch in ",]":
            if quoted is not None:
                items.append(quoted)
            else:
                item = " ".join("".join(plain).split())
                items.append(_scalar(item) if item else None)
            plain, quoted = [], None
            if ch == "]":
                return [item for item in items if item is not None]
            i += 1
            continue
        if quoted is None:
            plain.append(ch)
        i += 1
    return UNPARSED


def _block_scalar(indicator: str, lines: list[str]) -> str:
    """A literal (`|`) or folded (`>`) block scalar with its chomping indicator (`-`, `+`)."""
    content = list(lines)
    while content and not content[-1].strip():
        content.pop()
    indents = [len(ln) - len(ln.lstrip(" ")) for ln in content if ln.strip()]
    indent = min(indents) if indents else 0
    rows = [ln[indent:] for ln in content]
    text = "\n".join(rows) if indicator.startswith("|") else _fold([r.strip() if r.strip() else "" for r in rows])
    if "-" in indicator:
        return text
    if "+" in indicator:
        return text + "\n" * (len(lines) - len(content) + 1)
    return text + "\n" if text else text


def _value(first: str | None, more: list[str]) -> Any:
    """An entry's value: str, None (null), a list of str, or UNPARSED."""
    rest = (first or "").strip()
    if not rest or rest.startswith("#"):
        body = [ln for ln in more if ln.strip() and not ln.lstrip().startswith("#")]
        if not body:
            return None
        if body[0].lstrip().startswith("- ") or body[0].strip() == "-":
            items = []
            for ln in body:
                stripped = ln.lstrip()
                if stripped.startswith("- ") or stripped == "-":
                    items.append(stripped[1:].strip())
                elif items and not stripped.startswith("-"):
                    items[-1] = f"{items[-1]} {stripped}"  # a plain item continued on the next line
            values = [_scalar(item) if item else None for item in items]
            return [value for value in values if value is not None]
        if _KEY_LINE.match(body[0].strip()):
            return UNPARSED  # a nested mapping
        return _fold([ln.strip() for ln in more if not ln.lstrip().startswith("#")]).strip() or None
    if rest[0] in "|>":
        return _block_scalar(rest.split("#", 1)[0].strip(), more)
    if rest[0] in "'\"":
        joined = "\n".join([rest, *more])
        got = (_single_quoted if rest[0] == "'" else _double_quoted_value)(joined)
        return got[0] if got is not None else UNPARSED
    if rest[0] == "[":
        return _flow_list("\n".join([rest, *more]))
    if rest[0] in "{&*!":
        return UNPARSED
    parts = [_strip_comment(rest)]
    for ln in more:
        stripped = ln.strip()
        if stripped.startswith("#"):
            break
        parts.append(_strip_comment(stripped))
    text = _fold(parts).strip()
    return None if text in _NULLS else text


def parse_frontmatter(header: str) -> tuple[dict[str, Any], str]:
    """(the known fields' values, the other entries' raw text sorted by key)."""
    fields: dict[str, Any] = {}
    extra: list[tuple[str, list[str]]] = []
    for key, lines in _entries(header.split("\n")):
        if key in _KNOWN:
            first = _KEY_LINE.match(lines[0])
            fields[key] = _value(first.group("rest") if first else None, lines[1:])
        else:
            extra.append((key, _trimmed(lines)))
    extra.sort(key=lambda item: item[0])
    seen: dict[str, list[str]] = {}
    for key, lines in extra:  # YAML: a repeated key's last value wins
        seen[key] = lines
    return fields, "\n".join(line for key in sorted(seen) for line in seen[key])


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) else default


def _names(value: Any) -> list[str]:
    if isinstance(value, str):  # `tags: theory, proof` (a plain string) read as a list
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, list):
        return []
    return list(dict.fromkeys(item for item in value if isinstance(item, str) and item))


def _count(value: Any) -> int:
    try:
        number = float(value) if isinstance(value, str) else math.nan
    except ValueError:
        return 0
    return int(number) if not math.isnan(number) and 0 <= number < 2**53 and number == int(number) else 0


def _rate(value: Any) -> float | None:
    try:
        rate = float(value) if isinstance(value, str) else math.nan
    except ValueError:
        return None
    if not math.isfinite(rate):
        return None
    return min(1.0, max(0.0, rate))


def parse_skill(text: str, name: str, *, mtime: float, draft: bool = False) -> tuple[Skill, str, list[str]]:
    """A SKILL.md's text as (skill, the frontmatter entries not read, problems found), never failing.

    `name` is the folder's (it wins over the frontmatter's, as in EurekaClaw); `mtime` dates a skill
    without a readable created_at; `draft` is set for files in the drafts folder."""
    header, body = split_frontmatter(text)
    fields, extra = parse_frontmatter(header) if header is not None else ({}, "")
    problems = [f"{key}: not a value of the expected shape" for key, value in fields.items() if value is UNPARSED]
    fields = {key: value for key, value in fields.items() if value is not UNPARSED}
    created = fields.get("created_at")
    try:
        created_at = normalize_timestamp(created)
    except (TypeError, ValueError):
        if created is not None:
            problems.append(f"created_at: {created!r} is not a timestamp")
        created_at = _dt.datetime.fromtimestamp(mtime, _dt.UTC).isoformat()
    source = _text(fields.get("source"), "seed").strip()
    if source not in SKILL_SOURCES:
        problems.append(f"source: {source!r} is not one of {', '.join(SKILL_SOURCES)}; read as manual")
        source = "manual"
    status = "draft" if draft or _text(fields.get("status"), "").strip() == "draft" else "active"
    skill = Skill(
        name=name,
        version=_text(fields.get("version"), "") or "1.0",
        tags=_names(fields.get("tags")),
        agent_roles=_names(fields.get("agent_roles")),
        pipeline_stages=_names(fields.get("pipeline_stages")),
        description=_text(fields.get("description"), ""),
        source=source,
        created_at=created_at,
        usage_count=_count(fields.get("usage_count")),
        success_rate=_rate(fields.get("success_rate")),
        status=status,
        body=body,
    )
    return skill, extra, problems
