"""Claude Code on eurekamem, by its hooks: every session gets its project's memories without
calling a tool, and what it establishes is learned.

    eurekamem hooks install claude-code [--scope user|project|local] [--domain D] [--post-tool-use]

writes one command into Claude Code's settings.json for SessionStart, UserPromptSubmit, PreCompact,
Stop and SessionEnd (and PostToolUse when asked): `python -m eurekamem.integrations.claude_code`
with this environment's Python, which reads the event's payload on stdin and answers on stdout.

- `events`: what each event does (written once, for this command and for the Agent SDK's callbacks,
  `eurekamem.integrations.agent_sdk`),
- `transcript`: the session's transcript (JSONL) read from a mark, as conversation messages,
- `state`: the per-session mark, under <data root>/run/hooks/claude-code/,
- `command`: the hook process, `settings`: install / uninstall / status of settings.json.

Importing this package imports nothing (the hook process pays only for what it uses).
"""
