"""The socket server: a thin trio adapter around the sans-IO protocol.ServerConnection.

The connection's rules (framing, frame limit, in-flight count and `overloaded`, back-pressure,
batches, rate limit, half-close, per-connection order, the outbound buffer) live in
protocol/_connection.py; this module only moves bytes. Rule kept here: the reader reads, feeds
the ServerConnection, which calls dispatch for each call that may run (a dispatch may answer at
once: sys.ping, or a tier's fast path, see daemon/tier.py); answers come back to the ServerConnection
(from any actor, in any order) and are encoded into its outbound buffer; whoever delivered then
calls `flush`, which sends without blocking if the socket takes it, and otherwise hands the rest to
the connection's writer task, the only one that ever waits to write. Bytes leave in the order they
were delivered. While the ServerConnection says `reading_paused` the reader does not read. After the
client half-closes (or at shutdown) every request already received is still answered, then the
socket is closed. Only an unknown framing closes a connection on purpose.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import trio

from ..protocol import OUTBOUND_LIMIT, Call, ConnectionLimits, ServerConnection
from .primitives import monotonic_ns
from .stats import RequestStats

log = logging.getLogger("eurekamem.server")

# Bytes asked of one recv. Under glibc's mmap threshold (128 KiB) on purpose: recv(n) allocates an
# n-byte bytes object first, and from 128 KiB on each one is a fresh mmap (page faults, munmap):
# 256 KiB cost ~8.7 us a recv here against ~0.9 us at 64 KiB, whatever the bytes that came.
READ_SIZE = 64 * 1024

Limits = ConnectionLimits  # the daemon's name for them (Config → Limits → sys.hello)

# Tiers whose actor runs one connection's requests in the order they are dispatched, each seeing
# those before it: TierActor.run takes its one FIFO channel batch by batch, and its fast path runs a
# call only while the actor owes nothing (daemon/tier.py). So the connection need not hold their reads
# behind their writes (mixed pipelines stay batched). Tier 4's MemoryActor runs reads beside its
# writes' embedding: for it the connection holds (protocol/_connection.py). tests/test_ordering.py
# checks this set against the actors.
IN_ORDER_TIERS = frozenset({"episodic", "persistent", "graph", "skills"})

__all__ = ["IN_ORDER_TIERS", "Connection", "Limits", "OUTBOUND_LIMIT", "READ_SIZE"]


class Connection:
    def __init__(
        self,
        stream: trio.SocketStream,
        raw: socket.socket,
        limits: ConnectionLimits,
        dispatch: Callable[[Call, Any, int], None],
        stats: RequestStats,
        peer_uid: int | None = None,
    ) -> None:
        self.stream = stream
        self.raw = raw  # the same socket, non-blocking, for sends that need no waiting
        self.stats = stats
        self.protocol = ServerConnection(
            limits,
            dispatch,
            now=trio.current_time(),
            record=stats.record,
            on_output=self.flush,
            ordered_tiers=IN_ORDER_TIERS,
            peer_uid=peer_uid,  # the peer's uid (SO_PEERCRED): review decisions record it
        )
        self._timed = self.protocol.rate_limiter is not None  # the rate limit needs the time of each read
        self._writer_busy = False
        self._broken = False
        self._closing = False
        self._wake_writer = trio.Event()
        self._progress = trio.Event()
        self._waiting = False  # someone waits on _progress (the reader under back-pressure, or the close)
        self.read_scope = trio.CancelScope()

    def stop_reading(self) -> None:
        """Read nothing more (shutdown): answer what was received, then close."""
        self.read_scope.cancel()

    # --- called by whoever has delivered answers (actors, the reader, background tasks) ------------

    def flush(self) -> None:
        """Send what is buffered without blocking; the writer task takes over what does not fit."""
        out = self.protocol.outbound
        if out and not self._writer_busy and not self._broken:
            try:
                sent = self.raw.send(out)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._break()
                return
            if sent:
                del out[:sent]
            if out:
                self._wake_writer.set()
        if self._waiting:
            self._progress.set()

    def _break(self) -> None:
        self._broken = True
        self.protocol.connection_lost()
        self.read_scope.cancel()
        self._wake_writer.set()
        self._progress.set()

    async def _wait_progress(self) -> None:
        self._progress = trio.Event()
        self._waiting = True
        try:
            await self._progress.wait()
        finally:
            self._waiting = False

    # --- the connection's own tasks -------------------------------------------------------------

    async def serve(self) -> None:
        try:
            first = await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not first:
            return
        conn = self.protocol
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop)
            with self.read_scope:
                self._receive(first)
                if conn.framing_error:  # one error line (flushed above, or by the writer), then close
                    self._closing = True
                else:
                    await self._read_loop(len(first))
            # EOF, shutdown or a broken socket: answer what was received, then close
            conn.receive_eof()
            while not self._broken and not self._done():
                self.flush()
                if not self._broken and not self._done():
                    await self._wait_progress()
            self._closing = True
            self._wake_writer.set()

    def _done(self) -> bool:
        return self.protocol.finished and not self.protocol.outbound and not self._writer_busy

    def _receive(self, data: bytes) -> None:
        conn = self.protocol
        if self._timed:
            before = conn.rate_limited
            conn.receive_data(data, trio.current_time(), monotonic_ns())
            self.stats.rate_limited += conn.rate_limited - before
        else:  # the requests of one read share a stamp (and, on the fast path, a batch timestamp)
            conn.receive_data(data, 0.0, monotonic_ns())
        self.flush()

    async def _read_loop(self, size: int) -> None:
        # Reads on the raw socket: after a short read the client most likely waits for answers, so
        # wait for readability first instead of a recv that fails (one syscall and one scheduler
        # pass per request saved against trio's receive_some); after a full read, read on at once.
        raw = self.raw
        conn = self.protocol
        wait_readable = trio.lowlevel.wait_readable
        while True:
            while conn.reading_paused and not self._broken:
                await self._wait_progress()
            if size < READ_SIZE:
                await wait_readable(raw)
            else:
                await trio.lowlevel.checkpoint()  # a client that keeps us reading lets the others run
            while True:
                try:
                    data = raw.recv(READ_SIZE)
                    break
                except BlockingIOError:
                    await wait_readable(raw)
                except (OSError, trio.ClosedResourceError) as exc:  # reset by the peer, or closed
                    log.debug("connection read failed: %s", exc)
                    return
            if not data:
                return
            size = len(data)
            self._receive(data)

    async def _write_loop(self) -> None:
        out = self.protocol.outbound
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            while out and not self._broken:
                data = bytes(out)
                out.clear()
                self._writer_busy = True
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._break()
                finally:
                    self._writer_busy = False
                if self._waiting:
                    self._progress.set()
            if self._closing or self._broken:
                return
