"""The journal's kernel back-end: its fdatasync made by the kernel (Linux AIO, through caio), no writer thread.

Rule kept here: the front's (journal_actor.py: one group at a time: everything queued is written
with one write and covered by one fdatasync, in queue order; no waiter is told "durable" before that
fdatasync completed; the first write or sync error fails the journal until sys.resume), with another
owner: the Journal belongs to trio's thread. A group's records are written there (one write to the
page cache, only while no sync of ours is in flight), then its fdatasync goes to the kernel
(IOCB_CMD_FDSYNC), which runs it in its own worker and reports the completion on an eventfd. That
eventfd is `ack_fd`: the bulk I/O layer's epoll set holds it as it holds the writer thread's, so
the pass that finds it readable completes the group (`drain`: answers, then the next group), or,
when there is no poller (or it stopped), the front's task waits on it.

Work that blocks is lent, never run on trio's thread: a segment's roll (before the append that
would roll), and every run_exclusive call (rotate, drop_before, resume), go to one worker thread
through trio.to_thread.run_sync, between groups; nothing touches the Journal until it is back.

Why: with a writer thread, each group cost two thread wake-ups and GIL hand-offs, and the thread's
Python ran while trio waited for the GIL (bench/README.md, issue 17's fifth and sixth rounds). Used
only under fsync=always, on Linux, when caio's Linux AIO works and a probe fdatasync of the current
segment succeeds (`kernel_sync_problem` says why not, and `make_journal_actor` then keeps the thread).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from .journal import Journal
from .journal_actor import JournalActor
from .journal_sync import JournalFacts, JournalFront, JournalOp

log = logging.getLogger("eurekamem.journal")

_linux_aio: Any
try:  # caio's Linux AIO (a C extension); missing off Linux
    from caio import linux_aio as _linux_aio
except ImportError:  # pragma: no cover - the thread is used then
    _linux_aio = None

_PROBE_TIMEOUT = 10.0  # seconds a probe fdatasync may take before the kernel's way is given up


def _result_error(result: int) -> OSError | None:
    """The error of an AIO completion (caio passes the kernel's signed result as an unsigned 64-bit int)."""
    if result >= 1 << 63:
        result -= 1 << 64
    if result >= 0:
        return None
    return OSError(-result, f"fdatasync (kernel AIO): {os.strerror(-result)}")


def kernel_sync_problem(journal: Journal) -> str | None:
    """Why the kernel cannot make this journal's fdatasync (None: it can; probed on its current segment)."""
    if _linux_aio is None:
        return "caio's Linux AIO is not available here"
    fd = journal.sync_fd()
    if fd is None:
        return "the journal's file layer has no file descriptor"
    try:
        context = _linux_aio.Context(4)
    except (OSError, SystemError, RuntimeError) as exc:
        return f"Linux AIO context: {exc}"
    try:
        results: list[int] = []
        operation = _linux_aio.Operation.fdsync(fd)
        operation.set_callback(results.append)
        context.submit(operation)
        context.process_events(max_requests=1, min_requests=1, timeout=int(_PROBE_TIMEOUT))
        if not results:
            return f"a probe fdatasync did not complete in {_PROBE_TIMEOUT:g} s"
        error = _result_error(results[0])
        return None if error is None else f"a probe fdatasync failed: {error}"
    except (OSError, SystemError, ValueError) as exc:
        return f"a probe fdatasync was refused: {exc}"
    finally:
        del context  # destroyed with its last reference (io_destroy, and its eventfd closed)


class _Group:
    __slots__ = ("writes", "last", "count", "started", "operation")

    def __init__(self, writes: list[JournalOp], last: int, count: int, operation: Any) -> None:
        self.writes = writes
        self.last = last
        self.count = count
        self.started = time.perf_counter()
        self.operation = operation  # kept alive until its completion is read


class KernelSync:
    """The SyncBackend whose fdatasync the kernel makes, fsync=always only (module docstring)."""

    name = "kernel"

    def __init__(self, journal: Journal, front: JournalFront) -> None:
        if _linux_aio is None:
            raise RuntimeError("caio's Linux AIO is not available here")
        if front.fsync != "always":
            raise ValueError("the kernel's fdatasync serves fsync=always only")
        self._journal = journal
        self._front = front
        self._context: Any = _linux_aio.Context(64)
        self.ack_fd: int | None = self._context.fileno
        self._waiting: deque[JournalOp] = deque()  # writes and calls in the order they came, not started yet
        self._syncing: _Group | None = None  # the group whose fdatasync the kernel runs now
        self._result: int | None = None  # its completion's result, read by drain
        self._lending = False  # the Journal is lent to a worker thread (a call, or a segment's roll)
        self._lend_due = trio.Event()  # the head of _waiting needs the worker thread
        self._closed = False
        self._drained = trio.Event()  # closed, and nothing waiting, syncing or lent

    def enqueue(self, op: JournalOp) -> None:
        """A write or a run_exclusive call (in a worker thread, between groups), in queue order."""
        self._waiting.append(op)
        self._next()

    def close(self) -> None:
        self._closed = True
        self._next()

    # --- one thing at a time: a group in the kernel, or the Journal lent, or nothing --------------

    def _next(self) -> None:
        """Start what may start now: the leading writes as one group, or the worker thread's turn."""
        if self._syncing is not None or self._lending:
            return
        waiting = self._waiting
        if not waiting:
            if self._closed:
                self._drained.set()
            return
        journal = self._journal
        if waiting[0].kind == "call" or journal.roll_due:
            self._lend_due.set()
            return
        writes = []
        while waiting and waiting[0].kind == "write":
            writes.append(waiting.popleft())
        records = [record for op in writes for record in op.payloads]
        try:
            last = journal.append(records)  # one write to the page cache; no roll is due (above)
        except Exception as exc:  # a failed write (the journal is failed until sys.resume), or a record it refused
            self._front.group_failed(writes, exc, JournalFacts.of(journal))
            self._next()
            return
        try:
            fd = journal.sync_fd()
            if fd is None:  # pragma: no cover - kernel_sync_problem refused such a file layer
                raise OSError(errno.EBADF, "the journal's segment has no file descriptor")
            operation = _linux_aio.Operation.fdsync(fd)
            operation.set_callback(self._completed)
            self._context.submit(operation)
        except Exception as exc:  # io_submit refused: written, never synced; failed as a failed fdatasync is
            error = journal.fail(OSError(getattr(exc, "errno", None) or errno.EIO, f"fdatasync not submitted: {exc}"))
            self._front.group_failed(writes, error, JournalFacts.of(journal))
            self._next()
            return
        self._syncing = _Group(writes, last, len(records), operation)

    def _completed(self, result: int) -> None:
        self._result = result  # caio calls this inside process_events; drain handles it after

    def drain(self) -> None:
        """The completion eventfd is readable (the poller's pass, or the front's task): finish the group."""
        try:
            self._context.poll()
        except BlockingIOError:  # its counter was read already (by the other of the two drainers)
            pass
        self._context.process_events()
        result, self._result = self._result, None
        group = self._syncing
        if result is None or group is None:
            return
        self._syncing = None
        journal = self._journal
        error = _result_error(result)
        if error is None:
            journal.mark_synced()
            self._front.group_durable(group.writes, group.last, group.count,
                                      (time.perf_counter() - group.started) * 1e6, JournalFacts.of(journal))
        else:
            self._front.group_failed(group.writes, journal.fail(error), JournalFacts.of(journal))
        self._next()

    # --- the back-end's life ------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as lending:
            lending.start_soon(self._lend)
            await self._drained.wait()  # every op queued before close() reported (the front drains meanwhile)
            lending.cancel_scope.cancel()  # nothing is lent now (drained)

    def release(self) -> None:
        if self._context is not None and self._drained.is_set():
            trio.lowlevel.notify_closing(self._context.fileno)
            self.ack_fd = None
            self._context = None  # destroyed with its last reference: io_destroy, and its eventfd closed

    async def _lend(self) -> None:
        """The worker thread's turns: each run_exclusive call, and each segment roll, when at the head."""
        while True:
            await self._lend_due.wait()
            self._lend_due = trio.Event()
            if self._syncing is not None or self._lending or not self._waiting:
                continue
            head = self._waiting[0]
            call = head.kind == "call"
            if call:
                self._waiting.popleft()
            elif not self._journal.roll_due:
                continue
            fn: Callable[[Journal], Any] = head.fn if call else _roll
            self._lending = True
            try:  # the Journal is the worker thread's until this returns (run_sync is not abandoned)
                result = await trio.to_thread.run_sync(fn, self._journal)
            except Exception as exc:
                if call:
                    self._front.call_raised(head, exc, JournalFacts.of(self._journal))
                else:  # the roll failed the journal (Journal._roll): the group after it hears why
                    log.error("the journal's segment roll failed: %s", exc)
                    self._front.published(JournalFacts.of(self._journal))
            else:
                if call:
                    self._front.call_returned(head, result, JournalFacts.of(self._journal))
                else:
                    self._front.published(JournalFacts.of(self._journal))
            finally:
                self._lending = False
            self._next()


def _roll(journal: Journal) -> int:
    return journal.rotate()


def make_journal_actor(
    journal: Journal, fsync: str, batch_interval: float, *, acks: str = "actor", sync: str
) -> JournalActor:
    """The journal actor for this daemon: its front composed with the kernel's fdatasync under
    fsync=always when sync is "auto" and it works here (module docstring), else with the writer thread."""
    if sync not in ("auto", "thread"):
        raise ValueError("journal sync must be auto or thread")
    if fsync == "always" and sync == "auto":
        problem = kernel_sync_problem(journal)
        if problem is None:
            return JournalActor(journal, fsync, batch_interval, acks=acks, backend=KernelSync)
        log.info("the journal syncs in a writer thread: %s", problem)
    return JournalActor(journal, fsync, batch_interval, acks=acks)
