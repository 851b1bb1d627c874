"""Tier 1's session ends besides session.close: idle sessions, the bound on open sessions, shutdown.

The actor runs in-process on trio's virtual clock (autojump); its file writes run inline (no worker
thread), so the clock only moves when every task waits on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from eurekamem.daemon.config import ConfigError, build_config, load
from eurekamem.daemon.jobs.extract import session_key
from eurekamem.daemon.paths import Paths
from eurekamem.daemon.storage.journal_actor import JournalUnavailable
from eurekamem.daemon.tier import Work
from eurekamem.daemon.tiers.episodic import WRITE_RETRY, EpisodicActor, EpisodicState
from eurekamem.protocol import METHODS, Call, ProtocolError
from eurekamem.protocol import methods as m


class Collect:
    """A Reply that keeps what the actor answers."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def deliver(self, call: Call, result: Any, started_ns: int) -> None:
        self.results.append(result)

    def flush(self) -> None:
        pass


async def inline_io(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Harness:
    def __init__(self, actor: EpisodicActor) -> None:
        self.actor = actor
        self.reply = Collect()

    async def call(self, method: str, params: Any) -> Any:
        self.actor.submit(Work(Call(1, METHODS[method], params), self.reply, 0))
        await trio.testing.wait_all_tasks_blocked()
        return self.reply.results[-1]

    async def log(self, session_id: str, content: str, **extra: Any) -> Any:
        params = m.EpisodicLog(session_id=session_id, agent_role="theory", content=content, **extra)
        return await self.call("episodic.log", params)

    def open_sessions(self) -> list[str]:
        return list(self.actor.state.sessions)


def run_file(root: Path, session_id: str) -> list[dict[str, Any]]:
    return json.loads((root / "runs" / session_id / "episodic.json").read_text())


def make_actor(root: Path, *, idle: float = 3600.0, max_sessions: int = 256, run_io: Any = inline_io) -> EpisodicActor:
    return EpisodicActor(EpisodicState(max_sessions=max_sessions), None, Paths(root), idle_close=idle, run_io=run_io)


async def test_an_idle_session_is_closed_and_written_as_session_close_would(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    actor = make_actor(data_dir, idle=3600.0)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        first = await h.log("s1", "tried Bernstein")
        await trio.sleep(1800)
        await h.log("s2", "second session")
        await trio.sleep(1799)
        assert h.open_sessions() == ["s1", "s2"]  # s1 is 3599 s quiet: not yet
        await trio.sleep(2)
        assert h.open_sessions() == ["s2"]
        written = run_file(data_dir, "s1")
        assert [e["entry_id"] for e in written] == [first.entry_id]
        assert written[0]["content"] == "tried Bernstein" and written[0]["timestamp"] == first.timestamp
        # an event keeps a session open: s2 logs again before its hour is up
        await trio.sleep(1700)
        await h.log("s2", "still working")
        await trio.sleep(3599)
        assert h.open_sessions() == ["s2"]
        await trio.sleep(2)
        assert h.open_sessions() == []
        assert [e["content"] for e in run_file(data_dir, "s2")] == ["second session", "still working"]
        assert actor.state.closed_idle == 2
        # a session that logs again after it was closed appends to its file; nothing is overwritten
        await h.log("s1", "back after lunch")
        closed = await h.call("session.close", m.SessionClose(session_id="s1"))
        assert closed["events_written"] == 1
        assert [e["content"] for e in run_file(data_dir, "s1")] == ["tried Bernstein", "back after lunch"]
        actor.close()


class FakeJobs:
    """The job queue's accept, recorded (the key decides, as in JobsState.accept); `refuse` makes the
    journal refuse it."""

    def __init__(self) -> None:
        self.accepted: dict[str, tuple[str, Any]] = {}
        self.calls = 0
        self.refuse = False

    async def accept(self, kind: str, key: str, job_input: Any) -> str:
        self.calls += 1
        if self.refuse:
            raise JournalUnavailable("disk full")
        self.accepted.setdefault(key, (kind, job_input))
        return key


async def test_an_idle_session_queues_its_extraction_once(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    actor = make_actor(data_dir, idle=3600.0)
    jobs = actor.jobs = FakeJobs()
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await h.log("s1", "tried Bernstein", metadata={"tool": "bernstein"})
        await h.log("s1", "tried Azuma")
        jobs.refuse = True  # read-only when it turns idle: the session stays open, nothing is written
        await trio.sleep(3601)
        assert h.open_sessions() == ["s1"] and jobs.calls == 1 and jobs.accepted == {}
        assert not (data_dir / "runs" / "s1").exists()
        jobs.refuse = False
        await trio.sleep(WRITE_RETRY)
        assert h.open_sessions() == [] and actor.state.closed_idle == 1
        [(key, (kind, job_input))] = jobs.accepted.items()
        assert kind == "session.extract" and key == session_key("s1", "", None, job_input.events)
        assert job_input.session_id == "s1" and job_input.domain == "" and job_input.theory_state is None
        assert [e.content for e in job_input.events] == ["tried Bernstein", "tried Azuma"]
        assert job_input.events[0].metadata == {"tool": "bernstein"}
        assert len(run_file(data_dir, "s1")) == 2
        await trio.sleep(10 * 3600)  # closed once: no second job
        assert jobs.calls == 2 and len(jobs.accepted) == 1
        # a session closed by session.close before it idles queues its job there, not again at idle time
        await h.log("s2", "x")
        await h.call("session.close", m.SessionClose(session_id="s2"))
        await trio.sleep(2 * 3600)
        assert jobs.calls == 3 and len(jobs.accepted) == 2
        actor.close()


async def test_idle_close_zero_keeps_sessions_for_ever(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    actor = make_actor(data_dir, idle=0)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await h.log("s1", "x")
        await trio.sleep(10 * 86400)
        assert h.open_sessions() == ["s1"]
        actor.close()
    assert [e["content"] for e in run_file(data_dir, "s1")] == ["x"]  # written at shutdown


async def test_the_bound_on_open_sessions_closes_the_longest_idle_first(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    actor = make_actor(data_dir, idle=3600.0, max_sessions=3)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        for name in ("a", "b", "c"):
            await h.log(name, f"{name} 1")
            await trio.sleep(1)
        await h.log("a", "a 2")  # a is now the most recent; b the longest idle
        await h.log("d", "d 1")
        assert h.open_sessions() == ["c", "a", "d"]
        assert [e["content"] for e in run_file(data_dir, "b")] == ["b 1"]
        for i in range(20):  # a flood of new sessions never holds more than the bound
            await h.log(f"new{i}", "x")
            assert len(actor.state.sessions) <= 3
        assert h.open_sessions() == ["new17", "new18", "new19"]
        assert [e["content"] for e in run_file(data_dir, "a")] == ["a 1", "a 2"]
        assert actor.state.counts()["closed_evicted"] == 21
        actor.close()


async def test_a_failed_write_keeps_the_events_and_is_retried_later(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    failing = True
    attempts = 0

    async def flaky_io(fn: Callable[..., Any], *args: Any) -> Any:
        nonlocal attempts
        attempts += 1
        if failing:
            raise OSError(28, "No space left on device")
        return fn(*args)

    actor = make_actor(data_dir, idle=60.0, run_io=flaky_io)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await h.log("s1", "precious")
        await trio.sleep(61)
        assert h.open_sessions() == ["s1"] and attempts == 1  # not closed: the events stay in RAM
        await trio.sleep(WRITE_RETRY - 2)
        assert attempts == 1  # no busy retrying
        failing = False
        await trio.sleep(3)
        assert h.open_sessions() == [] and attempts == 2
        assert [e["content"] for e in run_file(data_dir, "s1")] == ["precious"]
        actor.close()


async def test_shutdown_writes_every_open_session(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    actor = make_actor(data_dir)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await h.log("s1", "one")
        await h.log("s2", "two")
        actor.close()
    assert [e["content"] for e in run_file(data_dir, "s1")] == ["one"]
    assert [e["content"] for e in run_file(data_dir, "s2")] == ["two"]


async def test_a_client_chosen_entry_id_makes_a_retry_harmless(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    actor = make_actor(data_dir)
    h = Harness(actor)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        params = {"entry_id": "e-1", "timestamp": "2026-03-01T10:00:00.5+01:00"}
        first = await h.log("s1", "buffered while the daemon was away", **params)
        again = await h.log("s1", "buffered while the daemon was away", **params)
        assert first.entry_id == again.entry_id == "e-1"
        assert first.timestamp == "2026-03-01T09:00:00.500000+00:00"  # kept, in UTC
        assert len(actor.state.sessions["s1"]) == 1
        naive = await h.log("s1", "x", timestamp="2026-03-01T10:00:00")
        assert naive.timestamp == "2026-03-01T10:00:00+00:00"  # naive means UTC, as EurekaClaw's utcnow()
        bad = await h.log("s1", "x", timestamp="yesterday")
        assert isinstance(bad, ProtocolError) and bad.kind == "invalid_params"
        assert len(actor.state.sessions["s1"]) == 2  # the bad call changed nothing
        actor.close()


def test_the_options_are_settings_like_every_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EUREKAMEM_SESSION_IDLE_CLOSE", "120")
    config = build_config(load({"data_dir": str(tmp_path), "max_open_sessions": 8}, None))
    assert config.session_idle_close == 120.0 and config.max_open_sessions == 8
    # as the daemon builds tier 1 (daemon/app.py): both values from the Config, nothing in between
    actor = EpisodicActor(EpisodicState(config.max_open_sessions), None, Paths(tmp_path), idle_close=config.session_idle_close)
    assert actor.idle_close == 120.0 and actor.state.max_sessions == 8
    monkeypatch.setenv("EUREKAMEM_SESSION_IDLE_CLOSE", "-1")
    with pytest.raises(ConfigError, match="session_idle_close|SESSION_IDLE_CLOSE"):
        load({"data_dir": str(tmp_path)}, None)
