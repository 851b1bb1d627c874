"""The async client, for asyncio and trio alike, without importing trio unless it already runs.

The running library is found the way sniffio finds it: trio if `trio` is already imported and
trio.lowlevel.current_task() answers, else asyncio if it has a running loop. A connection belongs
to the event loop that opened it; used from another loop, the client opens a new one.

Concurrency is leader/follower, as in the blocking client: a task registers its request id,
sends, then waits; if no task is reading, it reads (the leader) and hands each reply to the task
waiting for that id, until its own reply is there, then wakes one waiting task to take over.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, overload

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

if TYPE_CHECKING:  # both are imported only by the event loop that runs the client
    import asyncio

    import trio

__all__ = ["AsyncClient", "current_async_library"]


def current_async_library() -> str:
    """"trio" or "asyncio", whichever runs the current task (RuntimeError if neither)."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            return "asyncio"
    raise RuntimeError("eurekamem.AsyncClient needs a running asyncio or trio event loop")


# --- the two backends ---------------------------------------------------------------------------


class _AsyncioStream:
    atomic_writes = True  # StreamWriter.write() queues the whole frame at once

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def stale(self) -> bool:
        # asyncio reads eagerly, so a connection the server closed while idle is already known.
        return self.writer.is_closing() or self.reader.at_eof()

    def write(self, data: bytes | bytearray) -> None:
        # No drain(): the transport buffers, and the loop sends while this task reads the
        # answers; draining before reading could deadlock a pipeline against a busy server.
        self.writer.write(data)

    async def receive_some(self, max_bytes: int) -> bytes:
        return await self.reader.read(max_bytes)

    def close_now(self) -> None:
        try:
            self.writer.close()
        except Exception:  # the loop may be gone already
            pass

    async def aclose(self) -> None:
        self.close_now()
        try:
            await self.writer.wait_closed()
        except Exception:
            pass


class _AsyncioBackend:
    name = "asyncio"

    @staticmethod
    def token() -> Any:
        import asyncio

        return asyncio.get_running_loop()

    @staticmethod
    async def connect(path: str) -> _AsyncioStream:
        import asyncio

        reader, writer = await asyncio.open_unix_connection(path)
        return _AsyncioStream(reader, writer)

    @staticmethod
    def event() -> Any:
        import asyncio

        return asyncio.Event()

    @staticmethod
    def lock() -> Any:
        import asyncio

        return asyncio.Lock()

    @staticmethod
    def send_errors() -> tuple[type[BaseException], ...]:
        return (OSError,)

    @staticmethod
    @contextlib.asynccontextmanager
    async def deadline(seconds: float, what: Callable[[], str]) -> AsyncIterator[None]:
        import asyncio

        try:
            async with asyncio.timeout(seconds):
                yield
        except TimeoutError:
            raise Timeout(what()) from None

    @staticmethod
    async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(fn, *args)


class _TrioStream:
    atomic_writes = False

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    def stale(self) -> bool:
        return False

    async def send_all(self, data: bytes | bytearray) -> None:
        await self.stream.send_all(data)

    async def receive_some(self, max_bytes: int) -> bytes:
        return await self.stream.receive_some(max_bytes)

    def close_now(self) -> None:
        try:
            self.stream.socket.close()  # trio wakes the tasks blocked on this socket
        except Exception:
            pass

    async def aclose(self) -> None:
        self.close_now()
        try:
            await self.stream.aclose()
        except Exception:
            pass


class _TrioBackend:
    name = "trio"

    @staticmethod
    def token() -> Any:
        import trio  # already imported: we only get here when trio runs this task

        return trio.lowlevel.current_trio_token()

    @staticmethod
    async def connect(path: str) -> _TrioStream:
        import trio

        return _TrioStream(await trio.open_unix_socket(path))

    @staticmethod
    def event() -> Any:
        import trio

        return trio.Event()

    @staticmethod
    def lock() -> Any:
        import trio

        return trio.Lock()

    @staticmethod
    def send_errors() -> tuple[type[BaseException], ...]:
        import trio

        return (OSError, trio.BrokenResourceError, trio.ClosedResourceError)

    @staticmethod
    @contextlib.asynccontextmanager
    async def deadline(seconds: float, what: Callable[[], str]) -> AsyncIterator[None]:
        import trio

        try:
            with trio.fail_after(seconds):
                yield
        except trio.TooSlowError:
            raise Timeout(what()) from None

    @staticmethod
    async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
        import trio

        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


_BACKENDS: dict[str, type[_AsyncioBackend] | type[_TrioBackend]] = {"asyncio": _AsyncioBackend, "trio": _TrioBackend}


# --- connection state ---------------------------------------------------------------------------


class _NotSent(Exception):
    pass


class _Slot:
    __slots__ = ("done", "reply", "error", "event")

    def __init__(self) -> None:
        self.done = False
        self.reply: C.Reply | None = None
        self.error: str | None = None
        self.event: Any = None


class _Conn:
    __slots__ = ("stream", "backend", "token", "decoder", "pending", "followers", "reading", "dead", "send_lock", "pid")

    def __init__(self, stream: Any, backend: Any, token: Any) -> None:
        self.stream = stream
        self.backend = backend
        self.token = token
        self.decoder = BinaryDecoder(C.MAX_REPLY_BYTES)
        self.pending: dict[int, _Slot] = {}
        self.followers: dict[int, _Slot] = {}
        self.reading = False
        self.dead: str | None = None
        self.send_lock = None if stream.atomic_writes else backend.lock()
        self.pid = os.getpid()


class AsyncClient:
    """The async eurekamem client, for asyncio and trio: the Client's calls, as coroutines.

    Concurrent tasks share one connection and pipeline their requests. timeout: seconds a call may
    take (connecting, sending, waiting for its answer), None for C.DEFAULT_TIMEOUT (60 s); a call
    that runs out raises Timeout. A call that runs out or is cancelled leaves the connection usable
    (under trio, one cancelled in the middle of sending drops the connection). autostart and
    data_dir: as for Client (the start runs in a worker thread; its wait does not count against
    `timeout`).
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
        self._conn: _Conn | None = None
        self._connect_lock: Any = None
        self._connect_lock_token: Any = None
        self._next_id = 1
        self._encoder = C.RequestEncoder()

    def __repr__(self) -> str:
        state = "connected" if self._conn is not None and self._conn.dead is None else "idle"
        return f"<eurekamem.AsyncClient {self.path!r} {state}>"

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; calls in flight raise ConnectionLost. A later call reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._kill(conn, "client closed")
            try:
                same_loop = conn.token is _BACKENDS[current_async_library()].token()
            except RuntimeError:
                same_loop = False
            if same_loop:
                await conn.stream.aclose()

    close = aclose

    async def connect(self) -> None:
        """Open the connection now instead of on first use."""
        await self._connection()

    async def _connection(self) -> _Conn:
        backend = _BACKENDS[current_async_library()]
        token = backend.token()
        conn = self._conn
        if conn is not None and conn.dead is None and conn.token is token and conn.pid == os.getpid():
            if not conn.stream.stale():
                return conn
            self._kill(conn, f"eurekamem closed the connection ({self.path})")
        elif conn is not None and (conn.token is not token or conn.pid != os.getpid()):
            # Opened under another event loop (or before a fork): it cannot be used here.
            self._conn = None
            conn.dead = conn.dead or "the event loop that opened this connection is gone"
        if self._connect_lock is None or self._connect_lock_token is not token:
            self._connect_lock = backend.lock()
            self._connect_lock_token = token
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.dead is None:
                return conn
            try:
                stream = await self._connect_or_start(backend)
            except OSError as exc:
                hint = " (is the daemon running? `eurekamem serve`)" if isinstance(
                    exc, (FileNotFoundError, ConnectionRefusedError)
                ) else ""
                raise ConnectionLost(
                    f"cannot connect to eurekamem at {self.path}: {exc.strerror or exc}{hint}"
                ) from exc
            conn = self._conn = _Conn(stream, backend, token)
            return conn

    def _kill(self, conn: _Conn, reason: str) -> None:
        if conn.dead is not None:
            return
        conn.dead = reason
        for slot in conn.pending.values():
            slot.done = True
            slot.error = reason
            if slot.event is not None:
                slot.event.set()
        conn.pending.clear()
        if self._conn is conn:
            self._conn = None
        conn.stream.close_now()

    # --- the core -------------------------------------------------------------------------------

    async def _send(self, conn: _Conn, data: bytes | bytearray) -> None:
        if conn.dead is not None:
            raise _NotSent(conn.dead)
        if conn.send_lock is None:
            conn.stream.write(data)
            return
        errors = conn.backend.send_errors()
        async with conn.send_lock:
            if conn.dead is not None:
                raise _NotSent(conn.dead)
            try:
                await conn.stream.send_all(data)
            except errors as exc:
                raise _NotSent(str(exc) or type(exc).__name__) from exc
            except BaseException:
                # Cancelled half-way: part of a frame may be on the wire.
                self._kill(conn, "a call was cancelled while sending (the connection was dropped)")
                raise

    def _wake_next(self, conn: _Conn) -> None:
        if not conn.reading:
            for slot in conn.followers.values():
                slot.event.set()
                break

    async def _lead(self, conn: _Conn, slot: _Slot) -> None:
        while not slot.done:
            try:
                data = await conn.stream.receive_some(C.RECV_BYTES)
            except Exception as exc:  # cancellation is a BaseException in both libraries
                self._kill(conn, f"connection to {self.path} broke: {exc}")
                return
            if not data:
                self._kill(conn, f"eurekamem closed the connection ({self.path})")
                return
            for frame in conn.decoder.feed(data):
                if isinstance(frame, FrameTooLarge):
                    self._kill(conn, f"reply of {frame.size} bytes is over the client's limit")
                    return
                try:
                    reply = C.decode_reply(frame)
                except ConnectionLost as exc:
                    self._kill(conn, str(exc))
                    return
                try:
                    waiting = conn.pending.pop(reply.id, None)
                except TypeError:
                    waiting = None
                if waiting is None:
                    if reply.id is None and reply.error is not None:
                        err = error_from_wire(reply.error)
                        self._kill(conn, f"server could not attribute an error to a request: {err.kind}: {err}")
                        return
                    continue
                waiting.done = True
                waiting.reply = reply
                if waiting.event is not None:
                    waiting.event.set()

    async def _wait(self, conn: _Conn, rid: int, slot: _Slot) -> C.Reply:
        try:
            while not slot.done:
                if not conn.reading:
                    conn.reading = True
                    try:
                        await self._lead(conn, slot)
                    finally:
                        conn.reading = False
                        self._wake_next(conn)
                    continue
                slot.event = conn.backend.event()
                conn.followers[rid] = slot
                try:
                    await slot.event.wait()
                finally:
                    conn.followers.pop(rid, None)
                    slot.event = None
        except BaseException:
            conn.pending.pop(rid, None)
            self._wake_next(conn)  # never lose the baton
            raise
        self._wake_next(conn)
        if slot.error is not None:
            raise ConnectionLost(slot.error)
        return slot.reply  # type: ignore[return-value]

    async def _connect_or_start(self, backend: Any) -> Any:
        """Connect; when nothing listens and autostart is on, start the daemon (in a thread), then connect."""
        def what() -> str:
            return f"timed out after {self.timeout}s connecting to {self.path}"

        try:
            async with backend.deadline(self.timeout, what):
                return await backend.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError):
            if self.starter is None or not await backend.in_thread(self.starter.start, self.path):
                raise
        async with backend.deadline(self.timeout, what):
            return await backend.connect(self.path)

    @contextlib.asynccontextmanager
    async def _bounded(self, extra_wait: float = 0.0) -> AsyncIterator[None]:
        """The call's deadline, counted once connected (an on-demand start has its own wait)."""
        await self._connection()
        backend = _BACKENDS[current_async_library()]
        def what() -> str:
            return f"no answer from {self.path} within {self.timeout}s"

        async with backend.deadline(self.timeout + extra_wait, what):
            yield

    async def _request(self, method: str, params: Any, extra_wait: float = 0.0) -> C.Reply:
        async with self._bounded(extra_wait):
            return await self._request_now(method, params)

    async def _request_now(self, method: str, params: Any) -> C.Reply:
        for attempt in (0, 1):
            conn = await self._connection()
            rid = self._next_id
            self._next_id += 1
            slot = _Slot()
            conn.pending[rid] = slot
            try:
                frame = self._encoder.frame(rid, method, params)
                try:
                    await self._send(conn, frame)
                except _NotSent as exc:
                    # A single frame that failed to go out whole was never run: retry once.
                    self._kill(conn, f"connection to {self.path} broke: {exc}")
                    if attempt:
                        raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None
                    continue
                return await self._wait(conn, rid, slot)
            finally:
                conn.pending.pop(rid, None)
        raise AssertionError("unreachable")

    async def _run(self, op: C.Op[C.T]) -> C.T:
        reply = await self._request(op.method, C.to_wire(op.params), op.extra_wait)
        return cast("C.T", C.outcome(reply, op.result_type, op.post))

    # --- generic calls --------------------------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Call `method`, return its result as plain data; raise its typed error."""
        return C.outcome(await self._request(method, C.make_params(params, kw)))

    async def call_many(self, calls: Sequence[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        """Send every call at once (pipelined), then collect: results or exception instances."""
        calls = list(calls)
        if not calls:
            return []
        async with self._bounded():
            return await self._call_many_now(calls)

    async def _call_many_now(self, calls: list[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        conn = await self._connection()
        waiting: list[tuple[int, int, _Slot]] = []
        chunks = []
        for index, (method, params) in enumerate(calls):
            rid = self._next_id
            self._next_id += 1
            try:
                chunks.append(self._encoder.frame(rid, method, C.make_params(params, {})))
            except (EurekamemError, TypeError, ValueError) as exc:
                results[index] = exc
                continue
            slot = _Slot()
            conn.pending[rid] = slot
            waiting.append((index, rid, slot))
        try:
            if not waiting:
                return results
            data = b"".join(chunks)
            if conn.send_lock is None:
                await self._send(conn, data)
                await self._collect(conn, waiting, results)
            else:
                # Send while collecting, so that a large batch cannot deadlock.
                import trio

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_batch, conn, data)
                    await self._collect(conn, waiting, results)
            return results
        except _NotSent as exc:
            self._kill(conn, f"connection to {self.path} broke: {exc}")
            raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None
        finally:
            for _index, rid, _slot in waiting:
                conn.pending.pop(rid, None)

    async def _send_batch(self, conn: _Conn, data: bytes) -> None:
        try:
            await self._send(conn, data)
        except _NotSent as exc:
            self._kill(conn, f"connection to {self.path} broke while sending: {exc}")

    async def _collect(self, conn: _Conn, waiting: list[tuple[int, int, _Slot]], results: list[Any]) -> None:
        for index, rid, slot in waiting:
            try:
                results[index] = C.outcome(await self._wait(conn, rid, slot))
            except EurekamemError as exc:
                results[index] = exc

    async def notify(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> None:
        """Send a notification (no id, no answer)."""
        payload = C.make_params(params, kw)
        async with self._bounded():
            await self._notify_now(method, payload)

    async def _notify_now(self, method: str, payload: Any) -> None:
        for attempt in (0, 1):
            conn = await self._connection()
            try:
                await self._send(conn, self._encoder.frame(None, method, payload))
                return
            except _NotSent as exc:
                self._kill(conn, f"connection to {self.path} broke: {exc}")
                if attempt:
                    raise ConnectionLost(f"cannot send to eurekamem at {self.path}: {exc}") from None

    # --- sys ------------------------------------------------------------------------------------

    async def ping(self) -> bool:
        """sys.ping: True when the daemon answers."""
        return await self._run(C.op_ping())

    async def hello(self) -> dict[str, Any]:
        """sys.hello: server name, version, protocol version, methods and limits."""
        return await self._run(C.op_hello())

    async def stats(self) -> dict[str, Any]:
        """sys.stats: counts per tier, journal, background work, requests and latencies (members may grow)."""
        return await self._run(C.op_stats())

    async def snapshot(self) -> dict[str, Any]:
        """sys.snapshot: write every snapshot file now; {"seq": the journal sequence it covers}."""
        return await self._run(C.op_snapshot())

    async def resume(self) -> dict[str, Any]:
        """sys.resume: leave read-only mode after a journal failure; ReadOnly if the disk still refuses."""
        return await self._run(C.op_resume())

    # --- tier 1: episodic -----------------------------------------------------------------------

    async def log_event(
        self, session_id: str, agent_role: str, content: str, metadata: dict[str, Any] | None = None
    ) -> EpisodicEntry:
        """episodic.log: append an event to a session (created on first use); the entry as stored."""
        return await self._run(C.op_log_event(session_id, agent_role, content, metadata))

    async def recent(self, session_id: str, n: int = 20, agent_role: str | None = None) -> list[EpisodicEntry]:
        """episodic.recent: the session's last `n` events (1 to 500; of `agent_role` only if given), oldest first."""
        return await self._run(C.op_recent(session_id, n, agent_role))

    async def search_events(self, session_id: str, query: str, n: int = 20) -> list[EpisodicEntry]:
        """episodic.search: the last `n` events whose content contains `query` (case-insensitive)."""
        return await self._run(C.op_search_events(session_id, query, n))

    async def close_session(
        self, session_id: str, domain: str | None = None, theory_state: Any = None, extract: bool = True
    ) -> str | None:
        """session.close: write the session's events to runs/<session_id>/episodic.json; the extraction job's id, or None."""
        return await self._run(C.op_close_session(session_id, domain, theory_state, extract))

    # --- tier 2: persistent ---------------------------------------------------------------------

    async def remember(
        self, key: str, value: Any, tags: list[str] | None = None, source_session: str = ""
    ) -> CrossRunRecord:
        """persistent.remember: store `value` (any JSON) under `key`; an existing key keeps its record_id."""
        return await self._run(C.op_remember(key, value, tags, source_session))

    async def recall(self, key: str) -> CrossRunRecord | None:
        """persistent.recall: the record under `key`, or None."""
        return await self._run(C.op_recall(key))

    async def by_tag(self, tag: str) -> list[CrossRunRecord]:
        """persistent.by_tag: the records carrying `tag`."""
        return await self._run(C.op_by_tag(tag))

    async def forget(self, key: str) -> bool:
        """persistent.forget: delete `key`; False when it was absent."""
        return await self._run(C.op_forget(key))

    async def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """persistent.keys: the keys starting with `prefix`, sorted (at most `limit`, default 1000)."""
        return await self._run(C.op_keys(prefix, limit))

    # --- tier 3: knowledge graph ----------------------------------------------------------------

    async def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> KnowledgeNode:
        """graph.add_theorem: a new node (a new node_id every call)."""
        return await self._run(C.op_add_theorem(theorem_name, formal_statement, domain, session_id, tags))

    async def link(self, from_id: str, to_id: str, relation: str = "uses") -> Link:
        """graph.link: a directed relation: uses, generalizes, specializes or contradicts. NotFound for an unknown id."""
        return await self._run(C.op_link(from_id, to_id, relation))

    async def related(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        """graph.related: nodes within `depth` hops (0 to 16), either direction, nearest first."""
        return await self._run(C.op_related(node_id, depth))

    async def node(self, node_id: str) -> KnowledgeNode:
        """graph.get: one node; NotFound if absent."""
        return await self._run(C.op_node(node_id))

    async def search_theorems(
        self, query: str = "", domain: str | None = None, tag: str | None = None, limit: int | None = None
    ) -> list[KnowledgeNode]:
        """graph.search: nodes whose name or statement contains `query` (and whose domain contains `domain`, tags hold `tag`)."""
        return await self._run(C.op_search_theorems(query, domain, tag, limit))

    async def graph_stats(self) -> GraphStats:
        """graph.stats: node and edge counts, and the edges per relation."""
        return await self._run(C.op_graph_stats())

    async def export_graph(self, format: str = "node_link") -> dict[str, Any]:
        """graph.export: {"format", "data"}: networkx node-link JSON ("node_link") or a GraphML string ("graphml")."""
        return await self._run(C.op_export_graph(format))

    # --- tier 4: domain memories ----------------------------------------------------------------

    async def add_memory(
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
        return await self._run(C.op_add_memory(domain, category, title, content, confidence, tags, source_session, dedup, **extra))

    async def add_memories(self, items: list[dict[str, Any]]) -> list[MemoryAddResult]:
        """memory.add_many: each item is memory.add's params (a dict); one result per item, in order
        (an item that failed a check has decision "error" and `kind`)."""
        return await self._run(C.op_add_memories(items))

    async def get_memory(self, memory_id: str) -> Memory:
        """memory.get: one memory (archived ones too); NotFound if absent."""
        return await self._run(C.op_get_memory(memory_id))

    async def list_memories(
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
        return await self._run(C.op_list_memories(domain, category, status, limit, offset, readable))

    async def update_memory(self, memory_id: str, **fields: Any) -> Memory:
        """memory.update: change title, content, category, confidence, tags, scope, abstract or overview."""
        return await self._run(C.op_update_memory(memory_id, **fields))

    async def delete_memory(self, memory_id: str, purge: bool = False) -> MemoryDeleted:
        """memory.delete: archive the memory (its file moves to _archive/), or erase it with purge=True."""
        return await self._run(C.op_delete_memory(memory_id, purge))

    async def search_memories(
        self, query: str, domain: str | None = None, k: int = 10, categories: list[str] | None = None, **extra: Any
    ) -> list[MemoryHit]:
        """memory.search: hybrid (dense + BM25) search, best first. Each hit's `score` is calibrated
        (0..1, comparable across queries and models: 0.5 is the relevance floor, PROTOCOL.md);
        `extra` passes mode, scope, status, min_score, min_confidence, include_global."""
        return await self._run(C.op_search_memories(query, domain, k, categories, **extra))

    async def inject(
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
        return await self._run(C.op_inject(domain, k, query, token_budget, group, messages, include_summary))

    async def promote_memory(self, memory_id: str, reason: str | None = None, by: str | None = None) -> Promotion:
        """memory.promote: ask for a local memory to become global: the request's `review_id`, its `state`
        (pending, approved or refused) and, when decided at once, the `reason`."""
        return await self._run(C.op_promote(memory_id, reason, by))

    async def reviews(
        self, state: str | None = None, domain: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> list[ReviewView]:
        """review.list: promotion requests, oldest first; `state` pending (the default), approved, refused or any."""
        return await self._run(C.op_reviews(state, domain, limit, offset))

    async def approve_review(self, review_id: str, by: str | None = None) -> ReviewView:
        """review.approve: the request's memory becomes global; the request as decided."""
        return await self._run(C.op_approve(review_id, by))

    async def reject_review(self, review_id: str, reason: str | None = None, by: str | None = None) -> ReviewView:
        """review.reject: the request is refused; the request as decided."""
        return await self._run(C.op_reject(review_id, reason, by))

    async def restore_memory(self, memory_id: str) -> Memory:
        """memory.restore: an archived memory active again, its file back from _archive/ (InvalidParams
        if it is not archived, NotFound if there is none)."""
        return await self._run(C.op_restore_memory(memory_id))

    async def memory_feedback(self, ids: list[str], signal: str) -> MemoryFeedbackResult:
        """memory.feedback: the injected memories `ids` were "used" (reinforces them), "ignored" or
        "wrong" (lowers their confidence; below 0.5 archives them): `updated`, `archived`."""
        return await self._run(C.op_memory_feedback(ids, signal))

    async def maintain(self) -> str:
        """sys.maintain: start tier 4's maintenance now; its job id (the report: stats()["memory"]["maintenance"])."""
        return await self._run(C.op_maintain())

    # --- conversations, jobs ----------------------------------------------------------------------

    async def append_messages(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """conversation.append: each message {"id", "role", "text", "sender"?, "timestamp"?, "session"?};
        ids already stored in the group are ignored (a resend is safe). {"appended": n, "ignored": n}."""
        return await self._run(C.op_append_conversation(group, messages))

    async def append_conversation(self, group: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The earlier name of append_messages."""
        return await self._run(C.op_append_conversation(group, messages))

    async def conversation_get(self, group: str, since: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """conversation.get: the group's messages in conversation order (the last `limit`; with
        `since`, the first `limit` at or after it)."""
        return await self._run(C.op_conversation_get(group, since, limit))

    async def conversation_groups(self) -> list[dict[str, Any]]:
        return await self._run(C.op_conversation_groups())

    async def conversation_search(
        self, group: str, query: str, k: int = 10, since: str | None = None, until: str | None = None
    ) -> list[dict[str, Any]]:
        """conversation.search: [{"message", "score", "why", "context"}], best first."""
        return await self._run(C.op_conversation_search(group, query, k, since, until))

    async def summary(self, group: str) -> dict[str, Any]:
        """conversation.summary: {"summary", "intents", "updated_at"} (empty until extraction has run)."""
        return await self._run(C.op_summary(group))

    @overload
    async def flush(self, group: str, wait: Literal[False] = False, timeout: None = None) -> str | None: ...

    @overload
    async def flush(self, group: str, wait: Literal[True], timeout: float | None = None) -> Job | None: ...

    @overload
    async def flush(self, group: str, wait: bool = False, *, timeout: float) -> Job | None: ...

    async def flush(self, group: str, wait: bool = False, timeout: float | None = None) -> Job | str | None:
        """conversation.flush: extract the group's new messages now (a burst of flushes makes one job).

        Without `wait` (and `timeout`): the extraction job's id, or None when the group has nothing new.
        With `wait=True` or a `timeout`: the Job once it has finished (jobs.wait), or as it is after
        `timeout` seconds (default 30); None when there was nothing to extract. NotFound for a group
        that has no messages at all."""
        job_id = await self._run(C.op_flush_conversation(group))
        if job_id is None or (not wait and timeout is None):
            return job_id
        return await self._run(C.op_wait_job(job_id, C.FLUSH_WAIT if timeout is None else timeout))

    async def flush_conversation(self, group: str) -> str | None:
        """conversation.flush: the extraction job's id, or None (flush(group) without waiting)."""
        return await self._run(C.op_flush_conversation(group))

    async def job(self, job_id: str) -> Job:
        """jobs.get: one job."""
        return await self._run(C.op_job(job_id))

    async def wait_job(self, job_id: str, timeout: float | None = None) -> Job:
        """jobs.wait: the job once it has finished, or as it is after `timeout` seconds."""
        return await self._run(C.op_wait_job(job_id, timeout))

    async def jobs(
        self, state: str | None = None, kind: str | None = None, limit: int | None = None
    ) -> list[Job]:
        """jobs.list, newest first."""
        return await self._run(C.op_jobs(state, kind, limit))

    async def cancel_job(self, job_id: str) -> Job:
        return await self._run(C.op_cancel_job(job_id))

    async def retry_job(self, job_id: str) -> Job:
        return await self._run(C.op_retry_job(job_id))

    async def memory_history(self, memory_id: str) -> list[MemoryVersion]:
        """memory.history: the memory's versions, oldest first."""
        return await self._run(C.op_memory_history(memory_id))

    # --- skills: EurekaClaw's skills/<name>/SKILL.md ---------------------------------------------

    async def list_skills(
        self, agent_role: str | None = None, tag: str | None = None, status: str | None = None
    ) -> list[Skill]:
        """skills.list: by name; `status` "active", "draft" or "any" (the server's default: any)."""
        return await self._run(C.op_list_skills(agent_role, tag, status))

    async def skill(self, name: str) -> Skill:
        """skills.get; NotFound if there is no skill of that name."""
        return await self._run(C.op_skill(name))

    async def search_skills(self, query: str, k: int = 10, **extra: Any) -> list[SkillHit]:
        """skills.search: hits (`skill`, `score`, `why`) best first; `extra` passes status, mode."""
        return await self._run(C.op_search_skills(query, k, **extra))

    async def put_skill(self, name: str, body: str, **fields: Any) -> Skill:
        """skills.put: create or change a skill; a Skill field left out keeps its current value."""
        return await self._run(C.op_put_skill(name, body, **fields))

    async def record_skill_use(self, name: str, success: bool) -> Skill:
        """skills.record_use: one more use; success_rate moves as EurekaClaw's EMA (alpha 0.3)."""
        return await self._run(C.op_record_skill_use(name, success))

    async def confirm_skill(self, name: str) -> Skill:
        """skills.confirm: a draft becomes active (and injectable)."""
        return await self._run(C.op_confirm_skill(name))

    async def inject_skills(
        self,
        agent_role: str,
        pipeline_stage: str | None = None,
        query: str | None = None,
        k: int | None = None,
        token_budget: int | None = None,
    ) -> SkillsInjection:
        """skills.inject: the <skills> block of an agent's system prompt (`text`, `names`, `tokens`)."""
        return await self._run(C.op_inject_skills(agent_role, pipeline_stage, query, k, token_budget))
