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
from typing import TYPE_CHECKING, Any, cast

from ..protocol import (
    BinaryDecoder,
    FrameTooLarge,
)
from . import _common as C
from ._async_calls import AsyncCalls
from ._autostart import Starter
from ._errors import ConnectionLost, EurekamemError, Timeout, error_from_wire
from ._paths import data_root, default_socket_path, socket_paths, unreachable

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


class AsyncClient(AsyncCalls):
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
        self.rule_path = self.path  # tried first; the recorded socket next (the Client's rule, _paths.socket_paths)
        self.root = data_root(data_dir) if data_dir is not None or path is None else None
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
            stream = await self._connect_or_start(backend)
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
        """Connect (the rules' socket, then the one the data root's daemon recorded); when nothing
        listens and autostart is on, start the daemon (in a thread), then connect."""
        def what() -> str:
            return f"timed out after {self.timeout}s connecting to {self.path}"

        tried: list[tuple[str, BaseException]] = []
        for path in socket_paths(self.rule_path, self.root):
            try:
                async with backend.deadline(self.timeout, what):
                    stream = await backend.connect(path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                tried.append((path, exc))
                continue
            except OSError as exc:
                raise ConnectionLost(unreachable([*tried, (path, exc)], self.root)) from exc
            self.path = path
            return stream
        if self.starter is None or not await backend.in_thread(self.starter.start, self.rule_path):
            raise ConnectionLost(unreachable(tried, self.root)) from tried[0][1]
        try:
            async with backend.deadline(self.timeout, what):
                stream = await backend.connect(self.rule_path)
        except OSError as exc:
            raise ConnectionLost(unreachable([(self.rule_path, exc)], self.root)) from exc
        self.path = self.rule_path
        return stream

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
