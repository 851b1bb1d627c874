"""Issue 30 §7: memory writes under load. Writes waiting while an embedding is in flight go to the
model in one call after it; beyond the fast lane's bound (seconds of embedding, at the model's
measured rate) a write is answered `overloaded` with `retry_after_ms` and nothing of it is stored;
the conversation tier's background embedder takes every message waiting in one call.

In-process daemons with a stub embedder that counts its calls and can hold one (a threading
gate), real sockets; the rate the bound reads is set by the test while the one embedding that
would measure it is held, so every figure is exact.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.retrieval.embed import Embedder, Thresholds


class CountingEmbedder(Embedder):
    """Deterministic and instant (a hash-seeded unit vector per text); records every model call
    (role, texts) and holds the calls whose texts hold HOLD until `gate` is set."""

    name, dim, thresholds, batch = "counting", 16, Thresholds(duplicate=0.999, floor=0.0), 1024

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[str]]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def _load(self) -> None:
        pass

    def _embed_batch(self, texts: list[str], role: str) -> np.ndarray:
        self.calls.append((role, list(texts)))
        if any("HOLD" in text for text in texts):
            self.entered.set()
            assert self.gate.wait(IO_TIMEOUT), "the test never opened the gate"
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts]
        return np.asarray(rows).reshape(len(texts), self.dim)

    def passage_calls(self) -> list[list[str]]:
        return [texts for role, texts in self.calls if role == "passage"]


@contextlib.contextmanager
def held(embedder: CountingEmbedder) -> Iterator[None]:
    embedder.gate.clear()
    embedder.entered.clear()
    try:
        yield
    finally:
        embedder.gate.set()


async def entered(embedder: CountingEmbedder) -> None:
    assert await trio.to_thread.run_sync(embedder.entered.wait, IO_TIMEOUT), "no embedding came to be held"


@contextlib.asynccontextmanager
async def routed_count(actor: Any, count: int) -> Any:
    """An Event set once the memory actor has routed `count` writes to a lane."""
    event = trio.Event()
    original = actor._to_bulk
    seen = [0]

    def to_lane(work: Any) -> bool:
        lane = original(work)
        seen[0] += 1
        if seen[0] >= count:
            event.set()
        return lane

    actor._to_bulk = to_lane
    try:
        yield event
    finally:
        del actor._to_bulk


def memory(title: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"domain": "d", "category": "fact", "title": title, "content": content, **extra}


async def test_writes_waiting_behind_an_embedding_go_to_the_model_in_one_call(data_dir: Path, sock_dir: Path) -> None:
    """While one add is being embedded, eight more from four connections (two pipelined on each)
    wait; once it is done they are embedded in one model call, and each connection gets its
    answers in the order it sent them, each the memory it sent."""
    sock = sock_dir / "s.sock"
    embedder = CountingEmbedder()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, embedder_instance=embedder) as daemon:
            actor = daemon.memory_actor
            first = await RawConnection.open(sock)
            conns = [await RawConnection.open(sock) for _ in range(4)]
            with held(embedder):
                await first.send({"id": 0, "method": "memory.add", "params": memory("Held", "HOLD the first memory")})
                await entered(embedder)
                async with routed_count(actor, 8) as all_routed:
                    for n, conn in enumerate(conns):
                        for i in range(2):
                            title = f"c{n} m{i}"
                            await conn.send({"id": i, "method": "memory.add", "params": memory(title, f"memory {i} of client {n}", dedup=False)})
                    await all_routed.wait()
                assert actor.writes_waiting == 9
            assert (await first.read())["result"]["decision"] == "created"
            for n, conn in enumerate(conns):
                answers = [await conn.read(), await conn.read()]
                assert [a["id"] for a in answers] == [0, 1]
                assert [a["result"]["memory"]["title"] for a in answers] == [f"c{n} m0", f"c{n} m1"]
                assert all(a["result"]["decision"] == "created" for a in answers)
            calls = embedder.passage_calls()
            assert len(calls) == 2 and len(calls[0]) == 1 and len(calls[1]) == 8
            assert sorted(calls[1]) == sorted(f"c{n} m{i}\nmemory {i} of client {n}" for n in range(4) for i in range(2))
            assert actor.writes_waiting == 0
            for conn in (first, *conns):
                await conn.aclose()


async def test_a_write_past_the_backlog_is_overloaded_with_a_retry_hint_and_stores_nothing(
    data_dir: Path, sock_dir: Path
) -> None:
    """memory_write_backlog 1 s, the model measured at 1/128 s a character, writes of 32
    characters to embed (0.25 s each): with one held in its embedding, three more are let in (1.0
    s waiting), the fifth is answered `overloaded` at once with retry_after_ms 1000 (the four ahead
    embedded) and is not stored;
    a write with nothing to embed is let in meanwhile; once the lane drains, the same add goes in."""
    sock = sock_dir / "s.sock"
    embedder = CountingEmbedder()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, embedder_instance=embedder, memory_write_backlog=1.0) as daemon:
            actor = daemon.memory_actor
            assert actor.write_backlog == 1.0
            writer, other, reader = [await RawConnection.open(sock) for _ in range(3)]
            # 2-character titles, 30-character contents: 32 characters to embed each
            adds = [memory("T0", "HOLD: memory number 0 of five.", dedup=False)]
            adds += [memory(f"T{i}", f"a plain memory, number {i} of 5.", dedup=False) for i in range(1, 5)]
            assert all(len(p["title"]) + len(p["content"]) == 32 for p in adds)
            with held(embedder):
                await writer.send({"id": 0, "method": "memory.add", "params": adds[0]})
                await entered(embedder)
                actor.seconds_per_char = 1 / 128  # as measured (the held call would measure it next)
                async with routed_count(actor, 3) as let_in:
                    for i in (1, 2, 3):
                        await writer.send({"id": i, "method": "memory.add", "params": adds[i]})
                    await let_in.wait()
                refused = await other.call("memory.add", adds[4], request_id=4)
                assert refused["error"]["code"] == -32029
                assert refused["error"]["data"]["kind"] == "overloaded"
                assert refused["error"]["data"]["retry_after_ms"] == 1000  # when the four ahead should be embedded
                assert "nothing was stored" in refused["error"]["message"]
                async with routed_count(actor, 1) as weak_in:  # embeds nothing: let in (it waits its turn)
                    await other.send({"id": 5, "method": "memory.add", "params": memory("Weak", "maybe so", confidence=0.1)})
                    await weak_in.wait()
                assert actor.writes_refused == 1
            weak = await other.read()
            assert weak["id"] == 5 and weak["result"]["decision"] == "skipped"
            answers = [await writer.read() for _ in range(4)]
            assert [a["id"] for a in answers] == [0, 1, 2, 3]
            assert [a["result"]["memory"]["title"] for a in answers] == ["T0", "T1", "T2", "T3"]
            listed = await reader.result("memory.list", {})
            assert sorted(mem["title"] for mem in listed["memories"]) == ["T0", "T1", "T2", "T3"]
            assert not any("number 4" in text for texts in embedder.passage_calls() for text in texts)
            assert actor.writes_waiting == 0 and actor._fast_chars == 0
            again = await other.result("memory.add", adds[4])  # the lane is empty: never refused
            assert again["decision"] == "created" and again["memory"]["title"] == "T4"
            stats = await reader.result("sys.stats", {})
            assert stats["memory"]["writes_refused"] == 1
            for conn in (writer, other, reader):
                await conn.aclose()


async def test_without_a_bound_every_write_waits(data_dir: Path, sock_dir: Path) -> None:
    """memory_write_backlog 0: the same fifth write is let in and answered once the lane drains."""
    sock = sock_dir / "s.sock"
    embedder = CountingEmbedder()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, embedder_instance=embedder, memory_write_backlog=0) as daemon:
            actor = daemon.memory_actor
            conn = await RawConnection.open(sock)
            with held(embedder):
                await conn.send({"id": 0, "method": "memory.add", "params": memory("T0", "HOLD the first one")})
                await entered(embedder)
                actor.seconds_per_char = 1.0  # a very slow model: every write would wait far past any bound
                async with routed_count(actor, 4) as let_in:
                    for i in range(1, 5):
                        await conn.send({"id": i, "method": "memory.add", "params": memory(f"T{i}", f"memory {i}", dedup=False)})
                    await let_in.wait()
            answers = [await conn.read() for _ in range(5)]
            assert all(a["result"]["decision"] == "created" for a in answers) and actor.writes_refused == 0
            await conn.aclose()


async def test_the_conversation_embedder_takes_every_waiting_message_in_one_call(data_dir: Path, sock_dir: Path) -> None:
    """Messages appended while the background embedder's call is in flight are embedded together
    in its next call (not one call each)."""
    sock = sock_dir / "s.sock"
    embedder = CountingEmbedder()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, embedder_instance=embedder):
            conn = await RawConnection.open(sock)
            done = threading.Event()
            original = embedder._embed_batch

            def counted(texts: list[str], role: str) -> np.ndarray:
                out = original(texts, role)
                if len(embedder.passage_calls()) == 2:
                    done.set()
                return out

            embedder._embed_batch = counted  # type: ignore[method-assign]
            with held(embedder):
                await conn.result("conversation.append", {"group": "g", "messages": [
                    {"id": "m0", "role": "user", "text": "HOLD the first message", "session": "s", "timestamp": 1_800_000_000}
                ]})
                await entered(embedder)
                messages = [{"id": f"m{i}", "role": "user", "text": f"message number {i}", "session": "s",
                             "timestamp": 1_800_000_000 + i} for i in range(1, 41)]
                await conn.result("conversation.append", {"group": "g", "messages": messages})
            assert await trio.to_thread.run_sync(done.wait, IO_TIMEOUT)
            calls = embedder.passage_calls()
            assert [len(texts) for texts in calls] == [1, 40]
            await conn.aclose()


async def test_writes_arriving_together_each_count_toward_the_bound(data_dir: Path, sock_dir: Path) -> None:
    """Four writes of 0.25 s of embedding in one JSON-RPC batch, behind a held one of the same
    cost and a bound of 1 s: the first three are let in, the fourth (which would wait 1.25 s) is
    `overloaded`; the batch's answer comes once the others are stored."""
    sock = sock_dir / "s.sock"
    embedder = CountingEmbedder()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, embedder_instance=embedder, memory_write_backlog=1.0) as daemon:
            actor = daemon.memory_actor
            first, batcher = [await RawConnection.open(sock) for _ in range(2)]
            with held(embedder):
                await first.send({"id": 0, "method": "memory.add", "params": memory("T0", "HOLD: memory number 0 of five.")})
                await entered(embedder)
                actor.seconds_per_char = 1 / 128
                items = [{"jsonrpc": "2.0", "id": i, "method": "memory.add",
                          "params": memory(f"T{i}", f"a plain memory, number {i} of 5.", dedup=False)} for i in range(1, 5)]
                async with routed_count(actor, 3) as let_in:
                    await batcher.send(items)
                    await let_in.wait()
            answers = {a["id"]: a for a in await batcher.read()}
            assert [answers[i]["result"]["decision"] for i in (1, 2, 3)] == ["created"] * 3
            assert answers[4]["error"]["data"]["kind"] == "overloaded" and answers[4]["error"]["data"]["retry_after_ms"] == 1000
            assert (await first.read())["result"]["decision"] == "created"
            assert actor.writes_refused == 1 and actor._fast_chars == 0
            for conn in (first, batcher):
                await conn.aclose()
