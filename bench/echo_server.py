"""A bare trio + msgspec "ping" server on a Unix socket: the floor of any trio design.

It speaks only eurekamem's binary framing (4-byte big-endian length, then MessagePack): it decodes
each request's envelope and answers {"jsonrpc": "2.0", "id": <id>, "result": {"pong": true}}, with
one task per connection that reads, answers everything it read in one write, and reads again. No
actors, no queues, no validation of params, no statistics: whatever eurekamem costs beyond this is
the price of its design, not of trio, msgspec or the socket.

    python bench/echo_server.py SOCKET_PATH

Logs "serving on SOCKET_PATH" to stderr when ready; SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
from typing import Any

import msgspec
import trio


class Request(msgspec.Struct):
    method: str
    id: int | str | None = None
    jsonrpc: str = "2.0"
    params: msgspec.Raw = msgspec.Raw(b"")


class Pong(msgspec.Struct):
    pong: bool


class Success(msgspec.Struct):
    jsonrpc: str
    id: Any
    result: Any


_decode = msgspec.msgpack.Decoder(Request).decode
_encode_into = msgspec.msgpack.Encoder().encode_into
_PONG = Pong(True)
READ_SIZE = 64 * 1024  # as the daemon's (daemon/server.py): under glibc's mmap threshold


def answer_frames(buf: bytearray, out: bytearray) -> None:
    """Answer every whole frame in `buf` into `out` (appended); the frames answered leave `buf`."""
    pos = 0
    end = len(buf)
    while end - pos >= 4:
        size = int.from_bytes(buf[pos : pos + 4], "big")
        if end - pos - 4 < size:
            break
        request = _decode(buf[pos + 4 : pos + 4 + size])
        pos += 4 + size
        start = len(out)
        _encode_into(Success("2.0", request.id, _PONG), out, start + 4)
        out[start : start + 4] = (len(out) - start - 4).to_bytes(4, "big")
    if pos:
        del buf[:pos]


async def handle(stream: trio.SocketStream) -> None:
    buf = bytearray()
    out = bytearray()
    async with stream:
        try:
            async for data in stream:
                buf += data
                out.clear()
                answer_frames(buf, out)
                if out:
                    await stream.send_all(bytes(out))
        except (trio.BrokenResourceError, trio.ClosedResourceError, msgspec.DecodeError):
            return


async def main(path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(1024)
    listeners = [trio.SocketListener(sock)]
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(trio.serve_listeners, handle, listeners))
                print(f"serving on {path}", file=sys.stderr, flush=True)
                async for _signum in signals:
                    break
                nursery.cancel_scope.cancel()
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: echo_server.py SOCKET_PATH")
    trio.run(main, sys.argv[1])
