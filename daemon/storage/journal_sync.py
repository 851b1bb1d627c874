"""The seam between the journal actor's front (journal_actor.py) and its two sync back-ends.

The front queues writes and calls, answers their waiters, keeps the failure and the statistics;
a back-end owns the Journal and makes groups durable: a writer thread (journal_thread.py) or the
kernel's fdatasync through Linux AIO (journal_kernel.py). Rule kept here: the two sides meet only
through what this module names, so either back-end can sit behind the one front:

- front -> back-end: `SyncBackend.enqueue(op)` with one `JournalOp` at a time, in queue order,
  on trio's thread; `close()` once, after the last op; `run()` for the actor's life.
- back-end -> front: the `JournalFront` methods, always on trio's thread: from
  `SyncBackend.drain` (the completions wait behind `ack_fd`, an eventfd: the bulk I/O layer's pass
  or the actor's own task finds it readable and drains), from `enqueue`/`close` themselves (a
  write the kernel's back-end could not start), or from the back-end's `run` (the kernel's
  back-end, once a call it lent to a worker thread is back); each with a `JournalFacts` copy made
  by the Journal's owner, so a woken waiter already sees the facts of its own op.

A back-end writes consecutive writes as one group covered by one sync, runs a call alone between
groups, and reports every op's outcome exactly once; the front decides what an outcome means to
the waiters (durable, `JournalUnavailable`, the daemon read-only until sys.resume).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from ..primitives import Waiter
from .journal import Journal


class JournalFacts(NamedTuple):
    """What trio may know of the Journal: an immutable copy made by its owner (the back-end)."""

    last_seq: int  # of the last record written (synced or not)
    size_bytes: int
    segments: int
    current_segment: str
    failed: bool  # the Journal itself refuses writes (until resume)

    @classmethod
    def of(cls, journal: Journal) -> JournalFacts:
        names = journal.segment_names
        return cls(journal.last_seq, journal.size_bytes, len(names), names[-1] if names else "", journal.failed)


class JournalOp:
    """One queued piece of work: a write (`payloads`, records in order) or a call (`fn(journal)`,
    run alone between groups); `waiter` hears its outcome."""

    __slots__ = ("kind", "payloads", "fn", "waiter")

    def __init__(
        self, kind: str, waiter: Waiter, payloads: list[tuple[int, bytes]] | None = None, fn: Any = None
    ) -> None:
        self.kind = kind  # "write" or "call"
        self.payloads = payloads or []
        self.fn = fn
        self.waiter = waiter


class JournalFront(Protocol):
    """What a back-end tells the front (on trio's thread: module docstring)."""

    fsync: str  # the policy the back-end syncs by

    def group_durable(
        self, writes: list[JournalOp], last: int, count: int, sync_us: float | None, facts: JournalFacts
    ) -> None:
        """A group's `count` records, the last with seq `last`, are written (and, under `always`, synced)."""

    def group_failed(self, writes: list[JournalOp], error: Exception, facts: JournalFacts) -> None:
        """A group's write or sync failed: the journal is failed until sys.resume."""

    def call_returned(self, op: JournalOp, result: Any, facts: JournalFacts) -> None: ...

    def call_raised(self, op: JournalOp, error: Exception, facts: JournalFacts) -> None: ...

    def published(self, facts: JournalFacts) -> None:
        """New facts, with no op to answer (a segment's roll)."""


class SyncBackend(Protocol):
    """A way of making the journal's groups durable (module docstring)."""

    name: str  # what sys.stats says under journal.sync: "thread" or "kernel"
    ack_fd: int | None  # readable while completions wait for `drain`; None once released

    def enqueue(self, op: JournalOp) -> None: ...

    def drain(self) -> None:
        """Run the completions that wait (ack_fd was found readable); a no-op when none do."""

    async def run(self) -> None:
        """The back-end's life: returns once `close()` was called and every op queued before it is
        reported (the front runs it shielded and drains `ack_fd` meanwhile)."""

    def close(self) -> None:
        """No more ops: finish what is queued (a final sync where anything is unsynced)."""

    def release(self) -> None:
        """After run() returned and nobody drains any more: give back ack_fd and what holds it."""


BackendFactory = Callable[[Journal, JournalFront], SyncBackend]


def timed_sync(journal: Journal) -> float:
    """Sync the journal; the microseconds it took."""
    started = time.perf_counter()
    journal.sync()
    return (time.perf_counter() - started) * 1e6


def sync_if_unsynced(journal: Journal) -> float | None:
    """fsync=batch's periodic sync (a call the front runs between groups), and the last one at close:
    sync if anything was written since the last sync; its microseconds (None: nothing to sync)."""
    return timed_sync(journal) if journal.unsynced and not journal.failed else None
