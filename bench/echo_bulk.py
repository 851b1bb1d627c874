"""The bulk-reading echo anchor: bench/echo_server.py's "ping" server with daemon/io_layer.py's I/O design.

One trio task owns an epoll set holding every client socket; each pass takes all ready events
at once, reads each ready socket once, decodes every whole frame (binary framing: 4-byte big-endian
length, then MessagePack), and answers all of them with one non-blocking send per socket; what a
socket does not take waits for EPOLLOUT (reading it stops meanwhile). One trio wake-up per pass, like
the daemon's `io = "bulk"`, and the same looks after a pass (for up to 50 µs when nothing is ready). No actors, no validation, no statistics: the floor of that design.

    python bench/echo_bulk.py SOCKET_PATH

Logs "serving on SOCKET_PATH" to stderr when ready; SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

import msgspec
import trio
from echo_server import READ_SIZE, answer_frames

SPIN_NS = 50_000  # daemon/io_layer.py's: how long a look after a pass goes on looking

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT


class _Conn:
    __slots__ = ("buf", "out", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.out = bytearray()


def _answer(conn: _Conn, data: bytes) -> None:
    conn.buf += data
    answer_frames(conn.buf, conn.out)


async def serve(listener: socket.socket) -> None:
    epoll = select.epoll()
    conns: dict[int, _Conn] = {}
    lfd = listener.fileno()
    epoll.register(lfd, _IN)

    def close(fd: int) -> None:
        conn = conns.pop(fd)
        epoll.unregister(fd)
        conn.sock.close()

    try:
        while True:
            await trio.lowlevel.wait_readable(epoll.fileno())
            events = epoll.poll(0, 1024)
            while events:
                for fd, _mask in events:
                    if fd == lfd:
                        try:
                            sock, _ = listener.accept()
                        except BlockingIOError:
                            continue
                        sock.setblocking(False)
                        conns[sock.fileno()] = _Conn(sock)
                        epoll.register(sock.fileno(), _IN)
                        continue
                    conn = conns.get(fd)
                    if conn is None:
                        continue
                    try:
                        if conn.out:  # writable again
                            sent = conn.sock.send(conn.out)
                            del conn.out[:sent]
                            if not conn.out:
                                epoll.modify(fd, _IN)
                            continue
                        data = conn.sock.recv(READ_SIZE)
                        if not data:
                            close(fd)
                            continue
                        _answer(conn, data)
                        if conn.out:
                            try:
                                sent = conn.sock.send(conn.out)
                            except BlockingIOError:
                                sent = 0
                            del conn.out[:sent]
                            if conn.out:
                                epoll.modify(fd, _OUT)
                    except (OSError, msgspec.DecodeError):
                        close(fd)
                await trio.lowlevel.checkpoint()  # as daemon/io_layer.py: yield, then look again before waiting,
                events = epoll.poll(0, 1024)
                until = time.monotonic_ns() + SPIN_NS  # and go on looking for a while when nothing is ready
                while not events and time.monotonic_ns() < until:
                    await trio.lowlevel.checkpoint()
                    events = epoll.poll(0, 1024)
    finally:
        for fd in list(conns):
            close(fd)
        epoll.close()


async def main(path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    listener.setblocking(False)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve, listener)
                print(f"serving on {path}", file=sys.stderr, flush=True)
                async for _signum in signals:
                    break
                nursery.cancel_scope.cancel()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: echo_bulk.py SOCKET_PATH")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    trio.run(main, sys.argv[1])
