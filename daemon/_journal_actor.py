"""The journal actor: the only writer of the journal, with group commit.

Rule kept here: everything waiting is written with one write and covered by one fsync, and no
waiter is told "durable" before that fsync returned (policy `always`). Under `batch` the fsync runs
at most `batch_interval` seconds after the write; under `off` never (until rotate or close). The
first write or fsync error fails the journal (DESIGN.md rule 4): every later submit raises
JournalUnavailable and the daemon answers writes with `read_only`, never retrying on its own. Only
`resume` (sys.resume, after an operator freed space) clears that: it cuts the journal back to its
last sync, starts a new segment (a real write + fsync) and only then lets writes in again.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import trio

from eurekamem.protocol import now_rfc3339

from ._journal import Journal, JournalWriteError
from ._sync import Histogram, Waiter

log = logging.getLogger("eurekamem.journal")

FSYNC_POLICIES = ("always", "batch", "off")


class JournalUnavailable(Exception):
    """The journal cannot be written; the daemon is read-only."""


class _Op:
    __slots__ = ("kind", "payloads", "fn", "waiter")

    def __init__(self, kind: str, waiter: Waiter, payloads: list[tuple[int, bytes]] = (), fn: Any = None) -> None:
        self.kind = kind
        self.payloads = payloads
        self.fn = fn
        self.waiter = waiter


class JournalActor:
    def __init__(self, journal: Journal, fsync: str = "always", batch_interval: float = 1.0) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}")
        self.journal = journal
        self.fsync = fsync
        self.batch_interval = batch_interval
        self.failed: str | None = None
        self.failed_at: str | None = None
        self.resumes = 0  # times sys.resume made the journal writable again
        self.last_resume: dict[str, Any] | None = None
        self.acked_seq = journal.last_seq
        self._send, self._recv = trio.open_memory_channel[_Op](math.inf)
        self._unsynced = False
        self.fsync_latency = Histogram()
        self.batches = 0
        self.records = 0

    # --- the API of other actors ----------------------------------------------------------------

    async def submit(self, payloads: list[tuple[int, bytes]]) -> int:
        """Journal (rtype, payload) records; returns the last seq once durable under the policy."""
        return await self.submit_nowait(payloads).wait()

    def submit_nowait(self, payloads: list[tuple[int, bytes]]) -> Waiter:
        """Queue records for the next group commit; the waiter gives the last seq once durable
        (or raises JournalUnavailable). Writes are made durable in the order they were queued."""
        waiter = Waiter()
        if self.failed:
            waiter.fail(JournalUnavailable(self.failed))
            return waiter
        try:
            self._send.send_nowait(_Op("write", waiter, payloads))
        except trio.ClosedResourceError:
            waiter.fail(JournalUnavailable("the journal is closed (shutting down)"))
        return waiter

    async def run_exclusive(self, fn: Callable[[Journal], Any]) -> Any:
        """Run fn(journal) in a worker thread between batches (rotate, drop_before, sync)."""
        waiter = Waiter()
        self._send.send_nowait(_Op("call", waiter, fn=fn))
        return await waiter.wait()

    def close(self) -> None:
        self._send.close()

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
            cut = await self.run_exclusive(lambda journal: journal.resume())
        except trio.ClosedResourceError:
            raise JournalUnavailable("still read-only: the journal is closed (shutting down)") from None
        except (JournalWriteError, OSError) as exc:
            cause = exc.error if isinstance(exc, JournalWriteError) else exc
            self.failed = f"journal write failed: {cause} (sys.resume tried again at {now_rfc3339()})"
            log.warning("sys.resume: the journal is still not writable: %s", cause)
            raise JournalUnavailable(f"still read-only: the journal cannot be written: {cause}") from exc
        self._unsynced = False
        return cut

    def clear_failure(self, note: dict[str, Any]) -> None:
        """Let writes in again, once the journal was resumed (and anything cut made durable)."""
        self.last_resume = {"at": now_rfc3339(), "was": self.failed, "failed_at": self.failed_at, **note}
        self.acked_seq = self.journal.last_seq
        self.failed = self.failed_at = None
        self.resumes += 1
        log.warning("journal resumed: writable again after %r (%s)", self.last_resume["was"], note)

    def statistics(self) -> dict[str, Any]:
        return {
            "fsync": self.fsync,
            "failed": self.failed,
            "failed_at": self.failed_at,
            "resumes": self.resumes,
            "last_resume": self.last_resume,
            "last_seq": self.acked_seq,
            "bytes": self.journal.size_bytes,
            "segments": self.journal.segment_count,
            "batches": self.batches,
            "records": self.records,
            "fsync_latency": self.fsync_latency.summary(),
        }

    # --- the actor ------------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            if self.fsync == "batch":
                nursery.start_soon(self._sync_periodically)
            async for first in self._recv:
                ops = [first]
                while True:
                    try:
                        ops.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._run_ops(ops)
            nursery.cancel_scope.cancel()
        if not self.failed and self._unsynced:
            await trio.to_thread.run_sync(self._sync_now)

    async def _run_ops(self, ops: list[_Op]) -> None:
        writes = [op for op in ops if op.kind == "write"]
        if writes:
            records = [rec for op in writes for rec in op.payloads]
            if self.failed:
                error: BaseException | None = JournalUnavailable(self.failed)
            else:
                try:
                    last = await trio.to_thread.run_sync(self._write, records)
                    error = None
                except Exception as exc:  # the journal is failed until sys.resume; say why everywhere
                    self._set_failed(f"journal write failed: {exc}")
                    error = JournalUnavailable(self.failed)
            if error is None:
                self.acked_seq = last
                self.batches += 1
                self.records += len(records)
                first_seq = last - len(records) + 1
                for op in writes:
                    first_seq += len(op.payloads)
                    op.waiter.set(first_seq - 1)
            else:
                for op in writes:
                    op.waiter.fail(error)
        for op in ops:
            if op.kind == "call":
                try:
                    op.waiter.set(await trio.to_thread.run_sync(op.fn, self.journal))
                except Exception as exc:
                    op.waiter.fail(exc)

    def _write(self, records: list[tuple[int, bytes]]) -> int:
        last = self.journal.append(records)
        if self.fsync == "always":
            self._sync_now()
        else:
            self._unsynced = True
        return last

    def _sync_now(self) -> None:
        started = time.perf_counter()
        self.journal.sync()
        self.fsync_latency.add((time.perf_counter() - started) * 1e6)
        self._unsynced = False

    async def _sync_periodically(self) -> None:
        while True:
            await trio.sleep(self.batch_interval)
            if self._unsynced and not self.failed:
                try:
                    await self.run_exclusive(lambda journal: self._sync_now())
                except Exception as exc:
                    self._set_failed(f"journal fsync failed: {exc}")
