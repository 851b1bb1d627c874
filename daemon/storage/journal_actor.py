"""The journal actor: the only writer of the journal, with group commit.

Rule kept here: everything waiting is written with one write and covered by one fsync, and no
waiter is told "durable" before that fsync returned (policy `always`). The file work runs in one
long-lived writer thread that takes whatever was queued while its last fsync ran, in queue order
(consecutive writes as one group; rotate/sync/resume calls alone, between groups), so the next
group starts the moment an fsync returns. Under `batch` the fsync runs
at most `batch_interval` seconds after the write; under `off` never (until rotate or close). The
first write or fsync error fails the journal: every later submit raises
JournalUnavailable and the daemon answers writes with `read_only`, never retrying on its own. Only
`resume` (sys.resume, after an operator freed space) clears that: it cuts the journal back to its
last sync, starts a new segment (a real write + fsync) and only then lets writes in again.

Ownership: after the writer thread starts, the Journal and `_unsynced` belong to it alone, and
the attributes trio reads (acked_seq, failed, the histogram, `facts`) are written by trio alone.
The one hand-off each way: trio -> thread through the queue (an _Op); thread -> trio through
`run_sync_soon` (results, fsync latencies, and a JournalFacts snapshot after every group and call,
queued before the waiters are woken, so a woken waiter already sees the facts of its own op).
With `acks="poller"` (the bulk I/O layer, daemon/io_layer.py) the way back is a queue of those same
callbacks and an eventfd instead: the writer thread puts each callback and writes the eventfd; the
I/O layer's epoll set holds the eventfd, so the pass that finds it readable runs the callbacks
(`drain_acks`, in queue order, on trio's thread), and a group's answers cost no wake-up of their
own (no trio task switch per group). When the pass loop ends (`poller_stopped`, at shutdown) a
task of this actor waits on the eventfd itself until the writer thread is done.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

import trio

from ...protocol import now_rfc3339
from ..primitives import Histogram, Waiter
from .journal import Journal, JournalWriteError

log = logging.getLogger("eurekamem.journal")


FsyncPolicy = Literal["always", "batch", "off"]
FSYNC_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)


class JournalFacts(NamedTuple):
    """What trio may know of the Journal: an immutable copy made by its owner (the writer thread)."""

    last_seq: int  # of the last record written (synced or not)
    size_bytes: int
    segments: int
    current_segment: str
    failed: bool  # the Journal itself refuses writes (until resume)

    @classmethod
    def of(cls, journal: Journal) -> JournalFacts:
        names = journal.segment_names
        return cls(journal.last_seq, journal.size_bytes, len(names), names[-1] if names else "", journal.failed)


class JournalUnavailable(Exception):
    """The journal cannot be written; the daemon is read-only."""


class _Op:
    __slots__ = ("kind", "payloads", "fn", "waiter")

    def __init__(
        self, kind: str, waiter: Waiter, payloads: list[tuple[int, bytes]] | None = None, fn: Any = None
    ) -> None:
        self.kind = kind
        self.payloads = payloads or []
        self.fn = fn
        self.waiter = waiter


class JournalActor:
    sync = "thread"  # who makes the fdatasync: this actor's writer thread (journal_kernel.py: the kernel)

    def __init__(
        self, journal: Journal, fsync: str, batch_interval: float, acks: str = "trio"
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}")
        if acks not in ("trio", "poller"):
            raise ValueError("acks must be trio (run_sync_soon) or poller (an eventfd that a poller drains)")
        self.journal = journal
        self.fsync = fsync
        self.batch_interval = batch_interval
        self.failed: str | None = None
        self.failed_at: str | None = None
        self.resumes = 0  # times sys.resume made the journal writable again
        self.last_resume: dict[str, Any] | None = None
        self.facts = JournalFacts.of(journal)  # made before the writer thread exists; then only it sends new ones
        self.acked_seq = self.facts.last_seq
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()  # None: stop the writer thread
        self._closed = False
        self._close_requested = trio.Event()
        self._thread_done = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        # acks="poller": the callbacks back to trio, and the eventfd that says some wait (module docstring)
        self._acks: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self.ack_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if acks == "poller" else None
        self._alone = trio.Event()  # the poller stopped (or the writer is done): this actor drains the acks itself
        self._unsynced = False  # the writer thread's: records written since the last sync
        self.fsync_latency = Histogram()
        self.batches = 0
        self.records = 0

    # --- the API of other actors ----------------------------------------------------------------

    async def submit(self, payloads: list[tuple[int, bytes]]) -> int:
        """Journal (rtype, payload) records; returns the last seq once durable under the policy."""
        result: int = await self.submit_nowait(payloads).wait()
        return result

    def submit_nowait(self, payloads: list[tuple[int, bytes]]) -> Waiter:
        """Queue records for the next group commit; the waiter gives the last seq once durable
        (or raises JournalUnavailable). Writes are made durable in the order they were queued."""
        waiter = Waiter()
        if self.failed:
            waiter.fail(JournalUnavailable(self.failed))
        elif self._closed:
            waiter.fail(JournalUnavailable("the journal is closed (shutting down)"))
        else:
            self._enqueue(_Op("write", waiter, payloads))
        return waiter

    async def run_exclusive(self, fn: Callable[[Journal], Any]) -> Any:
        """Run fn(journal) in the writer thread between groups (rotate, drop_before, sync), in queue
        order with the writes."""
        if self._closed:
            raise trio.ClosedResourceError("the journal is closed (shutting down)")
        waiter = Waiter()
        self._enqueue(_Op("call", waiter, fn=fn))
        return await waiter.wait()

    def _enqueue(self, op: _Op) -> None:
        """Hand a write or a call to the Journal's owner (here the writer thread, through the queue)."""
        self._queue.put(op)

    def close(self) -> None:
        """No more submissions; run() finishes what is queued, syncs, stops the thread and returns."""
        self._closed = True
        self._close_requested.set()

    def _set_failed(self, reason: str) -> None:
        self.failed = reason
        self.failed_at = now_rfc3339()
        log.error("%s; the daemon is now read-only (sys.resume tries again after space is freed)", reason)

    async def resume_journal(self) -> int:
        """Make the failed journal writable again (writes stay refused until `clear_failure`).

        Returns how many records were cut (written after the last sync; under fsync=always none of
        them was ever acknowledged). Raises JournalUnavailable, with the reason, when the disk still
        refuses; the journal then stays failed."""
        try:
            cut: int = await self.run_exclusive(self._resume_in_writer)
        except trio.ClosedResourceError:
            raise JournalUnavailable("still read-only: the journal is closed (shutting down)") from None
        except (JournalWriteError, OSError) as exc:
            cause = exc.error if isinstance(exc, JournalWriteError) else exc
            self.failed = f"journal write failed: {cause} (sys.resume tried again at {now_rfc3339()})"
            log.warning("sys.resume: the journal is still not writable: %s", cause)
            raise JournalUnavailable(f"still read-only: the journal cannot be written: {cause}") from exc
        return cut

    def _resume_in_writer(self, journal: Journal) -> int:
        cut = journal.resume()
        self._unsynced = False  # resume cut the journal back to its last sync
        return cut

    def clear_failure(self, note: dict[str, Any]) -> None:
        """Let writes in again, once the journal was resumed (and anything cut made durable)."""
        self.last_resume = {"at": now_rfc3339(), "was": self.failed, "failed_at": self.failed_at, **note}
        self.acked_seq = self.facts.last_seq
        self.failed = self.failed_at = None
        self.resumes += 1
        log.warning("journal resumed: writable again after %r (%s)", self.last_resume["was"], note)

    def statistics(self) -> dict[str, Any]:
        return {
            "fsync": self.fsync,
            "sync": self.sync,
            "failed": self.failed,
            "failed_at": self.failed_at,
            "resumes": self.resumes,
            "last_resume": self.last_resume,
            "last_seq": self.acked_seq,
            "bytes": self.facts.size_bytes,
            "segments": self.facts.segments,
            "batches": self.batches,
            "records": self.records,
            "fsync_latency": self.fsync_latency.summary(),
        }

    # --- the actor ------------------------------------------------------------------------------

    async def run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._writer_thread, name="journal-writer", daemon=True)
        thread.start()
        try:
            async with trio.open_nursery() as acks:
                if self.ack_fd is not None:
                    acks.start_soon(self._drain_when_alone)
                try:
                    async with trio.open_nursery() as nursery:
                        if self.fsync == "batch":
                            nursery.start_soon(self._sync_periodically)
                        await self._close_requested.wait()
                        nursery.cancel_scope.cancel()
                finally:
                    self._closed = True
                    self._queue.put(None)  # after everything already queued
                    self._alone.set()  # whatever the poller does now, the last acks are drained here too
                with trio.CancelScope(shield=True):
                    await self._thread_done.wait()
            thread.join()
        finally:
            if self.ack_fd is not None and self._thread_done.is_set():
                trio.lowlevel.notify_closing(self.ack_fd)
                os.close(self.ack_fd)
                self.ack_fd = None

    # --- acks="poller": the way back through the poller's epoll set ---------------------------------

    def drain_acks(self) -> None:
        """Run the callbacks the writer thread queued (the poller found ack_fd readable), in order."""
        assert self.ack_fd is not None
        try:
            os.eventfd_read(self.ack_fd)
        except BlockingIOError:  # drained already (by this actor's task, after the poller stopped)
            pass
        get = self._acks.get_nowait
        while True:
            try:
                fn, args = get()
            except queue.Empty:
                return
            fn(*args)

    def poller_stopped(self) -> None:
        """The poller no longer watches ack_fd: this actor's task drains the acks from now on."""
        self._alone.set()

    async def _drain_when_alone(self) -> None:
        with trio.CancelScope(shield=True):  # the waiters of every write must hear how it went
            await self._alone.wait()
            while not self._thread_done.is_set():
                assert self.ack_fd is not None
                await trio.lowlevel.wait_readable(self.ack_fd)
                self.drain_acks()

    def _writer_done(self) -> None:
        self._thread_done.set()
        self._alone.set()  # the drain task sees the thread done and ends, the poller or not

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
            self._report(self._writer_done)

    def _report(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.ack_fd is not None:
            self._acks.put((fn, args))
            os.eventfd_write(self.ack_fd, 1)
            return
        assert self._token is not None
        self._token.run_sync_soon(fn, *args)

    def _write_group(self, writes: list[_Op | None]) -> None:
        if not writes:
            return
        ops = [op for op in writes if op is not None]
        records = [rec for op in ops for rec in op.payloads]
        try:
            last, fsync_us = self._write(records)
        except Exception as exc:  # the journal is failed until sys.resume; trio says why everywhere
            self._report(self._group_failed, ops, exc, JournalFacts.of(self.journal))
        else:
            self._report(self._group_written, ops, last, len(records), fsync_us, JournalFacts.of(self.journal))

    def _run_call(self, op: _Op) -> None:
        try:
            result = op.fn(self.journal)
        except Exception as exc:
            self._report(self._publish, JournalFacts.of(self.journal))
            self._report(op.waiter.fail, exc)
        else:
            self._report(self._publish, JournalFacts.of(self.journal))
            self._report(op.waiter.set, result)

    def _final_sync(self) -> None:
        if self._unsynced and not self.journal.failed:
            try:
                self._sync_now()
            except Exception:
                log.exception("the final journal sync at shutdown failed")

    def _write(self, records: list[tuple[int, bytes]]) -> tuple[int, float | None]:
        """Append (and under `always` sync); the last seq and the fsync's microseconds (None: no sync)."""
        last = self.journal.append(records)
        if self.fsync == "always":
            return last, self._sync_now()
        self._unsynced = True
        return last, None

    def _sync_now(self) -> float:
        started = time.perf_counter()
        self.journal.sync()
        self._unsynced = False
        return (time.perf_counter() - started) * 1e6

    def _sync_if_unsynced(self, journal: Journal) -> float | None:
        """fsync=batch's periodic call, in the writer thread: sync if anything was written since."""
        return self._sync_now() if self._unsynced and not journal.failed else None

    # --- back in trio -------------------------------------------------------------------------------

    def _publish(self, facts: JournalFacts) -> None:
        self.facts = facts

    def _group_written(
        self, writes: list[_Op], last: int, count: int, fsync_us: float | None, facts: JournalFacts
    ) -> None:
        self.facts = facts
        if fsync_us is not None:
            self.fsync_latency.add(fsync_us)
        self.acked_seq = last
        self.batches += 1
        self.records += count
        first_seq = last - count + 1
        for op in writes:
            first_seq += len(op.payloads)
            op.waiter.set(first_seq - 1)

    def _group_failed(self, writes: list[_Op], exc: Exception, facts: JournalFacts) -> None:
        self.facts = facts
        if not self.failed:
            self._set_failed(f"journal write failed: {exc}")
        error = JournalUnavailable(self.failed)
        for op in writes:
            op.waiter.fail(error)

    async def _sync_periodically(self) -> None:
        while True:
            await trio.sleep(self.batch_interval)
            if not self.failed:
                try:
                    fsync_us = await self.run_exclusive(self._sync_if_unsynced)
                except Exception as exc:
                    self._set_failed(f"journal fsync failed: {exc}")
                else:
                    if fsync_us is not None:
                        self.fsync_latency.add(fsync_us)


