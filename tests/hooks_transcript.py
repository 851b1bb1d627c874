"""Claude Code's session transcript, written as Claude Code writes it, for the hooks' tests.

One JSON object a line, appended as the session goes (~/.claude/projects/<project>/<session>.jsonl):
`user` lines (a prompt as a string; tool results as a list of `tool_result` blocks, with the whole
output again in `toolUseResult`), `assistant` lines (the API message: `thinking`, `text` and
`tool_use` blocks, one line per block as the CLI streams them, sharing `message.id`), `summary`
lines (a title for the session, `leafUuid`), and the harness's own lines: `isMeta` user lines (a
hook's injected context, command caveats), `attachment` lines (injected context, as recent versions
record it), `progress` lines (hooks running), a compaction's summary (`isCompactSummary`), sidechain
lines of a sub-agent, `system` and `file-history-snapshot` entries. Every line carries `uuid`,
`parentUuid`, `sessionId`, `timestamp`, `cwd`, `version`, `gitBranch`, `userType`, `isSidechain`.
Seeded: the same calls write the same bytes.
"""

from __future__ import annotations

import datetime
import json
import random
import uuid
from pathlib import Path
from typing import Any

VERSION = "2.0.14"


class Transcript:
    def __init__(self, path: Path, session_id: str, cwd: str, *, seed: int = 0) -> None:
        self.path = path
        self.session_id = session_id
        self.cwd = cwd
        self.rng = random.Random(seed)
        self.parent: str | None = None
        self.clock = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.UTC)
        self.uuids: list[str] = []  # every line's uuid, in order
        path.parent.mkdir(parents=True, exist_ok=True)

    # --- lines ---------------------------------------------------------------------------------

    def _id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _base(self, kind: str, **extra: Any) -> dict[str, Any]:
        self.clock += datetime.timedelta(seconds=7)
        ident = self._id()
        line = {
            "parentUuid": self.parent, "isSidechain": False, "userType": "external", "cwd": self.cwd,
            "sessionId": self.session_id, "version": VERSION, "gitBranch": "main", "type": kind,
            "uuid": ident, "timestamp": self.clock.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            **extra,
        }
        self.parent = ident
        self.uuids.append(ident)
        return line

    def user(self, text: str) -> dict[str, Any]:
        return self.write(self._base("user", message={"role": "user", "content": text}))

    def meta(self, text: str) -> dict[str, Any]:
        """A line the harness writes as the user's (a hook's context, a command caveat)."""
        return self.write(self._base("user", isMeta=True, message={"role": "user", "content": text}))

    def command(self, name: str, stdout: str) -> None:
        """A slash command and its output, as Claude Code records them."""
        self.write(self._base("user", message={"role": "user", "content":
                   f"<command-name>/{name}</command-name>\n<command-message>{name}</command-message>\n<command-args></command-args>"}))
        self.write(self._base("user", message={"role": "user", "content": f"<local-command-stdout>{stdout}</local-command-stdout>"}))

    def assistant(self, text: str | None = None, tools: list[tuple[str, dict[str, Any]]] | None = None, *,
                  thinking: str | None = None) -> list[str]:
        """One API message, one line per content block; the tool_use ids."""
        message_id = "msg_" + self._id().replace("-", "")[:24]
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking, "signature": "sig" + self._id()[:8]})
        if text:
            blocks.append({"type": "text", "text": text})
        ids = []
        for name, tool_input in tools or []:
            use = "toolu_01" + self._id().replace("-", "")[:22]
            ids.append(use)
            blocks.append({"type": "tool_use", "id": use, "name": name, "input": tool_input})
        for block in blocks:
            self.write(self._base("assistant", requestId="req_" + self._id()[:12], message={
                "id": message_id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
                "content": [block], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 40, "cache_read_input_tokens": 1000},
            }))
        return ids

    def tool_result(self, tool_use_id: str, output: str, *, is_error: bool = False) -> dict[str, Any]:
        block: dict[str, Any] = {"tool_use_id": tool_use_id, "type": "tool_result", "content": output}
        if is_error:
            block["is_error"] = True
        return self.write(self._base("user", message={"role": "user", "content": [block]},
                                     toolUseResult={"stdout": output, "stderr": "", "interrupted": False, "isImage": False}))

    def attachment(self, text: str, event: str = "UserPromptSubmit") -> dict[str, Any]:
        """Context a hook injected, as recent versions record it (a line of its own)."""
        return self.write(self._base("attachment", attachment={"type": "hook_additional_context", "content": [text],
                                                               "hookName": event, "hookEvent": event}))

    def progress(self, event: str = "PostToolUse") -> dict[str, Any]:
        return self.write(self._base("progress", data={"type": "hook_progress", "hookEvent": event,
                                                       "hookName": f"{event}:Bash", "command": "hook.sh"}))

    def summary(self, text: str) -> dict[str, Any]:
        return self.write({"type": "summary", "summary": text, "leafUuid": self.parent})

    def compact_summary(self, text: str) -> dict[str, Any]:
        return self.write(self._base("user", isCompactSummary=True, isVisibleInTranscriptOnly=True,
                                     message={"role": "user", "content": text}))

    def sidechain(self, text: str) -> dict[str, Any]:
        line = self._base("user", message={"role": "user", "content": text})
        line["isSidechain"] = True
        return self.write(line)

    def system(self, text: str) -> dict[str, Any]:
        return self.write(self._base("system", subtype="informational", content=text, level="info"))

    def snapshot(self) -> dict[str, Any]:
        return self.write({"type": "file-history-snapshot", "messageId": self._id(),
                           "snapshot": {"messageId": self._id(), "trackedFileBackups": {}, "timestamp": self.clock.isoformat()},
                           "isSnapshotUpdate": False})

    # --- the file -------------------------------------------------------------------------------

    def write(self, line: dict[str, Any], *, partial: int | None = None) -> dict[str, Any]:
        """Append the line (with its newline); `partial`: only its first `partial` bytes (a write in progress)."""
        data = (json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        with open(self.path, "ab") as f:
            f.write(data if partial is None else data[:partial])
        return line

    def append_bytes(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)

    def payload(self, event: str, **fields: Any) -> dict[str, Any]:
        """A hook's stdin for this session, in the documented shape."""
        return {"session_id": self.session_id, "transcript_path": str(self.path), "cwd": self.cwd,
                "permission_mode": "default", "hook_event_name": event, **fields}
