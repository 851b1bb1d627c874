"""The bulk I/O layer: one pass reads every ready socket, and every reply of a pass is written in it.

Rule kept here: one trio task (IOLayer.run) owns one epoll set holding every client socket, and is
the only code that reads them. Each pass takes all ready events at once (`epoll.poll(0)`), reads
each ready socket once, feeds the bytes to that connection's sans-IO ServerConnection
(protocol/_connection.py keeps every protocol rule: framing, limits, in-flight bound and
`overloaded`, rate limit, batches, half-close, per-connection order), and the calls it decodes are
dispatched inside the pass (reads on an actor's fast path are answered there and then); each
connection's answers are sent once per pass, without blocking. So a pass costs one trio wake-up
for however many connections and requests it serves, not one task switch per socket and request.
After a pass the task lets the actors run and looks again before it waits in the kernel; when
nothing is ready yet it goes on looking, other tasks running between looks, for up to SPIN_NS
(50 µs): a client that sends its next request when it has its answer (one at a time, or a
pipeline refilled) is served from that look instead of from a wake-up, which costs this machine's
kernel and hypervisor more than the looks (bench/README.md, "Waking up"). While the looks find
nothing (`_repoll`: under one in REPOLL_MIN_HITS of a window) the task waits at once instead, so
an idle or sparsely used daemon does not spin.

The two directions, each with one hand-off, all on trio's thread (no state crosses a thread):
- In: the kernel -> epoll readiness -> this task -> `ServerConnection.receive_data` -> dispatch.
  A connection whose ServerConnection says `reading_paused` is taken out of the read set
  (EPOLLIN off) until answers are delivered or sent; after EOF (half-close, or shutdown's
  `stop_reading`) it is never read again.
- Out: whoever delivered answers (an actor after its batch, or the pass itself) calls
  `BulkConnection.flush`, which sends what the socket takes at once (non-blocking). What it does
  not take (EAGAIN, a slow reader) stays in the ServerConnection's outbound buffer and the
  connection is put in the write set (EPOLLOUT): from then on only the pass writes it, when epoll
  says it is writable, so bytes leave in the order they were delivered. The buffer's size is what
  `reading_paused` looks at, so a client that never reads stops being read.
A connection closes when its ServerConnection is `finished` and its buffer is sent, or when the
peer is gone (a failed send or read: what was held is dropped, answers still owed find it closed).
Other fds may join the epoll set (`add_waker`): the journal actor's eventfd of acknowledgements
(daemon/storage/journal_actor.py, acks="poller"), so the pass that reads the sockets also runs the
journal's completions (one wake-up for both); their `on_stop` is called when the pass loop ends.
"""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Callable
from typing import Any

import trio

from ..protocol import Call, ConnectionLimits, ServerConnection
from .primitives import monotonic_ns
from .server import READ_SIZE
from .stats import RequestStats

log = logging.getLogger("eurekamem.io")

MAX_EVENTS = 1024  # events taken per pass at most (the rest are taken by the next pass)
REPOLL_WINDOW = 64  # looks again after a pass, counted together (IOLayer._repoll)
REPOLL_MIN_HITS = 8  # under one in this many finding work: stop looking again for a while
REPOLL_SKIP = 512  # passes that wait at once after such a window
SPIN_NS = 50_000  # how long a look after a pass goes on looking before the loop waits in the kernel

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_GONE = select.EPOLLHUP | select.EPOLLERR


class BulkConnection:
    """One client socket under the I/O layer: its ServerConnection and what epoll watches for it."""

    __slots__ = ("_timed", "fd", "layer", "mask", "open", "protocol", "reading", "sock", "writing")

    def __init__(self, layer: IOLayer, sock: socket.socket, peer_uid: int | None = None) -> None:
        self.layer = layer
        self.sock = sock
        self.fd = sock.fileno()
        self.protocol = protocol = ServerConnection(
            layer.limits,
            layer.dispatch,
            now=trio.current_time(),
            record=layer.stats.record,
            on_output=self.flush,
            ordered_tiers=layer.ordered_tiers,
            peer_uid=peer_uid,  # the peer's uid (SO_PEERCRED): review decisions record it
        )
        self.reading = True  # in the read set (EPOLLIN): not paused, no EOF yet
        self.writing = False  # the socket refused bytes: the pass writes it when it is writable
        self.mask = _IN  # what epoll watches now
        self.open = True
        self._timed = protocol.rate_limiter is not None  # the rate limit needs the time of each read

    def flush(self) -> None:
        """Answers were delivered: send what the socket takes now; update what epoll watches."""
        if not self.open:
            return
        protocol = self.protocol
        out = protocol.outbound
        if not out:
            if self.mask == _IN and not (protocol.eof or protocol.closed or protocol.reading_paused):
                return  # read, do not write: what _settle would find again (the hot path after a read)
        elif not self.writing:
            try:
                sent = self.sock.send(out)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                log.debug("connection send failed: %s", exc)
                self.layer._lost(self)
                return
            if sent:
                del out[:sent]
            if out:
                self.writing = True
        self.layer._settle(self)

    def stop_reading(self) -> None:
        """Read nothing more (shutdown): answer what was received, then close."""
        if self.open and not self.protocol.eof:
            self.protocol.receive_eof()
            self.reading = False
            self.layer._settle(self)


class IOLayer:
    """All bulk connections of a daemon, and the task that reads and writes them (module docstring).

    `dispatch` runs a call (ServerConnection's callback); `on_close(conn)` hears each connection
    that closed; `ordered_tiers` goes to every ServerConnection."""

    def __init__(
        self,
        limits: ConnectionLimits,
        dispatch: Callable[[Call, Any, int], None],
        stats: RequestStats,
        *,
        ordered_tiers: frozenset[str] = frozenset(),
        on_close: Callable[[BulkConnection], None] | None = None,
    ) -> None:
        self.limits = limits
        self.dispatch = dispatch
        self.stats = stats
        self.ordered_tiers = ordered_tiers
        self.on_close = on_close
        self._epoll = select.epoll()
        self._by_fd: dict[int, BulkConnection] = {}
        self._wakers: dict[int, tuple[Callable[[], None], Callable[[], None]]] = {}  # fd -> (on_ready, on_stop)
        self.passes = 0  # passes that found something to do
        self._repolls_left = REPOLL_WINDOW  # looks after a pass left in this window (_repoll)
        self._repoll_hits = 0  # of this window's, those that found a socket ready
        self._skip_repolls = 0  # passes left that wait at once (the last window found too little)
        self.events = 0  # ready sockets those passes handled
        self.spins = 0  # looks after a pass that went on looking (_spin)
        self.spin_hits = 0  # of those, the ones that found something before SPIN_NS

    def __len__(self) -> int:
        return len(self._by_fd)

    @property
    def connections(self) -> list[BulkConnection]:
        return list(self._by_fd.values())

    def add(self, sock: socket.socket, peer_uid: int | None = None) -> BulkConnection:
        """Serve an accepted socket (non-blocking from here on); it is read from the next pass."""
        sock.setblocking(False)
        conn = BulkConnection(self, sock, peer_uid)
        self._by_fd[conn.fd] = conn
        self._epoll.register(conn.fd, _IN)
        return conn

    def add_waker(self, fd: int, on_ready: Callable[[], None], on_stop: Callable[[], None]) -> None:
        """Watch `fd` too: a pass that finds it readable calls on_ready (which must make it unreadable);
        on_stop when the pass loop ends (from then on nobody here watches it)."""
        self._wakers[fd] = (on_ready, on_stop)
        self._epoll.register(fd, _IN)

    async def run(self) -> None:
        """The passes, until cancelled; then every connection still open is closed."""
        epoll = self._epoll
        poll = epoll.poll
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                events = poll(0, MAX_EVENTS)
                while events:
                    self._pass(events)
                    if self._skip_repolls:  # looking again has found nothing lately: wait (a schedule point too)
                        self._skip_repolls -= 1
                        break
                    # let the actors run what this pass dispatched (and answer), then look again before
                    # waiting: under load the next pass is ready and costs no wait (measured in
                    # bench/README.md, "I/O designs": less CPU per write and per pipelined request);
                    # when it is not, keep looking for up to SPIN_NS (see the module docstring)
                    await trio.lowlevel.checkpoint()
                    events = poll(0, MAX_EVENTS)
                    if not events:
                        events = await self._spin(poll)
                    self._repoll(bool(events))
        finally:
            self.close_all()

    async def _spin(self, poll: Callable[[int, int], list[tuple[int, int]]]) -> list[tuple[int, int]]:
        """Look again (letting every other task run between looks) until something is ready or
        SPIN_NS have passed; what was found (nothing: the pass loop waits in the kernel)."""
        self.spins += 1
        until = monotonic_ns() + SPIN_NS
        while monotonic_ns() < until:
            await trio.lowlevel.checkpoint()
            events = poll(0, MAX_EVENTS)
            if events:
                self.spin_hits += 1
                return events
        return []

    def _repoll(self, found: bool) -> None:
        """Count what looking again after a pass found, a window of REPOLL_WINDOW at a time: when under
        one in REPOLL_MIN_HITS found anything (one request at a time: the client waits for its answer),
        the next REPOLL_SKIP passes wait at once, saving a poll and a scheduler round each; then it
        looks again for a window, to notice load coming back."""
        self._repoll_hits += found
        self._repolls_left -= 1
        if not self._repolls_left:
            if self._repoll_hits * REPOLL_MIN_HITS < REPOLL_WINDOW:
                self._skip_repolls = REPOLL_SKIP
            self._repoll_hits = 0
            self._repolls_left = REPOLL_WINDOW

    def close_all(self) -> None:
        for conn in list(self._by_fd.values()):
            conn.protocol.connection_lost()
            self._close(conn)
        wakers, self._wakers = self._wakers, {}
        for _on_ready, on_stop in wakers.values():
            on_stop()
        if not self._epoll.closed:
            trio.lowlevel.notify_closing(self._epoll.fileno())
            self._epoll.close()

    # --- one pass -----------------------------------------------------------------------------------

    def _pass(self, events: list[tuple[int, int]]) -> None:
        self.passes += 1
        self.events += len(events)
        by_fd = self._by_fd
        stamp = monotonic_ns()  # the requests of one pass share a read time (and a fast-path batch timestamp)
        for fd, mask in events:
            conn = by_fd.get(fd)
            if conn is None:  # a waker's fd, or a connection closed earlier in this pass
                waker = self._wakers.get(fd)
                if waker is not None:
                    waker[0]()
                continue
            try:
                if mask & _OUT and conn.writing:
                    self._write(conn)
                if conn.open and conn.mask & _IN and mask & (_IN | _GONE):
                    self._read(conn, stamp)
                elif conn.open and mask & _GONE and not conn.writing:
                    # the peer is gone while we do not read (paused, or after EOF): nobody can read answers
                    conn.protocol.connection_lost()
                    self._close(conn)
            except Exception:  # a bug in one connection must not stop the others
                log.exception("connection failed")
                if conn.open:
                    conn.protocol.connection_lost()
                    self._close(conn)

    def _read(self, conn: BulkConnection, stamp: int) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:  # reset by the peer
            log.debug("connection read failed: %s", exc)
            self._lost(conn)
            return
        protocol = conn.protocol
        if not data:
            protocol.receive_eof()
            conn.reading = False
        elif conn._timed:
            before = protocol.rate_limited
            protocol.receive_data(data, trio.current_time(), stamp)
            self.stats.rate_limited += protocol.rate_limited - before
        else:
            protocol.receive_data(data, 0.0, stamp)
        conn.flush()  # the answers given in the pass (errors, fast path), and the new state to watch

    def _write(self, conn: BulkConnection) -> None:
        out = conn.protocol.outbound
        try:
            sent = conn.sock.send(out)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("connection send failed: %s", exc)
            self._lost(conn)
            return
        del out[:sent]
        if not out:
            conn.writing = False
        self._settle(conn)

    # --- state ----------------------------------------------------------------------------------------

    def _settle(self, conn: BulkConnection) -> None:
        """After a read, a send or a delivery: close if done, else watch what the connection needs now."""
        protocol = conn.protocol
        if protocol.finished and not protocol.outbound:
            self._close(conn)
            return
        if conn.reading and protocol.eof:
            conn.reading = False
        want = (_IN if conn.reading and not protocol.reading_paused else 0) | (_OUT if conn.writing else 0)
        if want != conn.mask:
            conn.mask = want
            self._epoll.modify(conn.fd, want)

    def _lost(self, conn: BulkConnection) -> None:
        conn.protocol.connection_lost()
        self._close(conn)

    def _close(self, conn: BulkConnection) -> None:
        if not conn.open:
            return
        conn.open = False
        if self._by_fd.get(conn.fd) is conn:
            del self._by_fd[conn.fd]
            try:
                self._epoll.unregister(conn.fd)
            except (OSError, ValueError) as exc:  # the epoll set is closed (shutdown)
                log.debug("epoll unregister: %s", exc)
        conn.sock.close()
        if self.on_close is not None:
            self.on_close(conn)
