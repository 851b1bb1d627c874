"""One server connection's rules, sans-IO (as h11 does it): bytes in, calls out, answers in, bytes out.

No sockets, no event loop, no clock: the caller feeds the bytes it read (`receive_data`, with the
time as a number), gets the calls to run through its `dispatch` callback, hands answers back
through `deliver` (from any task, in any order, possibly from inside `dispatch`), and sends what
`outbound` holds. Rules kept here (PROTOCOL.md §2-§3):

- Framing: the first byte fixes it; an unknown one leaves one `parse_error` line in `outbound` and
  the connection is over (`framing_error`).
- Frame limit: a frame over `max_frame_bytes` is never buffered whole (the decoder skips it as it
  arrives) and is answered one `too_large` error with id null.
- Decoding: each frame becomes calls, or immediate error answers (a Rejected request) that change
  nothing; a notification's answer is never written.
- In flight: `owed` counts the answers owed (a batch is one). A frame that finds more than
  `max_inflight` owed has its requests answered `overloaded` at once; at twice that, or with more
  than OUTBOUND_LIMIT bytes unsent, `reading_paused` tells the caller to stop reading until the
  client reads, so a client that never reads cannot make the server buffer without bound.
- Batches: the answers to a batch array are written as one array once all are in (none for a
  batch of notifications).
- Rate limit: with `max_requests_per_second`, a token bucket of `burst` requests on the caller's
  clock; a request that finds it empty is answered `overloaded` at once and runs nothing.
- Half-close: after `receive_eof` every request already received is still answered; `finished`
  says when the caller may close (after sending `outbound`).
- Outbound: answers are encoded into `outbound` in the order they are delivered.
- Order: on one connection a request sees every write the connection sent before it, and no write
  it sent after it, whether the client waited for answers or not; different connections do not
  wait for each other. Kept by holding requests back (not dispatching them), by tier (METHODS'
  `tier` and `writes`): a read waits until every earlier write to its tier is answered; a write
  waits until every earlier read of its tier is answered, and behind earlier held writes to its
  tier, but not for earlier writes being run (a tier applies its writes in the order it receives
  them, so pipelined writes keep their throughput). sys.stats, sys.snapshot and sys.resume read
  every tier (they wait for every earlier write; a later write waits for them); sys.ping and
  sys.hello none, and a tier with no method that writes (tier 1: RAM only,
  its actor runs everything in arrival order) is not ordered here: those are never held. The
  elements of a batch count as sent in array order. Held requests are dispatched oldest first as
  the answers they wait for arrive (from inside `deliver`). A tier that keeps the order itself
  (`ordered_tiers`) needs no holding within the tier.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec
from msgspec import UNSET

from ._envelope import Call, Codec, Incoming, Rejected, failure, framing_error_line, success
from ._errors import ProtocolError
from ._framing import DEFAULT_MAX_FRAME_BYTES, Decoder, FrameTooLarge, decoder_for_first_byte
from .methods import METHODS

log = logging.getLogger("eurekamem.connection")

OUTBOUND_LIMIT = 4 * 1024 * 1024  # bytes of answers waiting for a slow reader before reading pauses

ALL_TIERS = "*"  # the ordering key of sys methods that read every tier
_TIERLESS = frozenset({"sys.ping", "sys.hello"})  # sys methods that read no tier's state


_WRITTEN_TIERS = frozenset(spec.tier for spec in METHODS.values() if spec.writes)


def ordering_key(name: str) -> str | None:
    """The key a method is ordered by: its tier, ALL_TIERS, or None (never held, nothing to count:
    the tierless sys methods, and tiers without a method that writes, such as tier 1)."""
    spec = METHODS[name]
    if spec.tier == "sys":
        return None if name in _TIERLESS else ALL_TIERS
    return spec.tier if spec.tier in _WRITTEN_TIERS else None


ORDERING_KEYS: dict[str, str | None] = {name: ordering_key(name) for name in METHODS}
_KEYS = sorted({key for key in ORDERING_KEYS.values() if key is not None})


class ConnectionLimits(msgspec.Struct, kw_only=True):
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_inflight: int = 1024
    max_requests_per_second: float = 0.0  # per connection; 0 = unlimited
    request_burst: int = 0  # requests a connection may send at once; 0 = one second's worth

    @property
    def burst(self) -> int:
        return self.request_burst or max(1, math.ceil(self.max_requests_per_second))


class RateLimiter:
    """A token bucket: `rate` requests per second, up to `burst` at once, on the caller's clock."""

    __slots__ = ("rate", "burst", "tokens", "updated")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0 - 1e-9:  # float time: 0.1 s at 10/s must make a whole token
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False


class Reply(Protocol):
    """Where a dispatched call's answer goes (the connection itself, or one of its batches)."""

    def deliver(self, call: Call, result: Any, stamp: int) -> None: ...

    def flush(self) -> None: ...


Dispatch = Callable[[Call, Reply, int], None]
Record = Callable[[Incoming, Any, int], None]


class _Held:
    __slots__ = ("seq", "call", "reply", "stamp", "writes")

    def __init__(self, seq: int, call: Call, reply: Reply, stamp: int, writes: bool) -> None:
        self.seq = seq
        self.call = call
        self.reply = reply
        self.stamp = stamp
        self.writes = writes


class ServerConnection:
    """The server side of one connection. `dispatch(call, reply, stamp)` runs a call; whoever runs
    it later calls `reply.deliver(call, result, stamp)` (a ProtocolError result is an error answer)
    and then `reply.flush()`, which calls `on_output`. `record(request, result, stamp)`, when
    given, hears every answer (errors answered at once included, oversized frames excepted).
    `stamp` is the caller's, passed through untouched (the daemon's read time, for latencies).

    `ordered_tiers`: tiers whose executor runs one connection's requests in the order they are
    dispatched, each seeing those before it (one FIFO queue). Their requests are not held for the
    earlier requests of their own tier once those are dispatched, only behind held ones and for
    the requests spanning tiers: that keeps mixed pipelines of such a tier batched as before."""

    def __init__(
        self,
        limits: ConnectionLimits,
        dispatch: Dispatch,
        *,
        now: float = 0.0,
        record: Record | None = None,
        on_output: Callable[[], None] | None = None,
        ordered_tiers: Iterable[str] = (),
        peer_uid: int | None = None,
    ) -> None:
        self.limits = limits
        self.peer_uid = peer_uid  # who is on the other side, as the caller knows it; dispatch reads reply.peer_uid
        self._dispatch = dispatch
        self._record = record
        self._on_output = on_output
        self._max_inflight = limits.max_inflight
        self._overloaded = f"more than {limits.max_inflight} requests in flight on this connection"
        rate = limits.max_requests_per_second
        self.rate_limiter = RateLimiter(rate, limits.burst, now) if rate > 0 else None
        self.rate_limited = 0  # requests refused by the rate limit so far
        self._decoder: Decoder | None = None
        self._codec: Codec | None = None
        self.outbound = bytearray()  # encoded answers not sent yet; the caller deletes what it sends
        self.owed = 0  # frames accepted and not yet answered (a batch counts once)
        self.eof = False
        self.framing_error = False
        self.closed = False  # framing error or connection lost: nothing more is read or written
        # ordering: dispatched and unanswered requests per key, and the held ones (module docstring)
        self._reads_out = dict.fromkeys(_KEYS, 0)
        self._writes_out = dict.fromkeys(_KEYS, 0)
        self._writes_total = 0
        self._held: dict[str, deque[_Held]] = {key: deque() for key in _KEYS}
        self._held_writes: dict[str, deque[int]] = {key: deque() for key in _KEYS}  # their seqs
        self._held_count = 0
        self._held_writes_total = 0
        self._seq = 0
        self._releasing = False
        self._ordered = frozenset(ordered_tiers)

    # --- input ----------------------------------------------------------------------------------

    @property
    def framing(self) -> str | None:
        """The framing, "ndjson" or "binary", once the first byte came; None before."""
        return None if self._decoder is None else self._decoder.framing

    def receive_data(self, data: bytes, now: float = 0.0, stamp: int = 0) -> None:
        """Bytes the client sent (any split); `now` in seconds on any steady clock (rate limit)."""
        if self.closed:
            return
        if self.eof:
            raise RuntimeError("receive_data after receive_eof")
        decoder = self._decoder
        if decoder is None:
            if not data:
                return
            decoder = decoder_for_first_byte(data[0], self.limits.max_frame_bytes)
            if decoder is None:
                self.outbound += framing_error_line(data[0])
                self.framing_error = self.closed = True
                return
            self._decoder = decoder
            self._codec = Codec(decoder.framing)
        for frame in decoder.feed(data):
            self._on_frame(frame, now, stamp)

    def receive_eof(self) -> None:
        """The client will send nothing more (half-close, or the server stops reading)."""
        self.eof = True

    def connection_lost(self) -> None:
        """The socket is gone: drop what was not sent and the requests still held (never run)."""
        self.closed = True
        self.outbound.clear()
        for queue in self._held.values():
            queue.clear()
        for seqs in self._held_writes.values():
            seqs.clear()
        self._held_count = self._held_writes_total = 0

    @property
    def reading_paused(self) -> bool:
        """Stop reading until answers are delivered or sent (back-pressure)."""
        return self.owed >= 2 * self._max_inflight or len(self.outbound) > OUTBOUND_LIMIT

    @property
    def finished(self) -> bool:
        """After receive_eof: every request received is answered (send `outbound`, then close)."""
        return self.closed or (self.eof and self.owed == 0)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished frame buffered now (never more than max_frame_bytes + 4)."""
        return 0 if self._decoder is None else self._decoder.pending_bytes

    @property
    def held(self) -> int:
        """Requests received and held back by the ordering rule, not dispatched yet."""
        return self._held_count

    def _on_frame(self, frame: bytes | FrameTooLarge, now: float, stamp: int) -> None:
        if type(frame) is FrameTooLarge:
            limit = self.limits.max_frame_bytes
            error = ProtocolError("too_large", f"frame of {frame.size} bytes is over the limit of {limit}", limit=limit)
            self._write(failure(None, error))
            return
        self.owed += 1
        incoming, is_batch = self._codec.decode(frame)  # type: ignore[union-attr,arg-type]  # a frame here is bytes (FrameTooLarge returned above)
        reply: ServerConnection | _Batch = _Batch(self, len(incoming)) if is_batch else self
        overloaded = self.owed > self._max_inflight
        limiter = self.rate_limiter
        keys = ORDERING_KEYS
        for item in incoming:
            if type(item) is Rejected:
                reply._answer_now(item, item.error, stamp)
            elif overloaded:
                reply._answer_now(item, ProtocolError("overloaded", self._overloaded), stamp)
            elif limiter is not None and not limiter.take(now):
                self.rate_limited += 1
                reply._answer_now(item, self._rate_error(), stamp)
            elif self._held_count:
                self._admit(item, reply, stamp)  # type: ignore[arg-type]  # not Rejected (answered above)
            else:  # nothing held: the checks of _admit on the counters alone, inline (the hot path)
                spec = item.spec  # type: ignore[union-attr]
                key = keys[spec.name]
                if key is not None:
                    if spec.writes:
                        if (self._reads_out[key] and key not in self._ordered) or self._reads_out[ALL_TIERS]:
                            self._hold(item, reply, stamp, key, True)  # type: ignore[arg-type]
                            continue
                        self._writes_out[key] += 1
                        self._writes_total += 1
                    elif self._writes_total and (
                        key == ALL_TIERS or (self._writes_out[key] and key not in self._ordered)
                    ):
                        self._hold(item, reply, stamp, key, False)  # type: ignore[arg-type]
                        continue
                    else:
                        self._reads_out[key] += 1
                self._dispatch(item, reply, stamp)  # type: ignore[arg-type]

    def _rate_error(self) -> ProtocolError:
        limits = self.limits
        return ProtocolError(
            "overloaded",
            f"rate limit: {limits.max_requests_per_second:g} requests/s per connection "
            f"(bursts of {limits.burst}); try again later",
            limit=limits.max_requests_per_second,
            burst=limits.burst,
        )

    # --- ordering ---------------------------------------------------------------------------------

    def _admit(self, call: Call, reply: Reply, stamp: int) -> None:
        """Dispatch `call` now, or hold it behind the earlier requests it conflicts with."""
        spec = call.spec
        key = ORDERING_KEYS[spec.name]
        if key is None:
            self._dispatch(call, reply, stamp)
            return
        if spec.writes:
            reads = self._reads_out
            mine = reads[key] and key not in self._ordered
            blocked = bool(mine or reads[ALL_TIERS] or self._held[key] or self._held[ALL_TIERS])
        elif key == ALL_TIERS:
            blocked = bool(self._writes_total or self._held_writes_total)
        else:
            blocked = bool((self._writes_out[key] and key not in self._ordered) or self._held_writes[key])
        if blocked:
            self._hold(call, reply, stamp, key, spec.writes)
        else:
            self._count(key, spec.writes)
            self._dispatch(call, reply, stamp)

    def _hold(self, call: Call, reply: Reply, stamp: int, key: str, writes: bool) -> None:
        self._seq += 1
        self._held[key].append(_Held(self._seq, call, reply, stamp, writes))
        self._held_count += 1
        if writes:
            self._held_writes[key].append(self._seq)
            self._held_writes_total += 1

    def _count(self, key: str, writes: bool) -> None:
        if writes:
            self._writes_out[key] += 1
            self._writes_total += 1
        else:
            self._reads_out[key] += 1

    def _answered(self, key: str, writes: bool) -> None:
        """A dispatched call of `key` was answered: count it off; release what waited for it."""
        if writes:
            left = self._writes_out[key] = self._writes_out[key] - 1
            self._writes_total -= 1
            if self._held_count and (left == 0 or self._writes_total == 0):
                self._release()
        else:
            left = self._reads_out[key] = self._reads_out[key] - 1
            if self._held_count and left == 0:
                self._release()

    def _releasable(self, key: str, head: _Held) -> bool:
        """May the first held request of `key` run now? (Behind it, none of its key may.)"""
        if key == ALL_TIERS:  # a read of every tier: no write before it unanswered, or held
            if self._writes_total:
                return False
            return all(not seqs or seqs[0] > head.seq for seqs in self._held_writes.values())
        if head.writes:  # no earlier read of its tier unanswered, nor an earlier sys.stats-like held
            if (self._reads_out[key] and key not in self._ordered) or self._reads_out[ALL_TIERS]:
                return False
            everything = self._held[ALL_TIERS]
            return not everything or everything[0].seq > head.seq
        return key in self._ordered or not self._writes_out[key]

    def _release(self) -> None:
        """Dispatch the held requests that may run, oldest first (re-entered from a dispatch that
        answers at once: the outer call goes on looking)."""
        if self._releasing:
            return
        self._releasing = True
        try:
            while self._held_count:
                first: tuple[int, str] | None = None
                for key, queue in self._held.items():
                    if queue and (first is None or queue[0].seq < first[0]) and self._releasable(key, queue[0]):
                        first = (queue[0].seq, key)
                if first is None:
                    return
                key = first[1]
                entry = self._held[key].popleft()
                self._held_count -= 1
                if entry.writes:
                    self._held_writes[key].popleft()
                    self._held_writes_total -= 1
                self._count(key, entry.writes)
                self._dispatch(entry.call, entry.reply, entry.stamp)
        finally:
            self._releasing = False

    # --- answers ----------------------------------------------------------------------------------

    def deliver(self, call: Call, result: Any, stamp: int) -> None:
        """The answer to a call this connection dispatched (a ProtocolError is an error answer)."""
        record = self._record
        if record is not None:
            record(call, result, stamp)
        self.owed -= 1
        request_id = call.id
        if request_id is not UNSET and not self.closed:
            if type(result) is ProtocolError or isinstance(result, ProtocolError):
                message: Any = failure(request_id, result)
            else:
                message = success(request_id, result)
            try:
                self._codec.encode_into(message, self.outbound)  # type: ignore[union-attr]
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
                self._encode_failed(request_id, exc)
        spec = call.spec
        key = ORDERING_KEYS[spec.name]
        if key is not None:
            if spec.writes:
                self._answered(key, True)
            else:  # a read: inline, the common case
                left = self._reads_out[key] = self._reads_out[key] - 1
                if self._held_count and left == 0:
                    self._release()

    def flush(self) -> None:
        """Deliveries are done for now: tell the caller there may be bytes to send."""
        if self._on_output is not None:
            self._on_output()

    def _answer_now(self, request: Incoming, error: ProtocolError, stamp: int) -> None:
        """An error answered here, without dispatching (a rejected, overloaded or rate-limited request)."""
        if self._record is not None:
            self._record(request, error, stamp)
        self.owed -= 1
        if request.id is not UNSET:
            self._write(failure(request.id, error))

    def _finish(self, message: Any) -> None:
        """A batch is complete: its array (None when all were notifications)."""
        self.owed -= 1
        if message is not None:
            self._write(message)

    def _write(self, message: Any) -> None:
        if self.closed:
            return
        try:
            self._codec.encode_into(message, self.outbound)  # type: ignore[union-attr]
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            self._encode_failed(getattr(message, "id", None), exc)

    def _encode_failed(self, request_id: Any, exc: Exception) -> None:
        if isinstance(exc, OverflowError):  # a value another program wrote (EurekaClaw's files keep any int)
            log.warning("an answer holds an integer MessagePack cannot carry: %s", exc)
            error = ProtocolError(
                "internal",
                "could not encode the answer: it holds an integer outside -2^63 .. 2^64-1 (from a file another "
                "program wrote); NDJSON framing carries it exactly",
            )
        else:
            log.exception("could not encode an answer")
            error = ProtocolError("internal", f"could not encode the answer: {exc}")
        self._codec.encode_into(failure(request_id, error), self.outbound)  # type: ignore[union-attr]


class _Batch:
    """Collects the answers to one JSON-RPC batch; the connection writes them as one array."""

    __slots__ = ("conn", "answers", "missing")

    def __init__(self, conn: ServerConnection, expected: int) -> None:
        self.conn = conn
        self.answers: list[Any] = []
        self.missing = expected

    def deliver(self, call: Call, result: Any, stamp: int) -> None:
        self._collect(call, result, stamp)
        key = ORDERING_KEYS[call.spec.name]
        if key is not None:
            self.conn._answered(key, call.spec.writes)

    def _answer_now(self, request: Incoming, error: ProtocolError, stamp: int) -> None:
        self._collect(request, error, stamp)

    def _collect(self, request: Incoming, result: Any, stamp: int) -> None:
        conn = self.conn
        if conn._record is not None:
            conn._record(request, result, stamp)
        if request.id is not UNSET:
            error = isinstance(result, ProtocolError)
            self.answers.append(failure(request.id, result) if error else success(request.id, result))
        self.missing -= 1
        if self.missing == 0:
            conn._finish(self.answers or None)

    def flush(self) -> None:
        self.conn.flush()

    @property
    def peer_uid(self) -> int | None:
        return self.conn.peer_uid
