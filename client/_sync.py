"""The blocking client: one Unix socket, binary framing, thread-safe, pipelined.

Concurrency without a background thread (leader/follower): a caller registers a slot under its
request id, sends its frame, then waits. If nobody is reading the socket, the caller becomes the
reader (the leader): it reads, hands every reply it decodes to the slot with that id and wakes that
slot's thread, until its own reply is there; then it gives up reading and wakes one waiting thread
to take over. So an unpipelined call costs one send and one recv, and threads that call at once
share the connection, their answers arriving in any order.

A sender whose frame does not fit into the socket buffer reads while it waits for room, so a
single thread pipelining thousands of requests (call_many) cannot deadlock with a server that stops
reading while its replies are not read.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, cast

from ..protocol import (
    BinaryDecoder,
    FrameTooLarge,
)
from . import _common as C
from ._calls import Calls
from ._errors import ConnectionLost, EurekamemError, Timeout, error_from_wire
from ._paths import data_root, default_socket_path, socket_paths, unreachable

__all__ = ["Client"]

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_SEND_FLAGS = _DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)
_POLLIN = getattr(select, "POLLIN", 1)
_POLLOUT = getattr(select, "POLLOUT", 4)
_FOLLOWER_SEND_POLL = 0.05  # a blocked sender that is not the reader re-checks this often


def _poll(sock: socket.socket, events: int, timeout: float | None) -> bool:
    """Wait until the socket is ready for one of `events` (or errored); False on timeout."""
    if timeout is not None and timeout < 0:
        timeout = 0
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, events)
        return bool(poller.poll(None if timeout is None else timeout * 1000.0))
    rlist = [sock] if events & _POLLIN else []
    wlist = [sock] if events & _POLLOUT else []
    r, w, x = select.select(rlist, wlist, [sock], timeout)
    return bool(r or w or x)


class _NotSent(Exception):
    """Sending failed before any byte went out: the request can be retried on a new connection."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Slot:
    __slots__ = ("done", "reply", "error", "cond")

    def __init__(self) -> None:
        self.done = False
        self.reply: C.Reply | None = None
        self.error: str | None = None  # set when the connection died; each waiter raises its own
        self.cond: threading.Condition | None = None


class _Conn:
    __slots__ = (
        "sock",
        "decoder",
        "pending",
        "followers",
        "reading",
        "dead",
        "send_lock",
        "users",
        "pid",
        "buf",
        "view",
        "closed",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = BinaryDecoder(C.MAX_REPLY_BYTES)
        self.pending: dict[int, _Slot] = {}
        self.followers: dict[int, _Slot] = {}  # slots whose threads wait in cond.wait
        self.reading = False  # a leader is reading the socket
        self.dead: str | None = None
        self.send_lock = threading.Lock()
        self.users = 0  # calls between registering and returning; the last closes a dead socket
        self.pid = os.getpid()
        self.buf = bytearray(C.RECV_BYTES)
        self.view = memoryview(self.buf)
        self.closed = False


_clients: weakref.WeakSet[Client] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Client(Calls):
    """A blocking, thread-safe eurekamem client.

    path: the daemon's socket; default_socket_path() when None. When nothing listens there, the
        socket the daemon holding the data root recorded in its LOCK is tried (the data root:
        `data_dir`, else, with no `path`, data_root()); `path` then names the one reached.
    timeout: seconds a call may take (connecting, sending, waiting for its answer); None means
        C.DEFAULT_TIMEOUT (60 s): no call waits for ever. A call that runs out raises Timeout; the
        connection stays usable and a late answer is dropped. Calls that wait on the server's side
        (jobs.wait) get their own wait on top.
    autostart: when nothing listens on `path`, start `eurekamem serve` for `data_dir` (default
        data_root()) on it and wait for it, as gpg-agent's clients do (see _autostart; off when
        $EUREKAMEM_NO_AUTOSTART=1). The wait for a start does not count against `timeout`.

    The connection opens on first use and reopens on the next call after it broke or was closed.
    A request that could not be sent at all on a stale connection is retried once on a fresh one;
    a request that was sent when the connection broke raises ConnectionLost (it may have run).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        *,
        autostart: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = os.fspath(path) if path is not None else default_socket_path(data_dir)
        self.rule_path = self.path  # where the rules (or the caller) point: tried first, and where autostart starts
        self.root = data_root(data_dir) if data_dir is not None or path is None else None
        self.timeout = C.bounded_timeout(timeout)
        self.starter = None
        if autostart:
            from ._autostart import Starter  # here: it imports subprocess

            self.starter = Starter(data_root(data_dir))
        self._lock = threading.Lock()
        self._conn: _Conn | None = None
        self._next_id = 1
        self._encoder = C.RequestEncoder()
        _clients.add(self)

    def __repr__(self) -> str:
        state = "connected" if self._conn is not None and self._conn.dead is None else "idle"
        return f"<eurekamem.Client {self.path!r} {state}>"

    # --- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; calls in flight raise ConnectionLost. A later call reconnects."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                self._kill_locked(conn, "client closed")

    def connect(self) -> None:
        """Open the connection now instead of on first use (raises ConnectionLost if it cannot)."""
        with self._lock:
            self._connection_locked()

    def _reset_after_fork(self) -> None:
        # In a forked child the parent's socket and locks are not ours: start afresh. Closing our
        # copy of the descriptor does not disturb the parent (no shutdown()).
        self._lock = threading.Lock()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.sock.close()
            except OSError:  # closing an inherited descriptor in a forked child: nothing to recover
                conn.dead = "closed after fork"

    def _connection_locked(self) -> _Conn:
        conn = self._conn
        if conn is not None and conn.dead is None and conn.pid == os.getpid():
            return conn
        tried: list[tuple[str, BaseException]] = []
        for path in socket_paths(self.rule_path, self.root):
            try:
                sock = self._connect_socket(path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                tried.append((path, exc))
                continue
            except OSError as exc:
                raise ConnectionLost(unreachable([*tried, (path, exc)], self.root)) from exc
            self.path = path
            break
        else:
            if self.starter is None or not self.starter.start(self.rule_path):
                raise ConnectionLost(unreachable(tried, self.root)) from tried[0][1]
            try:
                sock = self._connect_socket(self.rule_path)
            except OSError as again:
                raise ConnectionLost(unreachable([(self.rule_path, again)], self.root)) from again
            self.path = self.rule_path
        conn = self._conn = _Conn(sock)
        return conn

    def _connect_socket(self, path: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(path)
            sock.settimeout(None)  # blocking; our own deadlines go through poll
        except BaseException:
            sock.close()
            raise
        return sock

    # --- killing a connection -------------------------------------------------------------------

    def _kill(self, conn: _Conn, reason: str) -> None:
        with self._lock:
            self._kill_locked(conn, reason)

    def _kill_locked(self, conn: _Conn, reason: str) -> None:
        if conn.dead is None:
            conn.dead = reason
            for slot in conn.pending.values():
                slot.done = True
                slot.error = reason
                if slot.cond is not None:
                    slot.cond.notify()
            conn.pending.clear()
            if self._conn is conn:
                self._conn = None
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
            except OSError:
                pass
        self._maybe_close_locked(conn)

    @staticmethod
    def _maybe_close_locked(conn: _Conn) -> None:
        if conn.dead is not None and conn.users == 0 and not conn.reading and not conn.closed:
            conn.closed = True
            conn.sock.close()

    # --- the core -------------------------------------------------------------------------------

    def _deadline(self, extra: float = 0.0) -> float:
        return time.monotonic() + self.timeout + extra

    def _register_locked(self, conn: _Conn, count: int) -> list[tuple[int, _Slot]]:
        first = self._next_id
        self._next_id = first + count
        out = []
        for rid in range(first, first + count):
            slot = _Slot()
            conn.pending[rid] = slot
            out.append((rid, slot))
        return out

    def _release(self, conn: _Conn, rids: Iterable[int] = ()) -> None:
        with self._lock:
            for rid in rids:
                conn.pending.pop(rid, None)
            conn.users -= 1
            self._maybe_close_locked(conn)

    def _send(self, conn: _Conn, data: bytes | bytearray, deadline: float | None) -> None:
        """Send one or more whole frames; _NotSent if nothing went out, else ConnectionLost/Timeout."""
        with conn.send_lock:
            if conn.dead is not None:
                raise _NotSent(conn.dead)
            view = memoryview(data)
            total = len(view)
            sent = 0
            while True:
                try:
                    sent += conn.sock.send(view[sent:] if sent else view, _SEND_FLAGS)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    if sent == 0:
                        raise _NotSent(exc) from exc
                    reason = f"connection to {self.path} broke while sending: {exc.strerror or exc}"
                    self._kill(conn, reason)
                    raise ConnectionLost(reason) from exc
                if sent >= total:
                    return
                try:
                    self._wait_writable(conn, deadline)
                except Timeout:
                    if sent == 0:
                        raise
                    # Half a frame is on the wire: the stream cannot be used any more.
                    self._kill(conn, "timed out while sending (the connection was dropped)")
                    raise
                if conn.dead is not None:
                    if sent == 0:
                        raise _NotSent(conn.dead)
                    raise ConnectionLost(conn.dead)

    def _wait_writable(self, conn: _Conn, deadline: float | None) -> None:
        lead = False
        with self._lock:
            if not conn.reading and conn.dead is None:
                conn.reading = lead = True
        try:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise Timeout(f"timed out after {self.timeout}s sending to {self.path}")
            if not lead:
                wait = _FOLLOWER_SEND_POLL if wait is None else min(wait, _FOLLOWER_SEND_POLL)
            _poll(conn.sock, _POLLOUT | (_POLLIN if lead else 0), wait)
            if lead:
                self._read_some(conn, block=False)
        finally:
            if lead:
                with self._lock:
                    conn.reading = False
                    self._wake_next_locked(conn)

    @staticmethod
    def _wake_next_locked(conn: _Conn) -> None:
        """With nobody reading, wake one waiting thread to become the reader."""
        if not conn.reading:
            for slot in conn.followers.values():
                slot.cond.notify()  # type: ignore[union-attr]
                break

    def _read_some(self, conn: _Conn, block: bool) -> None:
        """Read once and deliver every whole reply (only the thread with conn.reading set)."""
        try:
            n = conn.sock.recv_into(conn.buf, C.RECV_BYTES, 0 if block else _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._kill(conn, f"connection to {self.path} broke: {exc.strerror or exc}")
            return
        if n == 0:
            self._kill(conn, f"eurekamem closed the connection ({self.path})")
            return
        frames = conn.decoder.feed(conn.view[:n])
        if not frames:
            return
        replies = []
        for frame in frames:
            if isinstance(frame, FrameTooLarge):
                self._kill(conn, f"reply of {frame.size} bytes is over the client's limit")
                return
            try:
                replies.append(C.decode_reply(frame))
            except ConnectionLost as exc:
                self._kill(conn, str(exc))
                return
        orphan = None
        with self._lock:
            pending = conn.pending
            for reply in replies:
                try:
                    slot = pending.pop(reply.id, None)
                except TypeError:  # an unhashable id: not one of ours
                    slot = None
                if slot is None:
                    if reply.id is None and reply.error is not None:
                        orphan = reply.error
                    continue  # else: the answer to a call that timed out
                slot.done = True
                slot.reply = reply
                if slot.cond is not None:
                    slot.cond.notify()
            if orphan is not None:
                err = error_from_wire(orphan)
                self._kill_locked(conn, f"server could not attribute an error to a request: {err.kind}: {err}")

    def _wait(self, conn: _Conn, rid: int, slot: _Slot, deadline: float | None) -> C.Reply:
        lock = self._lock
        with lock:
            try:
                while not slot.done:
                    if not conn.reading:
                        conn.reading = True
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        conn.pending.pop(rid, None)
                        raise Timeout(f"no answer from {self.path} within {self.timeout}s")
                    if slot.cond is None:
                        slot.cond = threading.Condition(lock)
                    conn.followers[rid] = slot
                    try:
                        slot.cond.wait(remaining)
                    finally:
                        del conn.followers[rid]
                else:
                    self._wake_next_locked(conn)  # we may have been woken to lead: pass it on
                    return self._finish(slot)
            except BaseException:
                self._wake_next_locked(conn)  # timed out or interrupted: never lose the baton
                raise
        # The leader: read until our own answer is there.
        try:
            while not slot.done:
                if deadline is not None and not _poll(conn.sock, _POLLIN, deadline - time.monotonic()):
                    with lock:
                        if not slot.done:
                            conn.pending.pop(rid, None)
                            raise Timeout(f"no answer from {self.path} within {self.timeout}s")
                    break
                self._read_some(conn, block=True)
        finally:
            with lock:
                conn.reading = False
                self._wake_next_locked(conn)
                self._maybe_close_locked(conn)
        return self._finish(slot)

    @staticmethod
    def _finish(slot: _Slot) -> C.Reply:
        if slot.error is not None:
            raise ConnectionLost(slot.error)
        return slot.reply  # type: ignore[return-value]

    def _request(self, method: str, params: Any, extra_wait: float = 0.0) -> C.Reply:
        for attempt in (0, 1):
            with self._lock:
                conn = self._connection_locked()
                ((rid, slot),) = self._register_locked(conn, 1)
                conn.users += 1
            if not attempt:
                deadline = self._deadline(extra_wait)  # from here: an on-demand start has its own wait
            try:
                frame = self._encoder.frame(rid, method, params)
                self._send(conn, frame, deadline)
                return self._wait(conn, rid, slot, deadline)
            except _NotSent as exc:
                self._kill(conn, f"connection to {self.path} broke: {exc}")
                if attempt:
                    raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None
            finally:
                self._release(conn, (rid,))
        raise AssertionError("unreachable")

    def _run(self, op: C.Op[C.T]) -> C.T:
        reply = self._request(op.method, C.to_wire(op.params), op.extra_wait)
        return cast("C.T", C.outcome(reply, op.result_type, op.post))

    # --- generic calls --------------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Call `method` and return its result as plain data; raise its typed error.

        Params may be given as a dict, as keywords, or both (keywords win).
        """
        reply = self._request(method, C.make_params(params, kw))
        return C.outcome(reply)

    def call_many(self, calls: Sequence[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        """Send every call at once (pipelined), then collect the answers.

        Returns one entry per call, in order: its result, or the exception instance for its error
        (a typed EurekamemError). ConnectionLost for the whole batch is raised only when nothing
        could be sent; if the connection breaks later, the calls without an answer hold it.
        """
        calls = list(calls)
        if not calls:
            return []
        results: list[Any] = [None] * len(calls)
        for attempt in (0, 1):
            with self._lock:
                conn = self._connection_locked()
                slots = self._register_locked(conn, len(calls))
                conn.users += 1
            if not attempt:
                deadline = self._deadline()
            try:
                chunks = []
                waiting: list[tuple[int, int, _Slot]] = []
                unsent = []
                for index, ((method, params), (rid, slot)) in enumerate(zip(calls, slots)):
                    try:
                        chunks.append(self._encoder.frame(rid, method, C.make_params(params, {})))
                    except (EurekamemError, TypeError, ValueError) as exc:
                        unsent.append(rid)
                        results[index] = exc
                        continue
                    waiting.append((index, rid, slot))
                if unsent:
                    with self._lock:
                        for rid in unsent:
                            conn.pending.pop(rid, None)
                if chunks:
                    self._send(conn, b"".join(chunks), deadline)
                for index, rid, slot in waiting:
                    try:
                        results[index] = C.outcome(self._wait(conn, rid, slot, deadline))
                    except EurekamemError as exc:
                        results[index] = exc
                return results
            except _NotSent as exc:
                self._kill(conn, f"connection to {self.path} broke: {exc}")
                if attempt:
                    raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None
            except Timeout as exc:  # timed out while sending: every unanswered call gets it
                for index, _rid, slot in waiting:
                    if results[index] is None and not slot.done:
                        results[index] = Timeout(str(exc))
                    elif results[index] is None:
                        try:
                            results[index] = C.outcome(self._finish(slot))
                        except EurekamemError as err:
                            results[index] = err
                return results
            except ConnectionLost as exc:  # broke while sending
                for index, _rid, _slot in waiting:
                    if results[index] is None:
                        results[index] = ConnectionLost(str(exc))
                return results
            finally:
                self._release(conn, (rid for rid, _slot in slots))
        raise AssertionError("unreachable")

    def notify(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> None:
        """Send a notification: a request without id, which the server runs without answering."""
        payload = C.make_params(params, kw)
        for attempt in (0, 1):
            with self._lock:
                conn = self._connection_locked()
                conn.users += 1
            if not attempt:
                deadline = self._deadline()
            try:
                self._send(conn, self._encoder.frame(None, method, payload), deadline)
                return
            except _NotSent as exc:
                self._kill(conn, f"connection to {self.path} broke: {exc}")
                if attempt:
                    raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None
            finally:
                self._release(conn)
