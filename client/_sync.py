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
from typing import Any, Literal, cast, overload

from ..protocol import (
    BinaryDecoder,
    CrossRunRecord,
    EpisodicEntry,
    FrameTooLarge,
    GraphStats,
    Injection,
    Job,
    KnowledgeNode,
    Link,
    Memory,
    MemoryAddResult,
    MemoryDeleted,
    MemoryFeedbackResult,
    MemoryHit,
    MemoryPage,
    MemoryVersion,
    Promotion,
    ReviewView,
    Skill,
    SkillHit,
    SkillsInjection,
)
from . import _common as C
from ._autostart import Starter
from ._errors import ConnectionLost, EurekamemError, Timeout, error_from_wire
from ._paths import data_root, default_socket_path

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


class Client:
    """A blocking, thread-safe eurekamem client.

    path: the daemon's socket; default_socket_path() when None.
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
        self.timeout = C.bounded_timeout(timeout)
        self.starter = Starter(data_root(data_dir)) if autostart else None
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
        try:
            sock = self._connect_socket()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if self.starter is None or not self.starter.start(self.path):
                raise self._connect_error(exc) from exc
            try:
                sock = self._connect_socket()
            except OSError as again:
                raise self._connect_error(again) from again
        except OSError as exc:
            raise self._connect_error(exc) from exc
        conn = self._conn = _Conn(sock)
        return conn

    def _connect_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            sock.settimeout(None)  # blocking; our own deadlines go through poll
        except BaseException:
            sock.close()
            raise
        return sock

    def _connect_error(self, exc: OSError) -> ConnectionLost:
        hint = ""
        if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
            hint = " (is the daemon running? `eurekamem serve`)"
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        return ConnectionLost(f"cannot connect to eurekamem at {self.path}: {reason}{hint}")

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

    # --- sys ------------------------------------------------------------------------------------

    def ping(self) -> bool:
        """sys.ping: True when the daemon answers."""
        return self._run(C.op_ping())

    def hello(self) -> dict[str, Any]:
        """sys.hello: server name, version, protocol version, methods and limits."""
        return self._run(C.op_hello())

    def stats(self) -> dict[str, Any]:
        """sys.stats: counts per tier, journal, background work, requests and latencies (members may grow)."""
        return self._run(C.op_stats())

    def snapshot(self) -> dict[str, Any]:
        """sys.snapshot: write every snapshot file now; {"seq": the journal sequence it covers}."""
        return self._run(C.op_snapshot())

    def resume(self) -> dict[str, Any]:
        """sys.resume: leave read-only mode after a journal failure; ReadOnly if the disk still refuses."""
        return self._run(C.op_resume())

    # --- tier 1: episodic -----------------------------------------------------------------------

    def log_event(
        self, session_id: str, agent_role: str, content: str, metadata: dict[str, Any] | None = None
    ) -> EpisodicEntry:
        """episodic.log: append an event to a session (created on first use); the entry as stored."""
        return self._run(C.op_log_event(session_id, agent_role, content, metadata))

    def recent(self, session_id: str, n: int = 20, agent_role: str | None = None) -> list[EpisodicEntry]:
        """episodic.recent: the session's last `n` events (1 to 500; of `agent_role` only if given), oldest first."""
        return self._run(C.op_recent(session_id, n, agent_role))

    def search_events(self, session_id: str, query: str, n: int = 20) -> list[EpisodicEntry]:
        """episodic.search: the last `n` events whose content contains `query` (case-insensitive)."""
        return self._run(C.op_search_events(session_id, query, n))

    def close_session(
        self, session_id: str, domain: str | None = None, theory_state: Any = None, extract: bool = True
    ) -> str | None:
        """session.close: write the session's events to runs/<session_id>/episodic.json; the extraction job's id, or None."""
        return self._run(C.op_close_session(session_id, domain, theory_state, extract))

    # --- tier 2: persistent ---------------------------------------------------------------------

    def remember(
        self, key: str, value: Any, tags: list[str] | None = None, source_session: str = ""
    ) -> CrossRunRecord:
        """persistent.remember: store `value` (any JSON) under `key`; an existing key keeps its record_id."""
        return self._run(C.op_remember(key, value, tags, source_session))

    def recall(self, key: str) -> CrossRunRecord | None:
        """persistent.recall: the record under `key`, or None."""
        return self._run(C.op_recall(key))

    def by_tag(self, tag: str) -> list[CrossRunRecord]:
        """persistent.by_tag: the records carrying `tag`."""
        return self._run(C.op_by_tag(tag))

    def forget(self, key: str) -> bool:
        """persistent.forget: delete `key`; False when it was absent."""
        return self._run(C.op_forget(key))

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """persistent.keys: the keys starting with `prefix`, sorted (at most `limit`, default 1000)."""
        return self._run(C.op_keys(prefix, limit))

    # --- tier 3: knowledge graph ----------------------------------------------------------------

    def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> KnowledgeNode:
        """graph.add_theorem: a new node (a new node_id every call)."""
        return self._run(C.op_add_theorem(theorem_name, formal_statement, domain, session_id, tags))

    def link(self, from_id: str, to_id: str, relation: str = "uses") -> Link:
        """graph.link: a directed relation: uses, generalizes, specializes or contradicts. NotFound for an unknown id."""
        return self._run(C.op_link(from_id, to_id, relation))

    def related(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        """graph.related: nodes within `depth` hops (0 to 16), either direction, nearest first."""
        return self._run(C.op_related(node_id, depth))

    def node(self, node_id: str) -> KnowledgeNode:
        """graph.get: one node; NotFound if absent."""
        return self._run(C.op_node(node_id))

    def search_theorems(
        self, query: str = "", domain: str | None = None, tag: str | None = None, limit: int | None = None
    ) -> list[KnowledgeNode]:
        """graph.search: nodes whose name or statement contains `query` (and whose domain contains `domain`, tags hold `tag`)."""
        return self._run(C.op_search_theorems(query, domain, tag, limit))

    def graph_stats(self) -> GraphStats:
        """graph.stats: node and edge counts, and the edges per relation."""
        return self._run(C.op_graph_stats())

    def export_graph(self, format: str = "node_link") -> dict[str, Any]:
        """graph.export: {"format", "data"}: networkx node-link JSON ("node_link") or a GraphML string ("graphml")."""
        return self._run(C.op_export_graph(format))

    # --- tier 4: domain memories ----------------------------------------------------------------

    def add_memory(
        self,
        domain: str,
        category: str,
        title: str,
        content: str,
        *,
        confidence: float | None = None,
        tags: list[str] | None = None,
        source_session: str | None = None,
        dedup: bool = True,
        **extra: Any,
    ) -> MemoryAddResult:
        """memory.add: `decision` created, merged (into a near duplicate) or skipped, with the `memory`.

        `category` is one of domain_knowledge, proof_strategy, open_problems, pitfalls, fact,
        preference, skill, goal, context; `extra` passes scope ("local"/"global"), abstract, overview.
        The result reads as a dict too: r["decision"], r["memory"]["file"]."""
        return self._run(C.op_add_memory(domain, category, title, content, confidence, tags, source_session, dedup, **extra))

    def add_memories(self, items: list[dict[str, Any]]) -> list[MemoryAddResult]:
        """memory.add_many: each item is memory.add's params (a dict); one result per item, in order
        (an item that failed a check has decision "error" and `kind`)."""
        return self._run(C.op_add_memories(items))

    def get_memory(self, memory_id: str) -> Memory:
        """memory.get: one memory (archived ones too); NotFound if absent."""
        return self._run(C.op_get_memory(memory_id))

    def list_memories(
        self,
        domain: str | None = None,
        category: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        readable: bool = False,
    ) -> MemoryPage:
        """memory.list: newest first, paged (`limit` default 50); `status` "active" (default), "archived" or "any".
        `total` counts every match before paging. readable=True: `readable` holds the domain's MEMORY.md
        text as the daemon would write it now (without a domain: GLOBAL.md's)."""
        return self._run(C.op_list_memories(domain, category, status, limit, offset, readable))

    def update_memory(self, memory_id: str, **fields: Any) -> Memory:
        """memory.update: change title, content, category, confidence, tags, scope, abstract or overview."""
        return self._run(C.op_update_memory(memory_id, **fields))

    def delete_memory(self, memory_id: str, purge: bool = False) -> MemoryDeleted:
        """memory.delete: archive the memory (its file moves to _archive/), or erase it with purge=True."""
        return self._run(C.op_delete_memory(memory_id, purge))

    def search_memories(
        self, query: str, domain: str | None = None, k: int = 10, categories: list[str] | None = None, **extra: Any
    ) -> list[MemoryHit]:
        """memory.search: hybrid (dense + BM25) search, best first. Each hit's `score` is calibrated
        (0..1, comparable across queries and models: 0.5 is the relevance floor, PROTOCOL.md);
        `extra` passes mode, scope, status, min_score, min_confidence, include_global."""
        return self._run(C.op_search_memories(query, domain, k, categories, **extra))

    def inject(
        self,
        domain: str,
        k: int = 4,
        query: str | None = None,
        token_budget: int | None = None,
        *,
        group: str | None = None,
        messages: int | None = None,
        include_summary: bool | None = None,
    ) -> Injection:
        """memory.inject: EurekaClaw's <memories> block (`text`), the `ids` in it and its estimated `tokens`;
        with `group` and `messages` (and a query), also that many of the group's best raw messages (`messages`);
        `include_summary`: a conversation group's rolling summary and predicted intents ahead of the memories."""
        return self._run(C.op_inject(domain, k, query, token_budget, group, messages, include_summary))

    def promote_memory(self, memory_id: str, reason: str | None = None, by: str | None = None) -> Promotion:
        """memory.promote: ask for a local memory to become global: the request's `review_id`, its `state`
        (pending, approved or refused) and, when decided at once, the `reason`."""
        return self._run(C.op_promote(memory_id, reason, by))

    def reviews(
        self, state: str | None = None, domain: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> list[ReviewView]:
        """review.list: promotion requests, oldest first; `state` pending (the default), approved, refused or any."""
        return self._run(C.op_reviews(state, domain, limit, offset))

    def approve_review(self, review_id: str, by: str | None = None) -> ReviewView:
        """review.approve: the request's memory becomes global; the request as decided."""
        return self._run(C.op_approve(review_id, by))

    def reject_review(self, review_id: str, reason: str | None = None, by: str | None = None) -> ReviewView:
        """review.reject: the request is refused; the request as decided."""
        return self._run(C.op_reject(review_id, reason, by))

    def restore_memory(self, memory_id: str) -> Memory:
        """memory.restore: an archived memory active again, its file back from _archive/ (InvalidParams
        if it is not archived, NotFound if there is none)."""
        return self._run(C.op_restore_memory(memory_id))

    def memory_feedback(self, ids: list[str], signal: str) -> MemoryFeedbackResult:
        """memory.feedback: the injected memories `ids` were "used" (reinforces them), "ignored" or
        "wrong" (lowers their confidence; below 0.5 archives them): `updated`, `archived`."""
        return self._run(C.op_memory_feedback(ids, signal))

    def maintain(self) -> str:
        """sys.maintain: start tier 4's maintenance now; its job id (the report: stats()["memory"]["maintenance"])."""
        return self._run(C.op_maintain())

    # --- conversations, jobs ----------------------------------------------------------------------

    def append_messages(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """conversation.append: each message {"id", "role", "text", "sender"?, "timestamp"?, "session"?};
        ids already stored in the group are ignored (a resend is safe). {"appended": n, "ignored": n}."""
        return self._run(C.op_append_conversation(group, messages))

    def append_conversation(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The earlier name of append_messages."""
        return self._run(C.op_append_conversation(group, messages))

    def conversation_get(self, group: str, since: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """conversation.get: the group's messages in conversation order (the last `limit`; with
        `since`, the first `limit` at or after it)."""
        return self._run(C.op_conversation_get(group, since, limit))

    def conversation_groups(self) -> list[dict[str, Any]]:
        return self._run(C.op_conversation_groups())

    def conversation_search(
        self, group: str, query: str, k: int = 10, since: str | None = None, until: str | None = None
    ) -> list[dict[str, Any]]:
        """conversation.search: [{"message", "score", "why", "context"}], best first."""
        return self._run(C.op_conversation_search(group, query, k, since, until))

    def summary(self, group: str) -> dict[str, Any]:
        """conversation.summary: {"summary", "intents", "updated_at"} (empty until extraction has run)."""
        return self._run(C.op_summary(group))

    @overload
    def flush(self, group: str, wait: Literal[False] = False, timeout: None = None) -> str | None: ...

    @overload
    def flush(self, group: str, wait: Literal[True], timeout: float | None = None) -> Job | None: ...

    @overload
    def flush(self, group: str, wait: bool = False, *, timeout: float) -> Job | None: ...

    def flush(self, group: str, wait: bool = False, timeout: float | None = None) -> Job | str | None:
        """conversation.flush: extract the group's new messages now (a burst of flushes makes one job).

        Without `wait` (and `timeout`): the extraction job's id, or None when the group has nothing new.
        With `wait=True` or a `timeout`: the Job once it has finished (jobs.wait), or as it is after
        `timeout` seconds (default 30); None when there was nothing to extract. NotFound for a group
        that has no messages at all."""
        job_id = self._run(C.op_flush_conversation(group))
        if job_id is None or (not wait and timeout is None):
            return job_id
        return self._run(C.op_wait_job(job_id, C.FLUSH_WAIT if timeout is None else timeout))

    def flush_conversation(self, group: str) -> str | None:
        """conversation.flush: the extraction job's id, or None (flush(group) without waiting)."""
        return self._run(C.op_flush_conversation(group))

    def job(self, job_id: str) -> Job:
        """jobs.get: one job."""
        return self._run(C.op_job(job_id))

    def wait_job(self, job_id: str, timeout: float | None = None) -> Job:
        """jobs.wait: the job once it has finished, or as it is after `timeout` seconds."""
        return self._run(C.op_wait_job(job_id, timeout))

    def jobs(self, state: str | None = None, kind: str | None = None, limit: int | None = None) -> list[Job]:
        """jobs.list, newest first."""
        return self._run(C.op_jobs(state, kind, limit))

    def cancel_job(self, job_id: str) -> Job:
        return self._run(C.op_cancel_job(job_id))

    def retry_job(self, job_id: str) -> Job:
        return self._run(C.op_retry_job(job_id))

    def memory_history(self, memory_id: str) -> list[MemoryVersion]:
        """memory.history: the memory's versions, oldest first."""
        return self._run(C.op_memory_history(memory_id))

    # --- skills: EurekaClaw's skills/<name>/SKILL.md ---------------------------------------------

    def list_skills(
        self, agent_role: str | None = None, tag: str | None = None, status: str | None = None
    ) -> list[Skill]:
        """skills.list: by name; `status` "active", "draft" or "any" (the server's default: any)."""
        return self._run(C.op_list_skills(agent_role, tag, status))

    def skill(self, name: str) -> Skill:
        """skills.get; NotFound if there is no skill of that name."""
        return self._run(C.op_skill(name))

    def search_skills(self, query: str, k: int = 10, **extra: Any) -> list[SkillHit]:
        """skills.search: hits (`skill`, `score`, `why`) best first; `extra` passes status, mode."""
        return self._run(C.op_search_skills(query, k, **extra))

    def put_skill(self, name: str, body: str, **fields: Any) -> Skill:
        """skills.put: create or change a skill; a Skill field left out keeps its current value."""
        return self._run(C.op_put_skill(name, body, **fields))

    def record_skill_use(self, name: str, success: bool) -> Skill:
        """skills.record_use: one more use; success_rate moves as EurekaClaw's EMA (alpha 0.3)."""
        return self._run(C.op_record_skill_use(name, success))

    def confirm_skill(self, name: str) -> Skill:
        """skills.confirm: a draft becomes active (and injectable)."""
        return self._run(C.op_confirm_skill(name))

    def inject_skills(
        self,
        agent_role: str,
        pipeline_stage: str | None = None,
        query: str | None = None,
        k: int | None = None,
        token_budget: int | None = None,
    ) -> SkillsInjection:
        """skills.inject: the <skills> block of an agent's system prompt (`text`, `names`, `tokens`)."""
        return self._run(C.op_inject_skills(agent_role, pipeline_stage, query, k, token_budget))
