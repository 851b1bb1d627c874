"""The journal's writer-thread back-end: one long-lived thread owns the Journal and makes each group durable.

Rule kept here: the file work runs in one thread that takes whatever was queued while its last
fsync ran, in queue order (consecutive writes as one group: one write, and under `always` one
fsync; a call alone, between groups), so the next group starts the moment an fsync returns. Under
`batch` and `off` a group is only written (the front's periodic call syncs `batch`); at close
whatever is unsynced is synced once.

Ownership: after the thread starts, the Journal belongs to it alone. The one hand-off each way:
trio -> thread through `_queue` (a JournalOp; None: stop); thread -> trio through `_acks`, a queue
of the front's completion calls (results, fsync latencies, and a JournalFacts copy after every
group and call), plus an eventfd (`ack_fd`) written after each: the bulk I/O layer's epoll set, or
the actor's own task, finds it readable and `drain` runs the calls on trio's thread in queue order,
so a group's answers cost no wake-up of their own.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

from .journal import Journal
from .journal_sync import JournalFacts, JournalFront, JournalOp, sync_if_unsynced, timed_sync

log = logging.getLogger("eurekamem.journal")


class WriterThreadSync:
    """The SyncBackend whose Journal a writer thread owns (module docstring)."""

    name = "thread"

    def __init__(self, journal: Journal, front: JournalFront) -> None:
        self._journal = journal
        self._front = front
        self._always = front.fsync == "always"
        self._queue: queue.SimpleQueue[JournalOp | None] = queue.SimpleQueue()  # None: stop the thread
        self._acks: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self.ack_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._done = trio.Event()  # the thread reported its last op and stopped
        self._thread: threading.Thread | None = None

    # --- on trio's thread ---------------------------------------------------------------------------

    def enqueue(self, op: JournalOp) -> None:
        self._queue.put(op)

    def close(self) -> None:
        self._queue.put(None)  # after everything already queued

    async def run(self) -> None:
        self._thread = thread = threading.Thread(target=self._writer_thread, name="journal-writer", daemon=True)
        thread.start()
        await self._done.wait()  # set by the thread's last report, which drain runs
        thread.join()

    def drain(self) -> None:
        """Run the front's calls the thread queued, in order (ack_fd was found readable)."""
        assert self.ack_fd is not None
        try:
            os.eventfd_read(self.ack_fd)
        except BlockingIOError:  # read already by the other drainer (the poller, or the actor's task)
            pass
        get = self._acks.get_nowait
        while True:
            try:
                fn, args = get()
            except queue.Empty:
                return
            fn(*args)

    def release(self) -> None:
        if self.ack_fd is not None and self._done.is_set():
            trio.lowlevel.notify_closing(self.ack_fd)
            os.close(self.ack_fd)
            self.ack_fd = None

    # --- the writer thread: the only code that touches the journal's files --------------------------

    def _writer_thread(self) -> None:
        get = self._queue.get
        get_nowait = self._queue.get_nowait
        try:
            while True:
                ops = [get()]
                while True:
                    try:
                        ops.append(get_nowait())
                    except queue.Empty:
                        break
                start = 0
                for index, op in enumerate(ops):
                    if op is None or op.kind == "call":
                        self._write_group(ops[start:index])  # only writes between start and index
                        start = index + 1
                        if op is None:
                            self._final_sync()
                            return
                        self._run_call(op)
                self._write_group(ops[start:])
        except BaseException:
            log.exception("the journal writer thread failed")
            raise
        finally:
            self._report(self._done.set)

    def _report(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self.ack_fd is not None  # closed only after the thread's last report was drained
        self._acks.put((fn, args))
        os.eventfd_write(self.ack_fd, 1)

    def _write_group(self, writes: list[JournalOp | None]) -> None:
        ops = [op for op in writes if op is not None]
        if not ops:
            return
        records = [rec for op in ops for rec in op.payloads]
        journal = self._journal
        try:
            last, fsync_us = self._write(records)
        except Exception as exc:  # the journal is failed until sys.resume; the front says why everywhere
            self._report(self._front.group_failed, ops, exc, JournalFacts.of(journal))
        else:
            self._report(self._front.group_durable, ops, last, len(records), fsync_us, JournalFacts.of(journal))

    def _run_call(self, op: JournalOp) -> None:
        journal = self._journal
        try:
            result = op.fn(journal)
        except Exception as exc:
            self._report(self._front.call_raised, op, exc, JournalFacts.of(journal))
        else:
            self._report(self._front.call_returned, op, result, JournalFacts.of(journal))

    def _final_sync(self) -> None:
        try:
            sync_if_unsynced(self._journal)
        except Exception:
            log.exception("the final journal sync at shutdown failed")

    def _write(self, records: list[tuple[int, bytes]]) -> tuple[int, float | None]:
        """Append (and under `always` sync); the last seq and the fsync's microseconds (None: no sync)."""
        last = self._journal.append(records)
        if self._always:
            return last, timed_sync(self._journal)
        return last, None
