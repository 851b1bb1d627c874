"""The Claude Code hooks without a daemon: the transcript read from a mark (partial lines, truncated,
rotated and rewritten files), what of it becomes a message, the project's domain, and Claude Code's
settings.json installed into, updated, shown and restored (a temporary HOME and project)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hooks_transcript import Transcript

from eurekamem.integrations.claude_code import settings
from eurekamem.integrations.claude_code.events import HookOptions, handle, project_domain
from eurekamem.integrations.claude_code.transcript import Mark, Tools, messages_of, read_since

BULK = "x" * 50_000  # a tool's output: never stored


def _session(tmp_path: Path) -> Transcript:
    t = Transcript(tmp_path / "projects" / "-work-shop-api" / "s1.jsonl", "s1", str(tmp_path / "shop-api"), seed=3)
    t.user("I prefer pytest over unittest in this repository.")
    (use,) = t.assistant("Let me look at the tests.", [("Bash", {"command": "ls tests", "description": "list"})],
                         thinking="The user wants pytest.")
    t.tool_result(use, BULK)
    t.snapshot()
    t.summary("Testing conventions")
    return t


def _messages(t: Transcript, mark: Mark | None = None, tools: Tools | None = None) -> tuple[list[dict[str, object]], Mark]:
    read = read_since(str(t.path), mark or Mark())
    return messages_of(read.entries, tools or Tools(), session=t.session_id, user="ana"), read.mark


def test_what_of_a_transcript_becomes_messages(tmp_path: Path) -> None:
    t = _session(tmp_path)
    t.meta("<system-reminder>SessionStart hook additional context: <memories>old</memories></system-reminder>")
    t.command("clear", "cleared")
    t.compact_summary("This session is being continued from a previous conversation that ran out of context.")
    t.sidechain("a sub-agent's prompt")
    t.system("Compacting conversation")
    t.attachment("<memories>\n\n# Old\n\nan injected memory\n\n</memories>")
    t.progress()
    (bad,) = t.assistant(None, [("Edit", {"file_path": "a.py", "old_string": BULK, "new_string": "y"})])
    t.tool_result(bad, "String to replace not found in file.\nmore detail " + BULK, is_error=True)
    messages, _ = _messages(t)
    texts = [(m["role"], m["text"]) for m in messages]
    assert texts == [
        ("user", "I prefer pytest over unittest in this repository."),
        ("assistant", "Let me look at the tests."),
        ("assistant", "[Bash: ok]"),
        ("assistant", "[Edit failed: String to replace not found in file.]"),
    ]
    assert messages[0]["sender"] == "ana" and messages[0]["session"] == "s1" and messages[0]["id"] == t.uuids[0]
    assert messages[0]["timestamp"] == "2026-12-01T09:00:07.000Z"
    assert all(len(str(m["text"])) < 200 for m in messages)  # no tool input or output, no thinking


def test_a_partial_last_line_waits_and_is_read_once_whole(tmp_path: Path) -> None:
    t = _session(tmp_path)
    first, mark = _messages(t)
    line = t._base("user", message={"role": "user", "content": "My deploy target is Fly.io."})
    t.write(line, partial=40)
    again, mark2 = _messages(t, mark)
    assert again == [] and mark2.offset == mark.offset  # the half line is left for later
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    t.append_bytes(data[40:])
    done, mark3 = _messages(t, mark2)
    assert [m["text"] for m in done] == ["My deploy target is Fly.io."]
    assert mark3.offset == t.path.stat().st_size
    # a whole last line whose newline is not written yet is whole: read, and not again after the newline
    t.append_bytes(json.dumps(t._base("user", message={"role": "user", "content": "no newline yet"})).encode())
    last, mark4 = _messages(t, mark3)
    assert [m["text"] for m in last] == ["no newline yet"]
    t.append_bytes(b"\n")
    assert _messages(t, mark4)[0] == []


def test_truncated_rotated_and_rewritten_files_are_read_again_from_the_start(tmp_path: Path) -> None:
    t = _session(tmp_path)
    _, mark = _messages(t)
    t.user("one more")
    read = read_since(str(t.path), mark)
    assert not read.restarted and [e["message"]["content"] for e in read.entries] == ["one more"]
    # rotated: the same name, another file (a rename over it)
    lines = t.path.read_bytes()
    tmp = t.path.with_suffix(".new")
    tmp.write_bytes(lines)
    os.replace(tmp, t.path)
    rotated = read_since(str(t.path), read.mark)
    assert rotated.restarted and len(rotated.entries) == len(lines.splitlines())
    # truncated below the mark
    t.path.write_bytes(lines[: len(lines) // 3])
    truncated = read_since(str(t.path), rotated.mark)
    assert truncated.restarted
    # rewritten in place, same size or longer, other bytes before the mark
    _, mark = _messages(t, truncated.mark)
    data = bytearray(t.path.read_bytes())
    data[10:14] = b"ABCD"
    with open(t.path, "r+b") as f:  # in place: same inode
        f.write(bytes(data))
    assert read_since(str(t.path), mark).restarted


def test_lines_that_are_not_json_are_skipped_and_counted(tmp_path: Path) -> None:
    t = _session(tmp_path)
    t.append_bytes(b"not json\n[1, 2]\n")
    t.user("after the bad lines")
    read = read_since(str(t.path), Mark())
    assert read.bad_lines == 2 and read.entries[-1]["message"]["content"] == "after the bad lines"


def test_a_tool_result_read_later_keeps_its_tools_name(tmp_path: Path) -> None:
    t = Transcript(tmp_path / "s.jsonl", "s2", str(tmp_path))
    (use,) = t.assistant("Running the tests.", [("Bash", {"command": "pytest"})])
    tools = Tools()
    _, mark = _messages(t, Mark(), tools)
    assert tools.pending == {use: "Bash"}
    t.tool_result(use, "3 failed", is_error=True)
    later, _ = _messages(t, mark, Tools(dict(tools.pending)))
    assert [m["text"] for m in later] == ["[Bash failed: 3 failed]"] and later[0]["id"] == f"tool-{use}"


def test_the_domain_is_the_git_roots_name(tmp_path: Path) -> None:
    repo = tmp_path / "shop-api"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "deep").mkdir(parents=True)
    assert project_domain(str(repo / "src" / "deep")) == "shop-api"
    worktree = tmp_path / "wt" / "feature-x"
    worktree.mkdir(parents=True)
    (worktree / ".git").write_text("gitdir: ../../shop-api/.git/worktrees/feature-x\n")  # a worktree's .git is a file
    assert project_domain(str(worktree)) == "feature-x"
    plain = tmp_path / "notes"
    plain.mkdir()
    if not any((p / ".git").exists() for p in plain.parents):
        assert project_domain(str(plain)) == "notes"


def test_a_stop_is_debounced_per_session(tmp_path: Path) -> None:
    t = _session(tmp_path)
    options = HookOptions(domain="shop-api", stop_every=600)
    payload = t.payload("Stop", stop_hook_active=False)
    (tmp_path / "root").mkdir()

    def calls(now: float) -> list[str]:
        handler = handle(payload, options, tmp_path / "root", now=now)
        out = []
        try:
            call = next(handler)
            while True:
                out.append(call[0])
                call = handler.send({"appended": 1} if call[0] == "conversation.append" else "job")
        except StopIteration:
            return out

    assert calls(1000.0) == []  # the session's first Stop: its start is noted
    assert calls(1300.0) == []
    assert calls(1600.0) == ["conversation.append", "conversation.flush"]
    assert calls(1700.0) == []
    assert calls(2200.0) == ["conversation.flush"]  # nothing new: the flush alone (the daemon's debounce answers it)
    with pytest.raises(FileNotFoundError, match="no data root"):  # never made by a hook
        calls_in = handle(payload, options, tmp_path / "elsewhere", now=3000.0)
        next(calls_in)
    assert not (tmp_path / "elsewhere").exists()


# --- settings.json ------------------------------------------------------------------------------------


EXISTING = {
    "model": "opus",
    "permissions": {"allow": ["Bash(git status)"]},
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh", "timeout": 3}]}],
        "SessionStart": [{"hooks": [{"type": "command", "command": "cat NOTES.md"}]}],
    },
}


def test_install_merges_is_idempotent_and_uninstall_restores(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps(EXISTING, indent=2))
    command = settings.command_line(["--domain", "shop api"])
    dry = settings.install(path, command, dry_run=True)
    assert not dry.written and set(dry.events.values()) == {"added"} and json.loads(path.read_text()) == EXISTING
    change = settings.install(path, command)
    assert change.written and set(change.events.values()) == {"added"}
    doc = json.loads(path.read_text())
    assert doc["model"] == "opus" and doc["permissions"] == EXISTING["permissions"]
    assert doc["hooks"]["PreToolUse"] == EXISTING["hooks"]["PreToolUse"]
    assert doc["hooks"]["SessionStart"][0] == EXISTING["hooks"]["SessionStart"][0]  # theirs first, kept
    ours = doc["hooks"]["SessionStart"][1]["hooks"][0]
    assert ours == {"type": "command", "command": command, "timeout": settings.TIMEOUTS["SessionStart"]}
    assert ours["command"].startswith(os.path.abspath(sys.executable)) and "'shop api'" in ours["command"]
    assert set(doc["hooks"]) == {"PreToolUse", "SessionStart", "UserPromptSubmit", "PreCompact", "Stop", "SessionEnd"}
    before = path.read_bytes()
    again = settings.install(path, command)
    assert not again.written and set(again.events.values()) == {"unchanged"} and path.read_bytes() == before
    # other options: updated in place, PostToolUse added, then removed when no longer asked for
    other = settings.command_line(["--post-tool-use"])
    changed = settings.install(path, other, post_tool_use=True)
    assert changed.events["SessionStart"] == "updated" and changed.events["PostToolUse"] == "added"
    doc = json.loads(path.read_text())
    assert doc["hooks"]["PostToolUse"] == [{"matcher": "*", "hooks": [{"type": "command", "command": other, "timeout": 5}]}]
    assert len(doc["hooks"]["SessionStart"]) == 2
    assert settings.install(path, command).events["PostToolUse"] == "removed"
    assert "PostToolUse" not in json.loads(path.read_text())["hooks"]
    removed = settings.uninstall(path)
    assert removed.written and json.loads(path.read_text()) == EXISTING
    assert not settings.uninstall(path).events  # nothing of ours left


def test_a_file_that_is_not_a_settings_object_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    for text in ("{not json", "[1, 2]", '{"hooks": []}'):
        path.write_text(text)
        with pytest.raises(settings.SettingsError, match="nothing was changed|fix it"):
            settings.install(path, settings.command_line([]))
        assert path.read_text() == text


def test_a_users_hook_equal_to_ours_in_another_group_stays(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    command = settings.command_line([])
    theirs = {"matcher": "x", "hooks": [{"type": "command", "command": "echo hi"}]}
    path.write_text(json.dumps({"hooks": {"Stop": [theirs], "Notification": []}}))
    settings.install(path, command)
    settings.uninstall(path)
    assert json.loads(path.read_text()) == {"hooks": {"Stop": [theirs], "Notification": []}}


def _cli(args: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE_", "EUREKAMEM_", "EUREKACLAW_", "XDG_"))}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "eurekamem.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_hooks_commands_on_a_temporary_home_and_project(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "shop-api"
    (project / ".git").mkdir(parents=True)
    home.mkdir()
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text(json.dumps(EXISTING))
    out = _cli(["hooks", "install", "claude-code"], home, project)
    assert out.returncode == 0, out.stderr
    assert f"wrote {home / '.claude' / 'settings.json'}" in out.stdout and "UserPromptSubmit: added" in out.stdout
    assert "unchanged" in _cli(["hooks", "install", "claude-code"], home, project).stdout
    local = _cli(["hooks", "install", "claude-code", "--scope", "local", "--domain", "shop"], home, project)
    assert local.returncode == 0 and (project / ".claude" / "settings.local.json").exists()
    status = _cli(["hooks", "status", "--json"], home, project)
    doc = json.loads(status.stdout)
    assert doc["domain_here"] == "shop-api"
    assert set(doc["scopes"]["user"]["ours"]) == set(settings.BASE_EVENTS)
    assert doc["scopes"]["user"]["others"] == {"PreToolUse": 1, "SessionStart": 1}
    assert "--domain shop" in doc["scopes"]["local"]["ours"]["Stop"][0]["command"]
    assert doc["scopes"]["project"]["ours"] == {} and not doc["scopes"]["project"]["exists"]
    text = _cli(["hooks", "status"], home, project).stdout
    assert "PreToolUse: 1 other hook, kept" in text and "'shop-api'" in text
    gone = _cli(["hooks", "uninstall"], home, project)
    assert gone.returncode == 0 and f"none in {project / '.claude' / 'settings.json'}" in gone.stdout
    assert json.loads((home / ".claude" / "settings.json").read_text()) == EXISTING
    assert json.loads((project / ".claude" / "settings.local.json").read_text()) == {}


def test_a_long_transcript_is_sent_in_bounded_appends() -> None:
    from eurekamem.integrations.claude_code.events import APPEND_BATCH, APPEND_CHARS, _batches

    many = [{"id": str(i), "role": "user", "text": "x"} for i in range(2 * APPEND_BATCH + 1)]
    assert [len(b) for b in _batches(many)] == [APPEND_BATCH, APPEND_BATCH, 1]
    big = [{"id": str(i), "role": "user", "text": "y" * (APPEND_CHARS // 2 + 1)} for i in range(3)]
    assert [len(b) for b in _batches(big)] == [1, 1, 1]  # each append within the characters' bound
    assert _batches([]) == []


def test_a_session_held_by_another_hook_is_waited_for_within_the_budget_only(tmp_path: Path) -> None:
    import time

    from eurekamem.integrations.claude_code.state import Locked, SessionState

    t = _session(tmp_path)
    (tmp_path / "root").mkdir()
    holder = SessionState.open(tmp_path / "root", t.session_id, time.monotonic())
    try:
        payload = t.payload("PreCompact", trigger="auto", custom_instructions="")
        with pytest.raises(Locked):
            next(handle(payload, HookOptions(), tmp_path / "root", wait_lock=False))
        started = time.monotonic()
        with pytest.raises(Locked):
            next(handle(payload, HookOptions(), tmp_path / "root", deadline=started + 0.2))
        assert time.monotonic() - started < 5
    finally:
        holder.close()
    handler = handle(payload, HookOptions(domain="shop-api"), tmp_path / "root")
    assert next(handler)[0] == "conversation.append"  # released: the next hook goes on
    handler.close()
