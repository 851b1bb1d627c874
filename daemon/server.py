"""The socket server: one reader per connection, answers written as soon as they exist.

Rule kept here: the reader decodes and dispatches (a dispatch may answer at once: sys.ping, or a
tier's fast path, see daemon/tier.py); answers come back through `deliver` (from any actor, in any order) and are encoded into the connection's outbound buffer; whoever delivered
then calls `flush`, which sends without blocking if the socket takes it, and otherwise hands the
rest to the connection's writer task, the only one that ever waits to write. Bytes leave in the
order they were delivered. A connection owes at most `max_inflight` answers: past that a request is
answered `overloaded` at once, and past twice that (or with more than OUTBOUND_LIMIT bytes waiting)
the reader stops reading until the client reads, so a client that never reads cannot make the
daemon buffer without bound. With a request rate limit (`max_requests_per_second`, 0 = none), each
connection has a token bucket on trio's clock holding up to `request_burst` requests: a request
that finds it empty is answered `overloaded` at once and runs nothing. After the client half-closes (or at shutdown) every request already
received is still answered, then the socket is closed. Only an unknown framing closes a connection
on purpose.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from typing import Any

import msgspec
import trio
from eurekamem.daemon.primitives import monotonic_ns
from eurekamem.daemon.stats import RequestStats
from eurekamem.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    Call,
    Codec,
    FrameTooLarge,
    ProtocolError,
    Rejected,
    decoder_for_first_byte,
    failure,
    framing_error_line,
    success,
)
from msgspec import UNSET

log = logging.getLogger("eurekamem.server")


READ_SIZE = 256 * 1024


class Limits(msgspec.Struct, kw_only=True):
    """A connection's limits; these defaults are the daemon's (daemon/config.py's Config reads them)."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_inflight: int = 1024
    max_requests_per_second: float = 0.0  # per connection; 0 = unlimited
    request_burst: int = 0  # requests a connection may send at once; 0 = one second's worth

    @property
    def burst(self) -> int:
        return self.request_burst or max(1, math.ceil(self.max_requests_per_second))


class RateLimiter:
    """A token bucket: `rate` requests per second, up to `burst` at once, on trio's clock."""

    __slots__ = ("rate", "burst", "tokens", "updated")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = trio.current_time()

    def take(self) -> bool:
        now = trio.current_time()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0 - 1e-9:  # float time: 0.1 s at 10/s must make a whole token
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False


class _BatchReply:
    """Collects the answers to one JSON-RPC batch and sends them as one array."""

    __slots__ = ("conn", "answers", "missing")

    def __init__(self, conn: Connection, expected: int) -> None:
        self.conn = conn
        self.answers: list[Any] = []
        self.missing = expected

    def deliver(self, call: Call | Rejected, result: Any, started_ns: int) -> None:
        self.conn.stats.record(call, result, started_ns)
        if call.wants_reply:
            self.answers.append(_answer(call.id, result))
        self.missing -= 1
        if self.missing == 0:
            self.conn.answer(self.answers if self.answers else None)

    def flush(self) -> None:
        self.conn.flush()


def _answer(request_id: Any, result: Any) -> Any:
    if isinstance(result, ProtocolError):
        return failure(request_id, result)
    return success(request_id, result)


OUTBOUND_LIMIT = 4 * 1024 * 1024  # bytes of answers waiting for a slow reader before we stop reading


class Connection:
    def __init__(
        self,
        stream: trio.SocketStream,
        raw: socket.socket,
        limits: Limits,
        dispatch: Callable[[Call, Any, int], None],
        stats: RequestStats,
    ) -> None:
        self.stream = stream
        self.raw = raw  # the same socket, non-blocking, for sends that need no waiting
        self.limits = limits
        self.dispatch = dispatch
        self.stats = stats
        self.codec: Codec | None = None
        self.owed = 0  # requests (or batches) accepted and not yet answered
        self._out = bytearray()
        self._writer_busy = False
        self._broken = False
        self._closing = False
        self._wake_writer = trio.Event()
        self._progress = trio.Event()
        self.read_scope = trio.CancelScope()
        rate = limits.max_requests_per_second
        self.rate_limiter = RateLimiter(rate, limits.burst) if rate > 0 else None

    # --- called by whoever has an answer (actors, the reader, background tasks) --------------------

    def deliver(self, call: Call | Rejected, result: Any, started_ns: int) -> None:
        self.stats.record(call, result, started_ns)
        request_id = call.id
        if request_id is UNSET:  # a notification: nothing to write
            self.answer(None)
        elif type(result) is ProtocolError or isinstance(result, ProtocolError):
            self.answer(failure(request_id, result))
        else:
            self.answer(success(request_id, result))

    def answer(self, message: Any) -> None:
        """Encode one answer (None: a notification's, nothing to write) into the outbound buffer."""
        self.owed -= 1
        if message is not None and not self._broken:
            try:
                self.codec.encode_into(message, self._out)
            except (TypeError, ValueError, msgspec.EncodeError):
                self._out += self._encode(self.codec, message)  # logs it and answers `internal` instead
        if self.owed == 0:
            self._progress.set()

    def flush(self) -> None:
        """Send what is buffered without blocking; the writer task takes over what does not fit."""
        if not self._out or self._writer_busy or self._broken:
            return
        try:
            sent = self.raw.send(self._out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._break()
            return
        if sent:
            del self._out[:sent]
        if self._out:
            self._wake_writer.set()
        else:
            self._progress.set()

    def _break(self) -> None:
        self._broken = True
        self._out.clear()
        self.read_scope.cancel()
        self._wake_writer.set()
        self._progress.set()

    # --- the connection's own tasks -------------------------------------------------------------

    async def serve(self) -> None:
        try:
            first = await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not first:
            return
        decoder = decoder_for_first_byte(first[0], self.limits.max_frame_bytes)
        if decoder is None:
            try:
                await self.stream.send_all(framing_error_line(first[0]))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("peer with an unknown framing left before its error line: %s", exc)
            return
        self.codec = Codec(decoder.framing)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop)
            with self.read_scope:
                await self._read_loop(decoder, first)
            # EOF, shutdown or a broken socket: answer what was received, then close
            while (self.owed or self._out or self._writer_busy) and not self._broken:
                self._progress = trio.Event()
                self.flush()
                if self.owed or self._out or self._writer_busy:
                    await self._progress.wait()
            self._closing = True
            self._wake_writer.set()

    async def _read_loop(self, decoder: Any, data: bytes) -> None:
        # Reads on the raw socket: after a short read the client most likely waits for answers, so
        # wait for readability first instead of a recv that fails (one syscall and one scheduler
        # pass per request saved against trio's receive_some); after a full read, read on at once.
        raw = self.raw
        wait_readable = trio.lowlevel.wait_readable
        while data:
            started = monotonic_ns()  # the requests of one read share it (and, on the fast path, a batch timestamp)
            for event in decoder.feed(data):
                self._on_frame(event, started)
            self.flush()
            while (self.owed >= 2 * self.limits.max_inflight or len(self._out) > OUTBOUND_LIMIT) and not self._broken:
                self._progress = trio.Event()
                await self._progress.wait()
            if len(data) < READ_SIZE:
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

    def _on_frame(self, frame: bytes | FrameTooLarge, started: int) -> None:
        self.owed += 1
        if isinstance(frame, FrameTooLarge):
            error = ProtocolError(
                "too_large",
                f"frame of {frame.size} bytes is over the limit of {self.limits.max_frame_bytes}",
                limit=self.limits.max_frame_bytes,
            )
            self.answer(failure(None, error))
            return
        incoming, is_batch = self.codec.decode(frame)
        reply: Any = _BatchReply(self, len(incoming)) if is_batch else self
        overloaded = self.owed > self.limits.max_inflight
        for item in incoming:
            if type(item) is Rejected:
                reply.deliver(item, item.error, started)
            elif overloaded:
                error = ProtocolError(
                    "overloaded", f"more than {self.limits.max_inflight} requests in flight on this connection"
                )
                reply.deliver(item, error, started)
            elif self.rate_limiter is not None and not self.rate_limiter.take():
                self.stats.rate_limited += 1
                reply.deliver(item, self._rate_error(), started)
            else:
                self.dispatch(item, reply, started)

    def _rate_error(self) -> ProtocolError:
        limits = self.limits
        return ProtocolError(
            "overloaded",
            f"rate limit: {limits.max_requests_per_second:g} requests/s per connection "
            f"(bursts of {limits.burst}); try again later",
            limit=limits.max_requests_per_second,
            burst=limits.burst,
        )

    async def _write_loop(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            while self._out and not self._broken:
                data = bytes(self._out)
                self._out.clear()
                self._writer_busy = True
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._break()
                finally:
                    self._writer_busy = False
                self._progress.set()
            if self._closing or self._broken:
                return

    @staticmethod
    def _encode(codec: Codec, message: Any) -> bytes:
        try:
            return codec.encode(message)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            request_id = getattr(message, "id", None)
            log.exception("could not encode an answer")
            return codec.encode(failure(request_id, ProtocolError("internal", f"could not encode the answer: {exc}")))


