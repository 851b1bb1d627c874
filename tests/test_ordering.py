"""Per-connection order through a real daemon and a real socket: raw NDJSON frames pipelined in one
send, a write held open inside the daemon (a gated embedder, a gated journal write), and the
requests behind it must see it, while other connections and other tiers are not held."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_memory import FAST, gated

from conftest import IO_TIMEOUT, HeldJournal, RawConnection, running_daemon
from eurekamem.daemon.server import IN_ORDER_TIERS
from eurekamem.daemon.tier import TierActor


def _frame(request_id: int, method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


async def _send_at_once(conn: RawConnection, *frames: str) -> None:
    """Every frame in one send (one write on the socket)."""
    await conn.stream.send_all(("\n".join(frames) + "\n").encode())


async def _answers(conn: RawConnection, n: int) -> dict[int, Any]:
    answers = {}
    for _ in range(n):
        answer = await conn.read()
        answers[answer["id"]] = answer
    return answers


def _held(daemon: Any) -> int:
    return sum(conn.protocol.held for conn in daemon._connections)


async def _send_while_gated(
    daemon: Any, conn: RawConnection, entered: threading.Event, held: int, *frames: str
) -> None:
    """Send the frames at once, wait until a gated call is waiting and the daemon is idle around it,
    then check how many requests the connection holds back."""
    await _send_at_once(conn, *frames)
    assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
    await trio.testing.wait_all_tasks_blocked()
    assert _held(daemon) == held


@contextlib.asynccontextmanager
async def _serving(
    data_dir: Path, sock_dir: Path, seconds: float, **options: Any
) -> AsyncIterator[tuple[Any, RawConnection]]:
    """A daemon and one raw connection to it, everything under trio.fail_after(seconds)."""
    with trio.fail_after(seconds):
        async with running_daemon(data_dir, sock_dir / "s.sock", **options) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            try:
                yield daemon, conn
            finally:
                await conn.aclose()


def _memory(domain: str, title: str, content: str) -> dict[str, Any]:
    return {"domain": domain, "category": "fact", "title": title, "content": content, "dedup": False}


async def test_a_search_pipelined_behind_an_add_finds_it(data_dir: Path, sock_dir: Path) -> None:
    """memory.add then memory.search (each mode), get and list in one write; the add's embedding is
    held open, so a search that ran at once could not see it: every one of them must."""
    async with _serving(data_dir, sock_dir, IO_TIMEOUT * 3, **FAST) as (daemon, conn):
        embedder = daemon.actors["memory"].state.embedder
        for n, mode in enumerate(["hybrid", "dense", "lexical"]):
            content = f"Walrus colony {n} hauls out on the ice floe every spring morning"
            base = 10 * n
            with gated(embedder, "embed_passages") as entered:
                await _send_while_gated(
                    daemon, conn, entered, 3,  # the reads wait for the add, not dispatched
                    _frame(base + 1, "memory.add", _memory(f"zoo {n}", f"Walrus colony {n}", content)),
                    _frame(base + 2, "memory.search", {"query": content, "mode": mode, "k": 10}),
                    _frame(base + 3, "memory.list", {}),
                    _frame(base + 4, "memory.inject", {"domain": f"zoo {n}"}),
                )
            answers = await _answers(conn, 4)
            added = answers[base + 1]["result"]
            assert added["decision"] == "created"
            assert added["memory"]["id"] in [hit["memory"]["id"] for hit in answers[base + 2]["result"]]
            assert answers[base + 3]["result"]["total"] == n + 1
            assert answers[base + 4]["result"]["ids"] == [added["memory"]["id"]]


async def test_pipelined_add_then_search_finds_it_every_time(data_dir: Path, sock_dir: Path) -> None:
    """No gate: whatever the timing of the embedding, the search behind the add sees it."""
    async with _serving(data_dir, sock_dir, IO_TIMEOUT * 3, **FAST) as (daemon, conn):
        for n in range(25):
            content = f"Observation {n}: the narwhal tusk number {n} spirals to the left"
            await _send_at_once(
                conn,
                _frame(1, "memory.add", _memory("sea", f"Narwhal {n}", content)),
                _frame(2, "memory.search", {"query": f"narwhal tusk number {n}", "mode": "lexical", "k": 1}),
                _frame(3, "memory.get", {"id": "00000000-0000-0000-0000-000000000000"}),
            )
            answers = await _answers(conn, 3)
            assert answers[2]["result"][0]["memory"]["id"] == answers[1]["result"]["memory"]["id"], n
            assert answers[3]["error"]["data"]["kind"] == "not_found"


async def test_a_held_search_does_not_see_a_write_sent_after_it(data_dir: Path, sock_dir: Path) -> None:
    async with _serving(data_dir, sock_dir, IO_TIMEOUT * 2, **FAST) as (daemon, conn):
        with gated(daemon.actors["memory"].state.embedder, "embed_passages") as entered:
            await _send_while_gated(
                daemon, conn, entered, 3,
                _frame(1, "memory.add", _memory("sea", "First walrus", "A walrus sleeps on the beach")),
                _frame(2, "memory.search", {"query": "walrus", "mode": "lexical"}),
                _frame(3, "memory.add", _memory("sea", "Second walrus", "Another walrus swims past the beach")),
                _frame(4, "memory.search", {"query": "walrus", "mode": "lexical"}),
            )
        answers = await _answers(conn, 4)
        first, second = answers[1]["result"]["memory"]["id"], answers[3]["result"]["memory"]["id"]
        assert [hit["memory"]["id"] for hit in answers[2]["result"]] == [first]
        assert sorted(hit["memory"]["id"] for hit in answers[4]["result"]) == sorted([first, second])


@pytest.mark.parametrize("journal_sync", ["auto", "thread"])  # auto: the kernel's fdatasync where it works
async def test_a_recall_pipelined_behind_a_remember_sees_it(data_dir: Path, sock_dir: Path, journal_sync: str) -> None:
    """The persistent and graph tiers, with the journal's write held open: the connection holds
    nothing back (IN_ORDER_TIERS), their actors' order is enough."""
    async with _serving(data_dir, sock_dir, IO_TIMEOUT, journal_sync=journal_sync) as (daemon, conn):
        with HeldJournal(daemon.journal_actor) as held:
            await _send_while_gated(
                daemon, conn, held.entered, 0,  # none held: these tiers' actors run them in order
                _frame(1, "persistent.remember", {"key": "k", "value": 1}),
                _frame(2, "persistent.recall", {"key": "k"}),
                _frame(3, "persistent.remember", {"key": "k", "value": 2}),
                _frame(4, "persistent.recall", {"key": "k"}),
                _frame(5, "graph.add_theorem", {"theorem_name": "Hoeffding", "formal_statement": "P <= 2e^-2t"}),
                _frame(6, "graph.search", {"query": "Hoeffding"}),
            )
        answers = await _answers(conn, 6)
        assert answers[2]["result"]["value"] == 1 and answers[4]["result"]["value"] == 2
        node = answers[5]["result"]["node_id"]
        assert [n["node_id"] for n in answers[6]["result"]] == [node]


async def test_a_batch_and_sys_stats_see_the_writes_sent_before_them(data_dir: Path, sock_dir: Path) -> None:
    async with _serving(data_dir, sock_dir, IO_TIMEOUT * 2, **FAST) as (daemon, conn):
        batch = [
            json.loads(_frame(1, "memory.add", _memory("sea", "Seal", "A grey seal naps on the rocks"))),
            json.loads(_frame(2, "memory.search", {"query": "grey seal", "mode": "lexical"})),
            json.loads(_frame(3, "persistent.remember", {"key": "seal", "value": True})),
        ]
        with gated(daemon.actors["memory"].state.embedder, "embed_passages") as entered:
            await _send_at_once(conn, json.dumps(batch), _frame(4, "sys.stats", {}), _frame(5, "sys.ping", {}))
            assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
            assert (await conn.read())["id"] == 5  # sys.ping reads no tier: never held
            await trio.testing.wait_all_tasks_blocked()
            assert _held(daemon) == 2  # the search, and sys.stats behind both writes
        first, second = await conn.read(), await conn.read()  # in any order
        array, stats = (first, second) if isinstance(first, list) else (second, first)
        assert isinstance(array, list) and sorted(a["id"] for a in array) == [1, 2, 3]
        by_id = {a["id"]: a for a in array}
        assert [hit["memory"]["id"] for hit in by_id[2]["result"]] == [by_id[1]["result"]["memory"]["id"]]
        assert stats["id"] == 4
        assert stats["result"]["tiers"]["memory"]["memories"] == 1
        assert stats["result"]["tiers"]["persistent"]["records"] == 1


async def test_other_connections_and_other_tiers_are_not_held(data_dir: Path, sock_dir: Path) -> None:
    """While one connection's add embeds: its own reads of other tiers are answered, and another
    connection's reads of tier 4 are answered at once, without the add (it is not answered yet)."""
    async with _serving(data_dir, sock_dir, IO_TIMEOUT * 2, **FAST) as (daemon, writer):
        other = await RawConnection.open(sock_dir / "s.sock")
        with gated(daemon.actors["memory"].state.embedder, "embed_passages") as entered:
            await _send_at_once(
                writer,
                _frame(1, "memory.add", _memory("sea", "Orca", "An orca pod hunts near the fjord")),
                _frame(2, "persistent.recall", {"key": "absent"}),
                _frame(3, "graph.stats", {}),
                _frame(4, "episodic.log", {"session_id": "s", "agent_role": "r", "content": "orca"}),
            )
            assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
            assert sorted((await _answers(writer, 3)).keys()) == [2, 3, 4]
            assert (await other.result("memory.list", {}))["total"] == 0
            assert await other.result("memory.search", {"query": "orca", "mode": "lexical"}) == []
            assert _held(daemon) == 0
        assert (await writer.read())["result"]["decision"] == "created"
        assert (await other.result("memory.list", {}))["total"] == 1
        await other.aclose()


async def test_the_tiers_left_to_their_actors_order_are_those_that_keep_it(data_dir: Path, sock_dir: Path) -> None:
    """IN_ORDER_TIERS names the tiers whose actor runs TierActor's FIFO loop (one channel, batch by
    batch, possibly wrapped with background work); tier 4's actor runs reads beside its writes, so the
    connection must hold for it."""
    async with _serving(data_dir, sock_dir, IO_TIMEOUT, **FAST) as (daemon, conn):
        assert IN_ORDER_TIERS == {name for name, actor in daemon.actors.items() if actor.ARRIVAL_ORDER}
        assert not type(daemon.actors["memory"]).ARRIVAL_ORDER and type(daemon.actors["memory"]).run is not TierActor.run
        assert "memory" not in IN_ORDER_TIERS
