"""Accepting connections: the listening socket, who may connect, and the connections open.

Rule kept here: only the daemon's own uid and `Config.allowed_uids` are served (SO_PEERCRED, read
as the kernel reports it at accept). A refused peer gets one JSON error line and the connection
closes: the contract has no "permission" kind; the closest is `invalid_request` (-32600), the
connection as a whole is not a request this daemon takes. So that a client which sends its request
before reading gets the line rather than a broken pipe, what it sends is read and dropped for up to
REFUSAL_LINGER seconds before the close (at most MAX_LINGERING such connections at once; past that
they close at once). Under socket activation the socket systemd passed is used as it is (checked
by daemon/systemd.py) and never unlinked: it is systemd's; our own socket file is removed after
serving, if it is still ours (the same inode).

Ownership: the Acceptor's set of open connections and its counters are trio's (the accept loop,
the connections' close callbacks, shutdown), read by sys.stats through `refused_peers` and the
RequestStats it counts into.
"""

from __future__ import annotations

import errno
import logging
import os
import socket as stdlib_socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from ..protocol import Call, ProtocolError, failure, frame_ndjson
from . import systemd
from .config import Config
from .errors import StartupError
from .io_layer import BulkConnection, IOLayer
from .listener import open_listener, socket_access
from .server import IN_ORDER_TIERS, Limits
from .stats import RequestStats
from .storage.journal_actor import JournalActor

log = logging.getLogger("eurekamem")

REFUSAL_LINGER = 1.0  # seconds a refused peer may still send (dropped) before the daemon closes
MAX_LINGERING = 32

Dispatch = Callable[[Call, Any, int], None]


def limits_of(config: Config) -> Limits:
    """The connection limits the configuration sets (also what sys.hello reports)."""
    return Limits(
        max_frame_bytes=config.max_frame_bytes,
        max_inflight=config.max_inflight,
        max_requests_per_second=config.max_requests_per_second,
        request_burst=config.request_burst,
    )


class Acceptor:
    """The listener, the accept loop and the connections it opened, for one Daemon's serve()."""

    def __init__(self, config: Config, limits: Limits, dispatch: Dispatch, stats: RequestStats) -> None:
        self.config = config
        self.limits = limits
        self.dispatch = dispatch
        self.stats = stats
        self.refused_peers = 0  # connections refused by the SO_PEERCRED check
        self._lingering = 0
        self.connections: set[BulkConnection] = set()
        self._connection_closed = trio.Event()  # set (and replaced) as each connection closes
        self.io_layer: IOLayer | None = None  # the layer that reads and writes every socket (start_io)
        self._listener: stdlib_socket.socket | None = None
        self._listener_stat: os.stat_result | None = None  # of our own socket file (None: systemd's socket)
        self._accepting = trio.CancelScope()

    async def open(self) -> bool:
        """Open the listener (the module's rule); True when systemd passed it."""
        self._listener, activated = await self._open_listener()
        self._listener_stat = None if activated else os.stat(self.config.socket_path)
        return activated

    def start_accepting(self, nursery: trio.Nursery) -> None:
        """Accept connections in `nursery` (the connections' own tasks run there too)."""
        assert self._listener is not None  # open() first
        nursery.start_soon(self._accept_loop, self._listener, nursery)

    def stop_accepting(self) -> None:
        """At shutdown: no new connections (those open still get their answers)."""
        self._accepting.cancel()
        if self._listener is not None:
            trio.lowlevel.notify_closing(self._listener)
            self._listener.close()

    def close(self) -> None:
        """After serving: the listener closed, and our own socket file removed if it is still ours."""
        if self._listener is not None:
            self._listener.close()
        try:
            if self._listener_stat is not None and os.stat(self.config.socket_path).st_ino == self._listener_stat.st_ino:
                os.unlink(self.config.socket_path)
        except FileNotFoundError:
            pass

    async def _open_listener(self) -> tuple[stdlib_socket.socket, bool]:
        """The socket passed by socket activation (used as is; the first if several), else our own;
        and whether it was passed."""
        try:
            passed = systemd.listen_fds()
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        if not passed:
            return await open_listener(self.config.socket_path, socket_access(self.config)), False
        listener, extra = passed[0], passed[1:]
        if extra:
            log.warning("socket activation passed %d sockets; using the first (fd %d), closing the rest", len(passed), listener.fileno())
            for sock in extra:
                sock.close()
        problem = systemd.describe_listener(listener)
        if problem:
            listener.close()
            raise StartupError(f"cannot serve on the socket passed by systemd: {problem}")
        name = listener.getsockname()
        if name and isinstance(name, str) and name != str(self.config.socket_path):
            log.info("socket activation: serving on %s (not %s)", name, self.config.socket_path)
            self.config.socket_path = Path(name)
        listener.setblocking(False)
        return listener, True

    def start_io(self, journal_actor: JournalActor, nursery: trio.Nursery, scope: trio.CancelScope) -> None:
        """The I/O layer that reads every socket, and also runs the journal's acknowledgements (its
        eventfd sits in the layer's epoll set)."""
        layer = self.io_layer = IOLayer(self.limits, self.dispatch, self.stats, ordered_tiers=IN_ORDER_TIERS, on_close=self.closed)
        assert journal_actor.ack_fd is not None  # acks="poller" (the daemon makes it so)
        layer.add_waker(journal_actor.ack_fd, journal_actor.drain_acks, journal_actor.poller_stopped)
        nursery.start_soon(self._run_io, layer, scope)

    async def _run_io(self, layer: IOLayer, scope: trio.CancelScope) -> None:
        with scope:
            await layer.run()

    async def _accept_loop(self, listener: stdlib_socket.socket, nursery: trio.Nursery) -> None:
        with self._accepting:
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        log.error("accept failed (%s); pausing", exc)
                        await trio.sleep(0.1)
                        continue
                    raise
                uid = self._peer_allowed(sock, nursery)
                if uid is None:
                    continue
                sock.setblocking(False)
                assert self.io_layer is not None  # start_io came first
                self.connections.add(self.io_layer.add(sock, uid))
                self.stats.connections_total += 1
                self.stats.connections_open += 1

    async def finish_connections(self, grace: float) -> bool:
        """At shutdown: read no more requests, and wait up to `grace` seconds for every connection
        to answer what it received and close. False when some were still open then."""
        for conn in list(self.connections):
            conn.stop_reading()
        with trio.move_on_after(grace) as waited:
            while self.connections:
                self._connection_closed = trio.Event()
                await self._connection_closed.wait()
        if waited.cancelled_caught:
            log.warning("gave up waiting for %d connections", len(self.connections))
            return False
        return True

    def _peer_allowed(self, sock: stdlib_socket.socket, nursery: trio.Nursery) -> int | None:
        """The peer's uid if it may connect; else None, after the refusal (the module's rule)."""
        try:
            pid, uid, gid = struct.unpack("3i", sock.getsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError as exc:
            log.warning("refused a connection whose peer cannot be identified: %s", exc)
            uid = pid = -1
        if uid == os.getuid() or uid in self.config.allowed_uids:
            result: int | None = uid
            return result
        self.refused_peers += 1
        log.warning("refused a connection from uid %d (pid %d): not this daemon's uid nor in allowed_uids", uid, pid)
        error = ProtocolError("invalid_request", f"uid {uid} is not allowed")
        try:
            sock.send(frame_ndjson(msgspec.json.encode(failure(None, error))), stdlib_socket.MSG_DONTWAIT | stdlib_socket.MSG_NOSIGNAL)
            sock.shutdown(stdlib_socket.SHUT_WR)
        except OSError:
            sock.close()
            return None
        if self._lingering >= MAX_LINGERING:
            sock.close()
        else:
            sock.setblocking(False)
            self._lingering += 1
            nursery.start_soon(self._drop_and_close, trio.socket.from_stdlib_socket(sock))
        return None

    async def _drop_and_close(self, sock: Any) -> None:
        try:
            with trio.move_on_after(REFUSAL_LINGER):
                dropped = 0
                while dropped < 64 * 1024:
                    data = await sock.recv(16 * 1024)
                    if not data:
                        break
                    dropped += len(data)
        except OSError as exc:  # the refused peer went away first: nothing more to tell it
            log.debug("refused peer closed early: %s", exc)
        finally:
            self._lingering -= 1
            sock.close()

    def closed(self, conn: BulkConnection) -> None:
        self.connections.discard(conn)
        self.stats.connections_open -= 1
        self._connection_closed.set()
