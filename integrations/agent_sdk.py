"""The Claude Agent SDK on eurekamem: the Claude Code hooks' behaviours as in-process callbacks.

    from claude_agent_sdk import ClaudeAgentOptions, HookMatcher
    from eurekamem.integrations.agent_sdk import MemoryHooks

    memory = MemoryHooks(domain="shop-api")              # default: each session's git root's name
    options = ClaudeAgentOptions(hooks=memory.hooks(HookMatcher))
    ...                                                   # run the agent
    await memory.aclose()                                 # the sessions' last lines, flushed

Each callback has the SDK's signature, `async def cb(input_data: dict, tool_use_id: str | None,
context) -> dict`, and answers the SDK's hook output (`{}` or `{"hookSpecificOutput": {...}}`).

Rules kept here:
- The same behaviours as the hook command (events.py, written once for both): UserPromptSubmit
  injects the memories relevant to the prompt above the score floor; PreCompact and Stop (at most
  every `stop_every` seconds a session) send the transcript's new lines to the project's
  conversation group and flush it; PostToolUse (when asked for) logs the tool's name and outcome.
  The Python SDK has no SessionStart or SessionEnd event, so the opening block (the project's
  summary and its memories, relevant to the prompt first) comes with a session's first prompt, and
  aclose() ends every session it saw as SessionEnd does. `session_start` and `session_end` are
  there for an SDK that has those events (`hooks(..., session_events=True)`).
- No subprocess per event: one AsyncClient (asyncio or trio), opened on first use, never starting a
  daemon. Nothing here blocks the event loop on a lock: a session whose transcript a callback is
  sending already is skipped by a second callback (what the first did not read waits for the next
  event, or aclose()), and the session's file lock is tried, never waited for. Never in the agent's way: a callback that fails (the daemon down or slow, a bad payload)
  answers `{}` within its event's time budget and logs one warning line; the agent goes on.
- The SDK is not imported here: hooks() takes its HookMatcher class (or any class with its fields).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .claude_code.events import BUDGET, INGEST_EVENTS, Handler, HookOptions, handle, user_prompt_submit

__all__ = ["MemoryHooks"]

log = logging.getLogger("eurekamem.integrations.agent_sdk")

HookCallback = Callable[[dict[str, Any], "str | None", Any], Awaitable[dict[str, Any]]]


class MemoryHooks:
    """The callbacks of one agent (one AsyncClient). `client`: an AsyncClient to use (default: one of
    its own, at `socket` or as every client finds the daemon); `data_dir`: the data root whose
    run/ folder keeps the sessions' marks; the other options are HookOptions' (events.py)."""

    def __init__(
        self,
        domain: str | None = None,
        *,
        client: Any = None,
        socket: str | None = None,
        data_dir: str | None = None,
        post_tool_use: bool = False,
        options: HookOptions | None = None,
    ) -> None:
        from ..client import resolve_locations

        root, path = resolve_locations(socket, data_dir, None)
        self.root = Path(root)
        self.options = options or HookOptions()
        if domain is not None:
            self.options.domain = domain
        self.options.post_tool_use = self.options.post_tool_use or post_tool_use
        self._own_client = client is None
        if client is None:
            from ..client import AsyncClient

            client = AsyncClient(path)
        self.client = client
        self.sessions: dict[str, dict[str, Any]] = {}  # session id -> its last payload (for aclose)
        self.ingesting: set[str] = set()  # sessions whose transcript a callback is sending now
        self.failures = 0  # callbacks that answered {} because something failed

    # --- the SDK's callbacks -------------------------------------------------------------------

    async def user_prompt_submit(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        first = self._saw(input_data)
        return await self._run(input_data, user_prompt_submit(input_data, self.options, first=first))

    async def pre_compact(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        self._saw(input_data)
        return await self._run(input_data)

    async def stop(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        self._saw(input_data)
        return await self._run(input_data)

    async def post_tool_use(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        self._saw(input_data)
        return await self._run(input_data)

    async def session_start(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        self._saw(input_data)
        self.sessions[str(input_data.get("session_id"))]["started"] = True
        return await self._run(input_data)

    async def session_end(self, input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        self.sessions.pop(str(input_data.get("session_id")), None)
        return await self._run(input_data)

    def hooks(self, hook_matcher: Callable[..., Any], *, session_events: bool = False) -> dict[str, list[Any]]:
        """ClaudeAgentOptions' `hooks=`: {event: [hook_matcher(matcher=..., hooks=[callback])]}."""
        table: dict[str, HookCallback] = {"UserPromptSubmit": self.user_prompt_submit, "PreCompact": self.pre_compact,
                                          "Stop": self.stop}
        if self.options.post_tool_use:
            table["PostToolUse"] = self.post_tool_use
        if session_events:
            table.update(SessionStart=self.session_start, SessionEnd=self.session_end)
        return {event: [hook_matcher(matcher=None, hooks=[callback])] for event, callback in table.items()}

    async def aclose(self) -> None:
        """End every session seen as SessionEnd would (their last lines sent, the group flushed), then
        close the client if it is ours."""
        for sid, payload in list(self.sessions.items()):
            await self._run({**payload, "hook_event_name": "SessionEnd", "session_id": sid, "reason": "other"})
        self.sessions.clear()
        if self._own_client:
            await self.client.aclose()

    async def __aenter__(self) -> MemoryHooks:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- the driver ------------------------------------------------------------------------------

    def _saw(self, input_data: dict[str, Any]) -> bool:
        """Remember the session (for aclose); True the first time a prompt of it is seen."""
        sid = str(input_data.get("session_id"))
        known = self.sessions.get(sid)
        self.sessions[sid] = {**(known or {}), **{k: v for k, v in input_data.items() if k in ("cwd", "transcript_path")}}
        if input_data.get("hook_event_name") != "UserPromptSubmit":
            return False
        first = not (known or {}).get("prompted") and not (known or {}).get("started")
        self.sessions[sid]["prompted"] = True
        return first

    async def _run(self, input_data: dict[str, Any], handler: Handler | None = None) -> dict[str, Any]:
        event = str(input_data.get("hook_event_name"))
        deadline = time.monotonic() + BUDGET.get(event, 2.0)
        sid = str(input_data.get("session_id"))
        if event in INGEST_EVENTS:
            if sid in self.ingesting:  # another callback of this session is sending: the next event takes the rest
                return {}
            self.ingesting.add(sid)
        try:
            return await self._drive(input_data, handler, event, deadline)
        finally:
            if event in INGEST_EVENTS:
                self.ingesting.discard(sid)

    async def _drive(self, input_data: dict[str, Any], handler: Handler | None, event: str, deadline: float) -> dict[str, Any]:
        from ..client import EurekamemError

        try:
            if handler is None:  # never waiting for a session's lock: that would block the event loop
                handler = handle(input_data, self.options, self.root, deadline=deadline, wait_lock=False)
            call = next(handler)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    handler.close()
                    raise TimeoutError(f"out of time before {call[0]}")
                self.client.timeout = left
                try:
                    result = await self.client.call(*call)
                except EurekamemError as exc:
                    call = handler.throw(exc)
                else:
                    call = handler.send(result)
        except StopIteration as stop:
            return stop.value or {}
        except Exception as exc:  # never in the agent's way: one warning line, an empty answer
            self.failures += 1
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("eurekamem: %s hook: %s; nothing %s", event, reason,
                        "injected" if event == "UserPromptSubmit" else "stored (the next event retries)")
            return {}
