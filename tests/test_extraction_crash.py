"""kill -9 of the real daemon subprocess in the middle of an extraction job, at three points, and
the results exactly once after the restart; no key -> queued -> key set -> done. The daemon's
anthropic SDK talks to the loopback stub of tests/test_llm.py, run by this process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

from test_extraction import DOMAIN, INSIGHTS, THEORY_STATE
from test_llm import Recorded, Reply, StubLLMServer, anthropic_tool, http_error

from daemon_process import DaemonProcess
from eurekamem.client import Client

TIMEOUT = 30.0
KEY = "sk-test-crash"


def daemon(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer, *, key: bool = True, pause: str | None = None
) -> DaemonProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EUREKACLAW_FAST_MODEL")}
    env["ANTHROPIC_BASE_URL"] = stub.url("anthropic")
    # no snapshot by the clock: what the restart recovers is replayed from the journal, however long the
    # LLM's SDK takes to load (at the job's first request) on a busy machine
    proc = DaemonProcess(data_dir, sock_dir / "s.sock", "--snapshot-quiet", "3600", "--snapshot-max-delay", "3600", env=env)
    setenv(proc, "ANTHROPIC_API_KEY", KEY if key else None)
    setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", pause)
    return proc


def setenv(proc: DaemonProcess, name: str, value: str | None) -> None:
    """Set (None: remove) a variable of the daemon's environment, for its next start."""
    assert proc.env is not None
    if value is None:
        proc.env.pop(name, None)
    else:
        proc.env[name] = value


def valid() -> Reply:
    return anthropic_tool(INSIGHTS, name="session_insights")


def close_session(proc: DaemonProcess) -> str:
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        c.call("episodic.log", {"session_id": "run-7", "agent_role": "theory", "content": "tried Bernstein"})
        closed = c.call("session.close", {"session_id": "run-7", "domain": DOMAIN, "theory_state": THEORY_STATE})
    assert isinstance(closed["job_id"], str)
    return closed["job_id"]


def kill_9(proc: DaemonProcess) -> None:
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGKILL)
    assert proc.wait_exit() == -signal.SIGKILL


def exactly_once(proc: DaemonProcess, job_id: str) -> dict[str, Any]:
    """After the restart: the job done, and each of its results there once."""
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        job = c.wait_job(job_id, timeout=TIMEOUT)
        assert job["state"] == "done", job
        memories = c.call("memory.list", {"domain": DOMAIN})
        assert memories["total"] == 4 and len({m["fingerprint"] for m in memories["memories"]}) == 4
        assert all(len(c.memory_history(m["id"])) == 1 for m in memories["memories"])
        assert c.call("graph.stats", {})["nodes"] == 3 and c.call("graph.stats", {})["edges"] == 2
        record = c.call("persistent.recall", {"key": "theory.failed_strategies.bandit_theory.L_tail"})
        assert len(record["value"]["attempts"]) == 2
        assert [j["id"] for j in c.jobs()] == [job_id] and c.jobs(state="queued") == []
    return job


def recovered(proc: DaemonProcess) -> dict[str, int]:
    """What the daemon's start-up said it recovered (its "recovered in ... s: ..." log line)."""
    message = json.loads(proc.wait_for_line("recovered in "))["msg"]
    replayed = re.search(r"replayed ([\d,]+) journal records", message)
    interrupted = re.search(r"([\d,]+) interrupted jobs queued again", message)
    assert replayed is not None, message
    return {
        "replayed": int(replayed.group(1).replace(",", "")),
        "interrupted_jobs": int(interrupted.group(1).replace(",", "")) if interrupted else 0,
    }


def hang_until_killed(arrived: threading.Event, stub: StubLLMServer) -> Any:
    def action(recorded: Recorded) -> Reply:
        arrived.set()
        stub.release.wait(TIMEOUT)  # the daemon is killed meanwhile; this answer goes nowhere
        return http_error(500)

    return action


def test_kill_9_before_the_llm_answers(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    arrived = threading.Event()
    stub.script.extend([hang_until_killed(arrived, stub), valid()])
    proc = daemon(data_dir, sock_dir, stub).start()
    try:
        job_id = close_session(proc)
        assert arrived.wait(TIMEOUT)  # the request is at the provider, the answer not back
        kill_9(proc)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 2 and recovered(proc)["interrupted_jobs"] == 1
        assert len(stub.requests) == 2
    finally:
        proc.kill()


def test_kill_9_after_the_answer_before_the_apply(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.extend([valid(), valid()])
    proc = daemon(data_dir, sock_dir, stub, pause="answered").start()
    try:
        job_id = close_session(proc)
        proc.wait_for_line("jobs: paused at answered")
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.call("memory.list", {})["total"] == 0 and c.job(job_id)["state"] == "running"
        kill_9(proc)
        setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", None)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 2 and len(stub.requests) == 2  # asked again: the first answer was never applied
    finally:
        proc.kill()


def test_kill_9_after_the_apply(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.append(valid())
    proc = daemon(data_dir, sock_dir, stub, pause="committed").start()
    try:
        job_id = close_session(proc)
        proc.wait_for_line("jobs: paused at committed")
        kill_9(proc)
        setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", None)
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 1 and len(stub.requests) == 1  # applied once, never run again
        assert recovered(proc)["replayed"] >= 3 and recovered(proc)["interrupted_jobs"] == 0  # from the journal
    finally:
        proc.kill()


def test_no_key_then_the_key_then_done(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.append(valid())
    proc = daemon(data_dir, sock_dir, stub, key=False).start()
    try:
        job_id = close_session(proc)
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            job = c.wait_job(job_id, timeout=0.5)
            assert job["state"] == "queued" and job["attempts"] == 0
            assert (
                job["waiting_reason"]
                == "no LLM: no LLM provider configured (set llm_provider in the config file or EUREKAMEM_LLM_PROVIDER, or ANTHROPIC_API_KEY for Anthropic)"
            )
            stats = c.call("sys.stats")
            assert stats["jobs"]["waiting_reason"] == job["waiting_reason"] and stats["jobs"]["queued"] == 1
        assert proc.terminate() == 0
        assert stub.requests == []
        setenv(proc, "ANTHROPIC_API_KEY", KEY)  # the key set in the daemon's environment, then a restart
        proc.start()
        job = exactly_once(proc, job_id)
        assert job["attempts"] == 1 and job["tokens"].to_dict() == {"input": 120, "output": 30}
    finally:
        proc.kill()
