"""The socket server: one reader and one writer per connection, requests routed to the tier actors.

Rule kept here: the reader only decodes and dispatches; answers come back through `deliver` (from
any actor, in any order) onto the connection's outbound queue, and only the writer task writes to
the socket. A connection owes at most `max_inflight` answers: past that a request is answered
`overloaded` at once, and past twice that the reader stops reading until the writer catches up, so
a client that never reads cannot make the daemon buffer without bound. After the client
half-closes (or at shutdown) every request already received is still answered, then the socket is
closed. Only an unknown framing closes a connection on purpose.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import msgspec
import trio
from msgspec import UNSET

from eurekamem.protocol import (
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

from ._actors import Work, monotonic_ns
from ._stats import RequestStats

log = logging.getLogger("eurekamem.server")

READ_SIZE = 256 * 1024


class Limits(msgspec.Struct, kw_only=True):
    max_frame_bytes: int = 16 * 1024 * 1024
    max_inflight: int = 1024


class _BatchReply:
    """Collects the answers to one JSON-RPC batch and sends them as one array."""

    __slots__ = ("conn", "answers", "missing")

    def __init__(self, conn: "Connection", expected: int) -> None:
        self.conn = conn
        self.answers: list[Any] = []
        self.missing = expected

    def deliver(self, call: Call | Rejected, result: Any, started_ns: int) -> None:
        self.conn.stats.record(call, result, started_ns)
        if call.wants_reply:
            self.answers.append(_answer(call.id, result))
        self.missing -= 1
        if self.missing == 0:
            self.conn.send_message(self.answers if self.answers else None)


def _answer(request_id: Any, result: Any) -> Any:
    if isinstance(result, ProtocolError):
        return failure(request_id, result)
    return success(request_id, result)


class Connection:
    def __init__(
        self,
        stream: trio.SocketStream,
        limits: Limits,
        dispatch: Callable[[Call, Any, int], None],
        stats: RequestStats,
    ) -> None:
        self.stream = stream
        self.limits = limits
        self.dispatch = dispatch
        self.stats = stats
        self.codec: Codec | None = None
        self.owed = 0  # answers (or batches) accepted and not yet written
        self._out_send, self._out_recv = trio.open_memory_channel[Any](math.inf)
        self._progress = trio.Event()
        self.read_scope = trio.CancelScope()

    # --- called by actors (any task) ------------------------------------------------------------

    def deliver(self, call: Call | Rejected, result: Any, started_ns: int) -> None:
        self.stats.record(call, result, started_ns)
        if call.wants_reply:
            self.send_message(_answer(call.id, result))
        else:
            self.send_message(None)

    def send_message(self, message: Any) -> None:
        """Queue one answer (None: nothing to write, but the debt is paid)."""
        try:
            self._out_send.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the connection is gone; its answers have nobody to go to

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
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            return
        self.codec = Codec(decoder.framing)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop)
            with self.read_scope:
                await self._read_loop(decoder, first)
            # EOF, shutdown or a broken socket: answer what was received, then close
            while self.owed:
                self._progress = trio.Event()
                await self._progress.wait()
            self._out_send.close()

    async def _read_loop(self, decoder: Any, data: bytes) -> None:
        while data:
            for event in decoder.feed(data):
                self._on_frame(event)
            while self.owed >= 2 * self.limits.max_inflight:
                self._progress = trio.Event()
                await self._progress.wait()
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _on_frame(self, frame: bytes | FrameTooLarge) -> None:
        started = monotonic_ns()
        self.owed += 1
        if isinstance(frame, FrameTooLarge):
            error = ProtocolError(
                "too_large",
                f"frame of {frame.size} bytes is over the limit of {self.limits.max_frame_bytes}",
                limit=self.limits.max_frame_bytes,
            )
            self.send_message(failure(None, error))
            return
        incoming, is_batch = self.codec.decode(frame)
        reply: Any = _BatchReply(self, len(incoming)) if is_batch else self
        overloaded = self.owed > self.limits.max_inflight
        for item in incoming:
            if isinstance(item, Rejected):
                reply.deliver(item, item.error, started)
            elif overloaded:
                error = ProtocolError(
                    "overloaded", f"more than {self.limits.max_inflight} requests in flight on this connection"
                )
                reply.deliver(item, error, started)
            else:
                self.dispatch(item, reply, started)

    async def _write_loop(self) -> None:
        codec = self.codec
        recv = self._out_recv
        broken = False
        async for first in recv:
            messages = [first]
            while True:
                try:
                    messages.append(recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            chunks = [self._encode(codec, m) for m in messages if m is not None]
            if chunks and not broken:
                try:
                    await self.stream.send_all(b"".join(chunks))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    broken = True  # keep draining so the reader's wait for `owed` ends
                    self.read_scope.cancel()
            self.owed -= len(messages)
            self._progress.set()

    @staticmethod
    def _encode(codec: Codec, message: Any) -> bytes:
        try:
            return codec.encode(message)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            request_id = getattr(message, "id", None)
            log.exception("could not encode an answer")
            return codec.encode(failure(request_id, ProtocolError("internal", f"could not encode the answer: {exc}")))
