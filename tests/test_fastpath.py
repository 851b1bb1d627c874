"""The readers' fast path (reads and tier-1 calls answered by the connection's reader while the
tier's actor owes nothing): same answers and ordering as through the actor, never a write that is
not durable yet, errors still reach the client."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conftest import IO_TIMEOUT, HeldJournal, RawConnection, running_daemon
from eurekamem.daemon.tier import HANDLERS, Handler
from eurekamem.protocol import ProtocolError


async def _pipelined(conn: RawConnection, calls: list[tuple[str, dict[str, Any]]]) -> dict[int, Any]:
    """Send every call in one write; answers by id."""
    lines = [json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}) for i, (m, p) in enumerate(calls)]
    await conn.stream.send_all(("\n".join(lines) + "\n").encode())
    answers = {}
    for _ in calls:
        answer = await conn.read()
        answers[answer["id"]] = answer
    return answers


async def test_pipelined_reads_see_the_writes_sent_before_them(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock") as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            calls = [
                ("persistent.recall", {"key": "k"}),
                ("persistent.remember", {"key": "k", "value": 1}),
                ("persistent.recall", {"key": "k"}),
                ("persistent.remember", {"key": "k", "value": 2}),
                ("persistent.recall", {"key": "k"}),
                ("persistent.forget", {"key": "k"}),
                ("persistent.recall", {"key": "k"}),
                ("episodic.log", {"session_id": "s", "agent_role": "r", "content": "one"}),
                ("episodic.recent", {"session_id": "s", "n": 10}),
                ("session.close", {"session_id": "s"}),
                ("episodic.recent", {"session_id": "s", "n": 10}),
                ("episodic.log", {"session_id": "s", "agent_role": "r", "content": "two"}),
                ("episodic.recent", {"session_id": "s", "n": 10}),
            ]
            answers = await _pipelined(conn, calls)
            results = [answers[i]["result"] for i in range(len(calls))]
            assert results[0] is None
            assert results[2]["value"] == 1 and results[4]["value"] == 2 and results[6] is None
            assert [e["content"] for e in results[8]] == ["one"]
            assert results[9]["events_written"] == 1
            assert results[10] == []
            assert [e["content"] for e in results[12]] == ["two"]
            # and the fast path did answer some of them (the first recall and the first log at least)
            assert daemon.actors["persistent"].inline_requests >= 1
            assert daemon.actors["episodic"].inline_requests >= 1
            # with the actors idle, reads are answered on the fast path
            before = daemon.actors["persistent"].inline_requests
            assert await conn.result("persistent.recall", {"key": "absent"}) is None
            assert daemon.actors["persistent"].inline_requests == before + 1
            await conn.aclose()


@pytest.mark.parametrize("journal_sync", ["auto", "thread"])  # auto: the kernel's fdatasync where it works
async def test_a_read_never_sees_a_write_still_waiting_for_the_journal(
    data_dir: Path, sock_dir: Path, journal_sync: str
) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", journal_sync=journal_sync) as daemon:
            with HeldJournal(daemon.journal_actor) as held:  # the fsync takes a while: the batch holds the state
                writer = await RawConnection.open(sock_dir / "s.sock")
                reader = await RawConnection.open(sock_dir / "s.sock")
                await writer.send({"jsonrpc": "2.0", "id": 1, "method": "persistent.remember", "params": {"key": "k", "value": 1}})
                await held.wait_entered()  # the remember is in its batch, waiting for the journal
                await reader.send({"jsonrpc": "2.0", "id": 2, "method": "persistent.recall", "params": {"key": "k"}})
                await trio.testing.wait_all_tasks_blocked()
                assert daemon.actors["persistent"].queue_length() == 1  # the read waits behind the write
                held.release()
                answer = await reader.read()
                assert answer["result"]["value"] == 1  # it waited behind the write, and sees it
                assert held.durable  # and was answered after the write was durable
                assert (await writer.read())["result"]["key"] == "k"
            await writer.aclose()
            await reader.aclose()


async def test_errors_on_the_fast_path_reach_the_client(data_dir: Path, sock_dir: Path, monkeypatch: Any) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock") as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            state = daemon.actors["persistent"].state

            def patch(fn: Any) -> None:  # the handler table is where the daemon finds persistent.recall
                monkeypatch.setitem(HANDLERS, "persistent.recall", Handler(fn, "state"))

            def broken(self: Any, params: Any) -> Any:
                raise RuntimeError("boom")

            patch(broken)
            answer = await conn.call("persistent.recall", {"key": "k"})
            assert answer["error"]["data"]["kind"] == "internal" and "boom" in answer["error"]["message"]

            def not_found(self: Any, params: Any) -> Any:
                raise ProtocolError("not_found", "nothing here")

            patch(not_found)
            assert await conn.error_kind("persistent.recall", {"key": "k"}) == "not_found"

            # a read that (by a bug) changes durable state is rolled back and answered `internal`
            def sneaky(self: Any, params: Any) -> Any:
                from eurekamem.protocol.methods import PersistentRemember

                return state.do_remember(PersistentRemember(key="sneaky", value=1))

            patch(sneaky)
            assert await conn.error_kind("persistent.recall", {"key": "k"}) == "internal"
            monkeypatch.undo()
            assert await conn.result("persistent.recall", {"key": "sneaky"}) is None
            assert await conn.result("sys.ping") == {"pong": True}  # the connection lives on
            await conn.aclose()


@pytest.mark.parametrize("journal_sync", ["auto", "thread"])
async def test_requests_behind_a_failed_write_see_no_trace_of_it(data_dir: Path, sock_dir: Path, journal_sync: str) -> None:
    """Requests that arrive while a write waits for the journal wait behind it (never the fast
    path); when it fails it is rolled back first: they read the state without it, write read_only."""
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", journal_sync=journal_sync) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert (await conn.result("persistent.remember", {"key": "kept", "value": 0}))["key"] == "kept"
            with HeldJournal(daemon.journal_actor, fail_errno=errno.ENOSPC) as held:
                first = await RawConnection.open(sock_dir / "s.sock")
                await first.send({"jsonrpc": "2.0", "id": 1, "method": "persistent.remember", "params": {"key": "k", "value": 1}})
                await held.wait_entered()
                behind = await RawConnection.open(sock_dir / "s.sock")
                async with trio.open_nursery() as nursery:
                    answers: dict[int, Any] = {}

                    async def send_behind() -> None:
                        answers.update(
                            await _pipelined(
                                behind,
                                [
                                    ("persistent.recall", {"key": "k"}),  # must not see k=1, which is about to be lost
                                    ("persistent.remember", {"key": "k2", "value": 2}),
                                    ("persistent.recall", {"key": "kept"}),
                                ],
                            )
                        )

                    nursery.start_soon(send_behind)
                    await trio.testing.wait_all_tasks_blocked()
                    assert daemon.actors["persistent"].queue_length() == 3  # all three wait behind the failing write
                    held.release()
                assert (await first.read())["error"]["data"]["kind"] == "read_only"
                assert answers[0]["result"] is None  # not the lost k=1
                # the batch's calls from its first write on answer read_only (the journal is failed)
                assert answers[1]["error"]["data"]["kind"] == answers[2]["error"]["data"]["kind"] == "read_only"
            assert await conn.result("persistent.recall", {"key": "k"}) is None
            assert await conn.result("persistent.recall", {"key": "k2"}) is None
            assert (await conn.result("persistent.recall", {"key": "kept"}))["value"] == 0
            stats = await conn.result("sys.stats", {})
            assert stats["read_only"] is True and "No space left" in stats["journal"]["failed"]
            for c in (conn, first, behind):
                await c.aclose()


async def test_many_pipelining_writers_are_all_answered_and_kept(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock") as daemon:

            async def writer(n: int) -> None:
                conn = await RawConnection.open(sock_dir / "s.sock")
                for i in range(20):
                    calls = [("persistent.remember", {"key": f"w{n}.{i}", "value": i}), ("persistent.recall", {"key": f"w{n}.{i}"})]
                    answers = await _pipelined(conn, calls)
                    assert answers[1]["result"]["value"] == i
                await conn.aclose()

            async with trio.open_nursery() as nursery:
                for n in range(8):
                    nursery.start_soon(writer, n)
            conn = await RawConnection.open(sock_dir / "s.sock")
            keys = (await conn.result("persistent.keys", {"prefix": "w"}))["keys"]
            assert len(keys) == 160
            assert daemon.actors["persistent"]._owed == 0
            await conn.aclose()
