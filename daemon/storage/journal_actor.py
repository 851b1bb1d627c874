"""The journal actor: the only writer of the journal, with group commit; its front, over a sync back-end.

Rule kept here: everything waiting is written with one write and covered by one fsync, and no
waiter is told "durable" before that fsync returned (policy `always`); writes are made durable in
the order they were queued, and a run_exclusive call (rotate, drop_before, resume) runs alone,
between groups, in queue order with them. Under `batch` the fsync runs at most `batch_interval`
seconds after the write (this front's periodic call); under `off` never (until rotate or close).
The first write or fsync error fails the journal: every later submit raises JournalUnavailable and
the daemon answers writes with `read_only`, never retrying on its own. Only `resume` (sys.resume,
after an operator freed space) clears that: it cuts the journal back to its last sync, starts a new
segment (a real write + fsync) and only then lets writes in again.

This module is the front: the queueing, the waiters, the failure, the statistics, run_exclusive
and the periodic sync, the same whoever makes the syncs. It is composed with one back-end that
owns the Journal and makes groups durable (daemon/storage/journal_sync.py is the seam): a writer
thread (journal_thread.py, any policy) or the kernel's fdatasync through Linux AIO, no thread
(journal_kernel.py, fsync=always; `make_journal_actor` there picks). The front reads the Journal
once, for its first facts, before handing it over; from then on it knows it only through `facts`
(JournalFacts, a copy the back-end sends with every completion).

Ownership: the attributes trio reads (acked_seq, failed, the histogram, `facts`) are written by
trio alone, from the back-end's completions, which wait behind the back-end's `ack_fd` (an
eventfd). With `acks="poller"` (the bulk I/O layer, daemon/io_layer.py) the I/O layer's epoll set
holds it, so the pass that finds it readable runs them (`drain_acks`, on trio's thread) and a
group's answers cost no wake-up of their own (no trio task switch per group); with `acks="actor"`
(standalone, tests) this actor's own task waits on it from the start. When the pass loop ends
(`poller_stopped`, at shutdown) or close() is called, this actor's task drains it until the
back-end is done, so the waiters of every write hear how it went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import trio

from ...protocol import now_rfc3339
from ..primitives import Histogram, Waiter
from .journal import Journal, JournalWriteError
from .journal_sync import BackendFactory, JournalFacts, JournalOp, SyncBackend, sync_if_unsynced
from .journal_thread import WriterThreadSync
from .store import RTYPE_MUTATION, StoreUnavailable, mutation_encoder

log = logging.getLogger("eurekamem.journal")


FsyncPolicy = Literal["always", "batch", "off"]
FSYNC_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)

__all__ = ["FSYNC_POLICIES", "FsyncPolicy", "JournalActor", "JournalFacts", "JournalUnavailable"]


class JournalUnavailable(StoreUnavailable):
    """The journal cannot be written; the daemon is read-only (code `read_only`)."""


class JournalActor:
    """The journal's front (module docstring), composed with the back-end `backend` makes of the
    Journal: the writer thread's unless told otherwise."""

    def __init__(
        self,
        journal: Journal,
        fsync: str,
        batch_interval: float,
        acks: str = "actor",
        backend: BackendFactory = WriterThreadSync,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}")
        if acks not in ("actor", "poller"):
            raise ValueError("acks must be actor (its own task drains ack_fd) or poller (a poller drains it)")
        self.fsync = fsync
        self.batch_interval = batch_interval
        self.failed: str | None = None
        self.failed_at: str | None = None
        self.resumes = 0  # times sys.resume made the journal writable again
        self.last_resume: dict[str, Any] | None = None
        self.facts = JournalFacts.of(journal)  # made before the back-end owns it; then only it sends new ones
        self.acked_seq = self.facts.last_seq
        self.fsync_latency = Histogram()
        self.batches = 0
        self.records = 0
        self._closed = False
        self._close_requested = trio.Event()
        self._alone = trio.Event()  # no poller drains ack_fd (any more): this actor's task does
        if acks == "actor":
            self._alone.set()
        self.backend: SyncBackend = backend(journal, self)  # owns the Journal from here on

    @property
    def sync(self) -> str:
        """Who makes the fdatasync: "thread" (a writer thread) or "kernel" (Linux AIO)."""
        return self.backend.name

    @property
    def ack_fd(self) -> int | None:
        """The eventfd a poller watches (acks="poller"): readable while completions wait for drain_acks."""
        return self.backend.ack_fd

    # --- the API of other actors ----------------------------------------------------------------

    store_name = "journal"

    async def commit(self, mutations: Sequence[Any]) -> None:
        """The Store seam (daemon/storage/store.py): one batch's mutations as journal records,
        durable under the policy when this returns; JournalUnavailable (read_only) when not."""
        await self.submit([(RTYPE_MUTATION, mutation_encoder.encode(m)) for m in mutations])

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
            self.backend.enqueue(JournalOp("write", waiter, payloads))
        return waiter

    async def run_exclusive(self, fn: Callable[[Journal], Any]) -> Any:
        """Run fn(journal) where the Journal's owner runs it (the writer thread, or a worker thread the
        kernel's back-end lends it to), between groups, in queue order with the writes."""
        if self._closed:
            raise trio.ClosedResourceError("the journal is closed (shutting down)")
        waiter = Waiter()
        self.backend.enqueue(JournalOp("call", waiter, fn=fn))
        return await waiter.wait()

    def close(self) -> None:
        """No more submissions; run() finishes what is queued, syncs, stops the back-end and returns."""
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
            cut: int = await self.run_exclusive(_resume)
        except trio.ClosedResourceError:
            raise JournalUnavailable("still read-only: the journal is closed (shutting down)") from None
        except (JournalWriteError, OSError) as exc:
            cause = exc.error if isinstance(exc, JournalWriteError) else exc
            self.failed = f"journal write failed: {cause} (sys.resume tried again at {now_rfc3339()})"
            log.warning("sys.resume: the journal is still not writable: %s", cause)
            raise JournalUnavailable(f"still read-only: the journal cannot be written: {cause}") from exc
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
        backend = self.backend
        try:
            async with trio.open_nursery() as nursery:
                draining = trio.CancelScope(shield=True)  # the waiters of every write must hear how it went
                nursery.start_soon(self._drain_when_alone, draining)
                nursery.start_soon(self._run_backend, draining)
                try:
                    async with trio.open_nursery() as periodic:
                        if self.fsync == "batch":
                            periodic.start_soon(self._sync_periodically)
                        await self._close_requested.wait()
                        periodic.cancel_scope.cancel()
                finally:
                    self._closed = True
                    backend.close()  # after everything already queued
                    self._alone.set()  # whatever the poller does now, the last completions are drained here too
        finally:
            backend.release()  # a no-op unless the back-end is done (its last completion drained)

    async def _run_backend(self, draining: trio.CancelScope) -> None:
        with trio.CancelScope(shield=True):  # every write queued before close() is made durable and answered
            await self.backend.run()
        draining.cancel()

    # --- the completions: from ack_fd, through the poller's pass or this actor's task ------------------

    def drain_acks(self) -> None:
        """Run the back-end's completions (a poller found ack_fd readable), in order."""
        self.backend.drain()

    def poller_stopped(self) -> None:
        """The poller no longer watches ack_fd: this actor's task drains it from now on."""
        self._alone.set()

    async def _drain_when_alone(self, scope: trio.CancelScope) -> None:
        with scope:
            await self._alone.wait()
            backend = self.backend
            fd = backend.ack_fd
            assert fd is not None  # released only after this task ends
            while True:
                await trio.lowlevel.wait_readable(fd)
                backend.drain()

    # --- what the back-end reports (journal_sync.JournalFront), on trio's thread ----------------------

    def published(self, facts: JournalFacts) -> None:
        self.facts = facts

    def group_durable(
        self, writes: list[JournalOp], last: int, count: int, sync_us: float | None, facts: JournalFacts
    ) -> None:
        self.facts = facts
        if sync_us is not None:
            self.fsync_latency.add(sync_us)
        self.acked_seq = last
        self.batches += 1
        self.records += count
        first_seq = last - count + 1
        for op in writes:
            first_seq += len(op.payloads)
            op.waiter.set(first_seq - 1)

    def group_failed(self, writes: list[JournalOp], error: Exception, facts: JournalFacts) -> None:
        self.facts = facts
        if not self.failed:
            self._set_failed(f"journal write failed: {error}")
        unavailable = JournalUnavailable(self.failed or f"journal write failed: {error}")
        for op in writes:
            op.waiter.fail(unavailable)

    def call_returned(self, op: JournalOp, result: Any, facts: JournalFacts) -> None:
        self.facts = facts
        op.waiter.set(result)

    def call_raised(self, op: JournalOp, error: Exception, facts: JournalFacts) -> None:
        self.facts = facts
        op.waiter.fail(error)

    # --- fsync=batch ----------------------------------------------------------------------------------

    async def _sync_periodically(self) -> None:
        while True:
            await trio.sleep(self.batch_interval)
            if not self.failed:
                try:
                    fsync_us = await self.run_exclusive(sync_if_unsynced)
                except Exception as exc:
                    self._set_failed(f"journal fsync failed: {exc}")
                else:
                    if fsync_us is not None:
                        self.fsync_latency.add(fsync_us)


def _resume(journal: Journal) -> int:
    return journal.resume()
