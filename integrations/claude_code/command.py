"""The hook command Claude Code runs for each event: the payload on stdin, the answer on stdout.

    python -m eurekamem.integrations.claude_code [--domain D] [--post-tool-use] ...   (or `eurekamem hook`)

Rules kept here:
- Never in the agent's way (exit status 2 would be Claude Code's "blocking error", which for
  UserPromptSubmit erases the prompt): whatever happens (the daemon down, slow or refusing, a payload that is
  not the documented shape, a transcript that cannot be read) the process exits 0, prints nothing
  on stdout but a valid answer, and writes ONE line on stderr saying what went wrong and that
  nothing was injected (or stored). Each event has a time budget (events.BUDGET), measured from
  the process's start; every call gets what is left of it.
- It never starts a daemon (a hook must not spawn one per event) and never waits for extraction.
- Imports: the standard library, events/state/transcript, and the thin client when a call is made
  (LineClient: the standard library only, no msgspec), so the process starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from .events import BUDGET, Handler, HookOptions, handle

__all__ = ["add_hook_flags", "drive", "main", "options_from", "run"]

PROCESS_START = time.monotonic()


class OutOfTime(Exception):
    pass


def add_hook_flags(p: argparse.ArgumentParser) -> None:
    """The hook command's flags (also `eurekamem hook`'s): where the daemon is, and the options."""
    d = HookOptions()
    p.add_argument("--domain", help="the domain and conversation group (default: the git root's folder name)")
    p.add_argument("--socket", help="the daemon's socket (default: as every client finds it)")
    p.add_argument("--data-dir", help="the data root (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    p.add_argument("--post-tool-use", action="store_true", help="log each tool's name and outcome as an episodic event")
    p.add_argument("--session-budget", type=int, default=d.session_budget, metavar="TOKENS",
                   help=f"tokens SessionStart injects at most (default: {d.session_budget})")
    p.add_argument("--prompt-budget", type=int, default=d.prompt_budget, metavar="TOKENS",
                   help=f"tokens UserPromptSubmit injects at most (default: {d.prompt_budget})")
    p.add_argument("--min-score", type=float, default=d.min_score,
                   help=f"the score floor of what UserPromptSubmit injects (default: {d.min_score})")
    p.add_argument("--stop-every", type=float, default=d.stop_every, metavar="SECONDS",
                   help=f"seconds between two Stop ingests of a session, 0: never (default: {d.stop_every:g})")


def options_from(args: argparse.Namespace) -> HookOptions:
    """The options of the flags; the project's folder from $CLAUDE_PROJECT_DIR (Claude Code sets it
    for its hooks: the folder the session started in, where the payload's cwd follows a `cd`)."""
    return HookOptions(domain=args.domain, session_budget=args.session_budget, prompt_budget=args.prompt_budget,
                       min_score=args.min_score, stop_every=args.stop_every, post_tool_use=args.post_tool_use,
                       project_dir=os.environ.get("CLAUDE_PROJECT_DIR") or None)


def drive(handler: Handler, client: Any, deadline: float) -> dict[str, Any] | None:
    """Run a handler's calls on a blocking client (a LineClient, or a Client), each within what is
    left of `deadline`."""
    from ...client import EurekamemError

    try:
        call = next(handler)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                handler.close()
                raise OutOfTime(f"out of time before {call[0]}")
            client.timeout = left
            try:
                result = client.call(*call)
            except EurekamemError as exc:
                call = handler.throw(exc)
            else:
                call = handler.send(result)
    except StopIteration as stop:
        value: dict[str, Any] | None = stop.value
        return value


def _what_is_lost(event: str) -> str:
    return "nothing injected" if event in ("SessionStart", "UserPromptSubmit") else "nothing stored (the next event retries)"


def run(args: argparse.Namespace, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> int:
    """One hook event: always 0 (see the module's rules)."""
    event = "hook"
    try:
        payload = json.loads(stdin.read())
        if not isinstance(payload, dict) or not isinstance(payload.get("hook_event_name"), str):
            raise ValueError("the payload on stdin is not a hook event (a JSON object with hook_event_name)")
        event = payload["hook_event_name"]
        from ...client import LineClient, resolve_locations  # the light client: no msgspec, no thread

        root, socket = resolve_locations(args.socket, args.data_dir, None)
        deadline = PROCESS_START + BUDGET.get(event, 2.0)
        handler = handle(payload, options_from(args), Path(root), deadline=deadline)
        with LineClient(socket, timeout=max(0.05, deadline - time.monotonic())) as client:
            output = drive(handler, client, deadline)
    except Exception as exc:  # never in the agent's way: one line, exit 0 (the rule above)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"eurekamem: {event} hook: {reason}; {_what_is_lost(event)}", file=stderr)
        return 0
    if output is not None:
        stdout.write(json.dumps(output) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eurekamem.integrations.claude_code",
        description="eurekamem's Claude Code hook: reads the event's JSON on stdin, answers on stdout, always exits 0.",
    )
    add_hook_flags(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's exit 2 would be Claude Code's "blocking error": never that
        return 0 if exc.code in (0, None) else _bad_flags()
    return run(args, sys.stdin, sys.stdout, sys.stderr)


def _bad_flags() -> int:
    print("eurekamem: hook: the command's flags were refused (above); nothing injected", file=sys.stderr)
    return 0
