"""Incremental frame decoders for the two framings of one connection (sans-IO, like h11).

Rule kept here: bytes go in, whole frames come out; no frame is ever held in memory beyond the
limit. A frame over the limit is reported once (FrameTooLarge) and its bytes are skipped as they
arrive, so the connection stays usable. Each byte is scanned a bounded number of times: O(bytes).

The framing is fixed by the first byte a connection sends: '{', '[' or white space choose NDJSON,
0x00 chooses 4-byte big-endian length-prefixed MessagePack, anything else is an error.
"""

from __future__ import annotations

import struct

_U32 = struct.Struct(">I")

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_NDJSON_FIRST = frozenset(b"{[ \t\r\n")


class FrameTooLarge:
    """A frame exceeded the limit; `size` is its declared size, or the bytes seen before giving up."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"FrameTooLarge({self.size})"


Event = bytes | FrameTooLarge


class NdjsonDecoder:
    """Splits a byte stream into lines; blank lines are skipped, '\\r\\n' is tolerated."""

    framing = "ndjson"

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._discarding = False  # inside an oversized line: drop bytes up to the next newline

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        start = 0
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return events
            self._discarding = False
            start = nl + 1
        buf = self._buf
        if buf:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._append_partial(data, start, events)
                return events
            if len(buf) + nl - start > self.max_frame_bytes:
                events.append(FrameTooLarge(len(buf) + nl - start))
            else:
                buf += data[start:nl]
                self._emit(bytes(buf), events)
            buf.clear()
            start = nl + 1
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if nl - start > self.max_frame_bytes:
                events.append(FrameTooLarge(nl - start))
            else:
                self._emit(data[start:nl], events)
            start = nl + 1
        if start < len(data):
            self._append_partial(data, start, events)
        return events

    def _append_partial(self, data: bytes, start: int, events: list[Event]) -> None:
        size = len(self._buf) + len(data) - start
        if size > self.max_frame_bytes:
            events.append(FrameTooLarge(size))
            self._buf.clear()
            self._discarding = True
        else:
            self._buf += data[start:]

    @staticmethod
    def _emit(line: bytes, events: list[Event]) -> None:
        if line.strip():
            events.append(line)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished frame held now (at most max_frame_bytes)."""
        return len(self._buf)


class BinaryDecoder:
    """Splits a byte stream into frames of a 4-byte big-endian length and that many bytes."""

    framing = "binary"

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized frame still to drop

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        events: list[Event] = []
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        if self._buf:  # a frame was cut: join it with the new bytes (one copy)
            self._buf += data
            data = bytes(self._buf)
            self._buf.clear()
        elif not isinstance(data, bytes):  # frames must not alias a caller's reusable buffer
            data = bytes(data)
        pos = 0
        end = len(data)
        unpack = _U32.unpack_from
        while end - pos >= 4:
            size = unpack(data, pos)[0]
            if size > self.max_frame_bytes:
                events.append(FrameTooLarge(size))
                available = end - pos - 4
                if available >= size:
                    pos += 4 + size
                    continue
                self._skip = size - available
                pos = end
                break
            stop = pos + 4 + size
            if stop > end:
                break
            events.append(data[pos + 4 : stop])
            pos = stop
        if pos < end:
            self._buf += memoryview(data)[pos:]
        return events

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


Decoder = NdjsonDecoder | BinaryDecoder


def decoder_for_first_byte(first: int, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Decoder | None:
    """The decoder that a connection's first byte selects, or None for an unknown framing."""
    if first == 0:
        return BinaryDecoder(max_frame_bytes)
    if first in _NDJSON_FIRST:
        return NdjsonDecoder(max_frame_bytes)
    return None


def frame_ndjson(payload: bytes) -> bytes:
    return payload + b"\n"


def frame_binary(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload
