"""Claude Code's settings.json: our hook entries installed, removed and shown.

Rules kept here:
- Ours are the command hooks whose command runs this package (`-m eurekamem.integrations.claude_code`);
  nothing else in the file is ever changed: every other key, event and hook stays as it was, in
  its order. Each of our entries is a matcher group of its own, never a hook added to someone
  else's group.
- Install is idempotent: an event that already has our hook with the same command and timeout is
  left alone; one with another (an older path, other options) is updated in place; an event we no
  longer want (PostToolUse installed before, not now) loses ours. Uninstall removes our hooks, the
  groups they leave empty, and the event lists and `hooks` object they leave empty, nothing else.
- A file that is not a JSON object is refused with the reason, and left as it is. Writes replace
  the file whole (a temporary file beside it, then a rename), keeping its permissions.
Only the standard library.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MODULE", "SCOPES", "SettingsError", "command_line", "install", "ours", "settings_path", "status", "uninstall"]

MODULE = "eurekamem.integrations.claude_code"
SCOPES = ("user", "project", "local")
# Claude Code's timeout (seconds) for each of our hooks: above the hook's own budget (events.BUDGET),
# with room for a slow start of the interpreter on a busy machine
TIMEOUTS = {"SessionStart": 10, "UserPromptSubmit": 5, "PreCompact": 30, "Stop": 15, "SessionEnd": 30, "PostToolUse": 5}
BASE_EVENTS = ("SessionStart", "UserPromptSubmit", "PreCompact", "Stop", "SessionEnd")
TOOL_EVENTS = ("PostToolUse",)  # events whose matcher is a tool name


class SettingsError(Exception):
    pass


def settings_path(scope: str, project_dir: str | os.PathLike[str] | None = None) -> Path:
    """user: $CLAUDE_CONFIG_DIR/settings.json, else ~/.claude/settings.json; project and local: the
    project's .claude/settings.json and .claude/settings.local.json (the project: `project_dir`, else
    the working directory)."""
    if scope == "user":
        base = os.environ.get("CLAUDE_CONFIG_DIR")
        return (Path(base).expanduser() if base else Path.home() / ".claude") / "settings.json"
    if scope not in SCOPES:
        raise SettingsError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    folder = Path(project_dir if project_dir is not None else os.getcwd()).expanduser().resolve() / ".claude"
    return folder / ("settings.json" if scope == "project" else "settings.local.json")


def command_line(flags: list[str], python: str | None = None) -> str:
    """Our hook's command: this environment's Python by absolute path, so it runs from any folder."""
    exe = os.path.abspath(python or sys.executable)
    return shlex.join([exe, "-m", MODULE, *flags])


def ours(hook: Any) -> bool:
    if not isinstance(hook, dict) or hook.get("type") != "command" or not isinstance(hook.get("command"), str):
        return False
    try:
        argv = shlex.split(hook["command"])
    except ValueError:
        return False
    return any(a == "-m" and b == MODULE for a, b in zip(argv, argv[1:]))


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot be read: {exc}") from None
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{path}: not valid JSON ({exc}); fix it or move it away, nothing was changed") from None
    if not isinstance(doc, dict):
        raise SettingsError(f"{path}: not a JSON object; nothing was changed")
    hooks = doc.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise SettingsError(f"{path}: `hooks` is not an object; nothing was changed")
    for event, groups in (hooks or {}).items():
        if not isinstance(groups, list):
            raise SettingsError(f"{path}: hooks.{event} is not a list; nothing was changed")
    return doc


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _our_hooks(groups: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(g, h) for g in groups if isinstance(g, dict) and isinstance(g.get("hooks"), list) for h in g["hooks"] if ours(h)]


def _drop(groups: list[Any], keep: dict[str, Any] | None = None) -> int:
    """Remove our hooks from `groups` (all but `keep`), and the groups that leaves empty; how many hooks.
    By identity throughout: a user's hook or group equal to ours stays."""
    removed = 0
    emptied: list[dict[str, Any]] = []
    for group, hook in _our_hooks(groups):
        if hook is keep:
            continue
        group["hooks"][:] = [h for h in group["hooks"] if h is not hook]
        removed += 1
        if not group["hooks"]:
            emptied.append(group)
    groups[:] = [g for g in groups if not any(g is e for e in emptied)]
    return removed


@dataclass
class Change:
    path: Path
    events: dict[str, str] = field(default_factory=dict)  # event -> added / updated / unchanged / removed
    written: bool = False


def install(path: Path, command: str, *, post_tool_use: bool = False, dry_run: bool = False) -> Change:
    doc = _read(path)
    change = Change(path)
    if doc.get("hooks") is None:
        doc["hooks"] = {}
    hooks = doc["hooks"]
    wanted = BASE_EVENTS + (TOOL_EVENTS if post_tool_use else ())
    for event in wanted:
        desired: dict[str, Any] = {"type": "command", "command": command, "timeout": TIMEOUTS[event]}
        groups = hooks.setdefault(event, [])
        found = _our_hooks(groups)
        if found and found[0][1] == desired and len(found) == 1:
            change.events[event] = "unchanged"
            continue
        if found:
            group, hook = found[0]
            hook.clear()
            hook.update(desired)
            _drop(groups, keep=hook)
            change.events[event] = "updated"
        else:
            groups.append({"matcher": "*", "hooks": [desired]} if event in TOOL_EVENTS else {"hooks": [desired]})
            change.events[event] = "added"
    for event in list(hooks):
        if event not in wanted and isinstance(hooks[event], list) and _drop(hooks[event]):
            change.events[event] = "removed"
            if not hooks[event]:
                del hooks[event]
    if any(v != "unchanged" for v in change.events.values()) and not dry_run:
        _write(path, doc)
        change.written = True
    return change


def uninstall(path: Path, *, dry_run: bool = False) -> Change:
    change = Change(path)
    if not path.exists():
        return change
    doc = _read(path)
    hooks = doc.get("hooks")
    if not isinstance(hooks, dict):
        return change
    for event in list(hooks):
        if _drop(hooks[event]):
            change.events[event] = "removed"
            if not hooks[event]:
                del hooks[event]
    if not change.events:
        return change
    if not hooks:
        del doc["hooks"]
    if not dry_run:
        _write(path, doc)
        change.written = True
    return change


def status(path: Path) -> dict[str, Any]:
    """{"path", "exists", "ours": {event: [{"command", "timeout", "matcher"}]}, "others": {event: n}}
    (`error` instead when the file cannot be read)."""
    out: dict[str, Any] = {"path": str(path), "exists": path.exists(), "ours": {}, "others": {}}
    try:
        doc = _read(path)
    except SettingsError as exc:
        out["error"] = str(exc)
        return out
    for event, groups in (doc.get("hooks") or {}).items():
        mine = [{"command": h["command"], "timeout": h.get("timeout"), "matcher": g.get("matcher")}
                for g, h in _our_hooks(groups)]
        if mine:
            out["ours"][event] = mine
        others = sum(len(g["hooks"]) for g in groups if isinstance(g, dict) and isinstance(g.get("hooks"), list)) - len(mine)
        if others:
            out["others"][event] = others
    return out
