"""What each hook event does, written once for both drivers: the hook command (one process per event,
a blocking Client) and the Agent SDK's in-process callbacks (an AsyncClient).

Rules kept here:
- A handler is a generator that yields the daemon calls it needs, `(method, params)`, receives each
  result (or has the call's error thrown in), and returns the hook's JSON answer (None: print
  nothing). It holds no socket, so the two drivers share every rule below.
- SessionStart: memory.inject of the project's domain without a query (its strongest memories,
  the user's global ones with them) and the project conversation's summary, within
  `session_budget` tokens. UserPromptSubmit: memory.inject for the prompt with the score floor
  (`min_score`): no fallback to the strongest, so nothing clears the floor means nothing injected.
- PreCompact, SessionEnd and Stop (at most every `stop_every` seconds a session): the transcript
  lines past the session's mark go to the project's conversation group (transcript.py says which
  and how), the mark moves only after the daemon stored them, then conversation.flush queues the
  extraction, never waited for. PostToolUse (when asked for): the tool's name and outcome as an
  episodic event; with it, SessionEnd also closes the episodic session.
- The domain is the name of the git root above the project's folder (the folder holding `.git`;
  the project's folder: `project_dir`, which the hook command takes from Claude Code's
  $CLAUDE_PROJECT_DIR, else the payload's `cwd`, which moves with a `cd`), else that folder's own
  name, unless the options name one; the group is the domain.
Only the standard library (and transcript.py, state.py, imported by the events that read the transcript).
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EVENTS", "HookOptions", "Call", "Handler", "handle", "project_domain"]

Call = tuple[str, dict[str, Any]]
Handler = Generator[Call, Any, "dict[str, Any] | None"]

INGEST_EVENTS = ("PreCompact", "SessionEnd", "Stop")
# each event's time budget in seconds: what the hook process spends at most before it gives up
# (from the process's start: on a busy machine the interpreter and its imports alone can take a second)
BUDGET = {"SessionStart": 5.0, "UserPromptSubmit": 3.0, "PreCompact": 15.0, "SessionEnd": 15.0, "Stop": 8.0,
          "PostToolUse": 2.0, "PostToolUseFailure": 2.0}
EVENTS = tuple(BUDGET)
APPEND_BATCH = 500  # messages per conversation.append
APPEND_CHARS = 2_000_000  # characters of text per conversation.append
MAX_QUERY = 4096  # memory.inject's query


@dataclass
class HookOptions:
    domain: str | None = None  # None: the git root's name (project_domain)
    project_dir: str | None = None  # where that git root is looked for (default: the payload's cwd)
    session_budget: int = 1500  # tokens SessionStart injects at most
    session_k: int = 8
    prompt_budget: int = 800  # tokens UserPromptSubmit injects at most
    prompt_k: int = 5
    min_score: float = 0.5  # memory.search's calibrated floor for UserPromptSubmit
    stop_every: float = 600.0  # seconds between two Stop ingests of a session (0: Stop never ingests)
    post_tool_use: bool = False
    user: str | None = None  # the sender of the user's messages (default: $USER, else "user")


def project_domain(cwd: str | None) -> str:
    """The git root's folder name above `cwd` (a `.git` folder or file), else `cwd`'s own name."""
    here = Path(cwd or os.getcwd()).expanduser()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder.name or "general"
        if folder == folder.parent:
            break
    return here.name or "general"


def domain_of(payload: dict[str, Any], options: HookOptions) -> str:
    return options.domain or project_domain(options.project_dir or _str(payload.get("cwd")))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _context(event: str, text: str) -> dict[str, Any] | None:
    if not text:
        return None
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}


def handle(payload: dict[str, Any], options: HookOptions, root: Path, *, now: float | None = None,
           deadline: float | None = None, wait_lock: bool = True) -> Handler:
    """The handler of the payload's `hook_event_name` (ValueError for a payload without one).
    `wait_lock`: wait (within the deadline) for another hook holding the session's lock, else
    state.Locked at once (an event loop must not block on it)."""
    event = payload.get("hook_event_name")
    if not isinstance(event, str):
        raise ValueError("the payload has no hook_event_name")
    wall = time.time() if now is None else now
    ends = time.monotonic() + BUDGET.get(event, 2.0) if deadline is None else deadline
    if event == "SessionStart":
        return session_start(payload, options)
    if event == "UserPromptSubmit":
        return user_prompt_submit(payload, options)
    if event in INGEST_EVENTS:
        return ingest(payload, options, root, wall, ends, wait_lock)
    if event in ("PostToolUse", "PostToolUseFailure"):
        return tool_event(payload, options)
    return _nothing()


def _nothing() -> Handler:
    return None
    yield  # a generator that makes no call


def session_start(payload: dict[str, Any], options: HookOptions) -> Handler:
    domain = domain_of(payload, options)
    block = yield ("memory.inject", {"domain": domain, "k": options.session_k, "token_budget": options.session_budget,
                                     "include_summary": True})
    return _context("SessionStart", str(block.get("text", "")))


def user_prompt_submit(payload: dict[str, Any], options: HookOptions, *, first: bool = False) -> Handler:
    """The memories relevant to the prompt (`first`, for an agent without a SessionStart event: the
    session's opening block too, relevant first, the strongest when nothing is)."""
    prompt = (_str(payload.get("prompt")) or "").strip()[:MAX_QUERY]
    domain = domain_of(payload, options)
    if first:
        params: dict[str, Any] = {"domain": domain, "k": options.session_k, "token_budget": options.session_budget,
                                  "include_summary": True, "query": prompt or None}
    elif not prompt:
        return None
    else:
        params = {"domain": domain, "k": options.prompt_k, "query": prompt, "token_budget": options.prompt_budget,
                  "min_score": options.min_score}
    block = yield ("memory.inject", params)
    return _context("UserPromptSubmit", str(block.get("text", "")))


def _session_id(payload: dict[str, Any]) -> str:
    sid = _str(payload.get("session_id"))
    if sid is None:
        raise ValueError("the payload has no session_id")
    return sid


def ingest(payload: dict[str, Any], options: HookOptions, root: Path, now: float, deadline: float,
           wait_lock: bool = True) -> Handler:
    """The transcript's new lines into the project's group, then conversation.flush (see the module's rules)."""
    from .state import SessionState  # here, not at the top: a prompt's hook process never needs them
    from .transcript import Mark, Tools, messages_of, read_since

    event = str(payload.get("hook_event_name"))
    sid = _session_id(payload)
    path = _str(payload.get("transcript_path"))
    group = domain_of(payload, options)
    with SessionState.open(root, sid, deadline if wait_lock else 0.0) as state:
        data = state.data
        if event == "Stop":
            since = data.get("last_ingest") or data.get("first_seen")
            if options.stop_every <= 0 or not isinstance(since, (int, float)):
                if "first_seen" not in data:
                    data["first_seen"] = now
                    state.save()
                return None
            if now - since < options.stop_every:
                return None
        appended = 0
        if path is not None and os.path.exists(os.path.expanduser(path)):  # none yet: nothing said yet
            read = read_since(os.path.expanduser(path), Mark.from_dict(data.get("mark")))
            tools = Tools(dict(data.get("tools") or {}))
            messages = messages_of(read.entries, tools, session=sid, user=options.user or os.environ.get("USER") or "user")
            for batch in _batches(messages):
                result = yield ("conversation.append", {"group": group, "messages": batch})
                appended += int(result.get("appended", 0))
            data.update(mark=read.mark.to_dict(), tools=tools.pending, transcript=path)
            data["sent"] = int(data.get("sent", 0)) + len(messages)
        data["last_ingest"] = now
        data["group"] = group
        state.save()
        if int(data.get("sent", 0)):
            yield ("conversation.flush", {"group": group})
        if event == "SessionEnd":
            if options.post_tool_use:
                yield ("session.close", {"session_id": sid, "domain": group})
            state.prune(now)
    return None


def _batches(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    batch: list[dict[str, Any]] = []
    chars = 0
    for message in messages:
        size = len(message["text"])
        if batch and (len(batch) >= APPEND_BATCH or chars + size > APPEND_CHARS):
            out.append(batch)
            batch, chars = [], 0
        batch.append(message)
        chars += size
    if batch:
        out.append(batch)
    return out


def tool_outcome(payload: dict[str, Any]) -> tuple[bool, str]:
    """(succeeded, a short reason when it did not) from a PostToolUse payload's `tool_response`."""
    if payload.get("hook_event_name") == "PostToolUseFailure":
        return False, str(payload.get("error") or "failed")[:200]
    response = payload.get("tool_response")
    if isinstance(response, dict):
        if response.get("success") is False or response.get("is_error") or response.get("interrupted"):
            return False, str(response.get("error") or response.get("stderr") or "failed").strip()[:200]
        if isinstance(response.get("error"), str) and response["error"]:
            return False, response["error"][:200]
    return True, ""


def tool_event(payload: dict[str, Any], options: HookOptions) -> Handler:
    if not options.post_tool_use:
        return None
    sid = _session_id(payload)
    name = _str(payload.get("tool_name")) or "tool"
    ok, reason = tool_outcome(payload)
    event: dict[str, Any] = {
        "session_id": sid, "agent_role": "claude-code",
        "content": f"{name}: ok" if ok else f"{name} failed: {reason}",
        "metadata": {"tool": name, "success": ok, "domain": domain_of(payload, options)},
    }
    use = _str(payload.get("tool_use_id"))
    if use is not None and len(use) <= 256:
        event["entry_id"] = use
    yield ("episodic.log", event)
    return None
