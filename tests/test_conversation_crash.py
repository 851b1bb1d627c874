"""kill -9 of the real daemon subprocess around a conversation extraction: between the append and the
extraction, while the LLM is asked, after its answer before the commit, after the commit. After the
restart the window is extracted exactly once: its memories once, the mark moved once, the summary
set, and an attempt that was cut off read the same window again. The daemon's anthropic SDK talks
to the loopback stub of tests/test_llm.py, run by this process.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from test_conversation_extraction import ENGLISH, ENGLISH_ANSWER, GROUP
from test_extraction_crash import (
    KEY,
    TIMEOUT,
    daemon,
    hang_until_killed,
    kill_9,
    recovered,
    setenv,
)
from test_llm import StubLLMServer, anthropic_tool

from daemon_process import DaemonProcess
from eurekamem.client import Client


def valid() -> Any:
    return anthropic_tool(ENGLISH_ANSWER, name="conversation_memories")


def append(proc: DaemonProcess) -> None:
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        assert c.append_messages(GROUP, ENGLISH) == {"appended": 4, "ignored": 0}


def flush(proc: DaemonProcess) -> str:
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        job_id = c.flush_conversation(GROUP)
    assert isinstance(job_id, str)
    return job_id


def exactly_once(proc: DaemonProcess, job_id: str) -> dict[str, Any]:
    """After the restart: the job done, its memories there once, the mark past the window, the summary."""
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        job = c.wait_job(job_id, timeout=TIMEOUT)
        assert job["state"] == "done", job
        memories = c.call("memory.list", {"domain": GROUP})
        assert memories["total"] == 3 and len({m["fingerprint"] for m in memories["memories"]}) == 3
        assert all(len(c.memory_history(m["id"])) == 1 for m in memories["memories"])
        assert sorted(m["source_message_ids"][0] for m in memories["memories"]) == ["d1-1", "d1-2", "d1-3"]
        [group] = c.call("conversation.groups")
        assert group["high_water_mark"] == job["result"]["mark_to"] == 4 and group["pending"] == 0
        assert c.summary(GROUP)["summary"] == ENGLISH_ANSWER["summary"]
        assert [j["id"] for j in c.jobs()] == [job_id]
        assert c.flush_conversation(GROUP) == job_id  # nothing new: the job that covered it
    return job


def windows(stub: StubLLMServer) -> list[str]:
    """The messages part of each prompt the stub was sent."""
    out = []
    for request in stub.requests:
        prompt = str(request.body["messages"][0]["content"])
        out.append(prompt.split("New messages")[1].split("Record what")[0])
    return out


def test_kill_9_between_the_append_and_the_extraction(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.append(valid())
    proc = daemon(data_dir, sock_dir, stub, key=False).start()
    try:
        append(proc)
        kill_9(proc)  # acknowledged, not extracted
        proc.start()
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            [group] = c.call("conversation.groups")
            assert group["messages"] == 4 and group["pending"] == 4 and group["high_water_mark"] == 0
        job_id = flush(proc)  # no key: queued, journaled
        kill_9(proc)
        setenv(proc, "ANTHROPIC_API_KEY", KEY)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 1 and len(stub.requests) == 1
    finally:
        proc.kill()


def test_kill_9_while_the_llm_is_asked(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    arrived = threading.Event()
    stub.script.extend([hang_until_killed(arrived, stub), valid()])
    proc = daemon(data_dir, sock_dir, stub).start()
    try:
        append(proc)
        job_id = flush(proc)
        assert arrived.wait(TIMEOUT)  # the request is at the provider, the answer not back
        kill_9(proc)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 2 and recovered(proc)["interrupted_jobs"] == 1
        first, second = windows(stub)
        assert first == second and "[M4] bot" in first  # the same window read again
    finally:
        proc.kill()


def test_kill_9_after_the_answer_before_the_commit(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.extend([valid(), valid()])
    proc = daemon(data_dir, sock_dir, stub, pause="answered").start()
    try:
        append(proc)
        job_id = flush(proc)
        proc.wait_for_line("jobs: paused at answered")
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.call("memory.list", {"domain": GROUP})["total"] == 0 and c.job(job_id)["state"] == "running"
            assert c.call("conversation.groups")[0]["high_water_mark"] == 0  # the mark waits for the commit
            assert c.summary(GROUP)["updated_at"] is None
        kill_9(proc)
        setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", None)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 2 and len(stub.requests) == 2  # asked again: the first answer was never applied
        first, second = windows(stub)
        assert first == second
    finally:
        proc.kill()


def test_kill_9_after_the_commit(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.append(valid())
    proc = daemon(data_dir, sock_dir, stub, pause="committed").start()
    try:
        append(proc)
        job_id = flush(proc)
        proc.wait_for_line("jobs: paused at committed")
        kill_9(proc)
        setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", None)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 1 and len(stub.requests) == 1  # applied once, from the journal, never run again
        assert recovered(proc)["interrupted_jobs"] == 0
    finally:
        proc.kill()
