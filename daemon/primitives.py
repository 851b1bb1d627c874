"""Small helpers shared by the actors and the journal: a one-shot result slot, a latency histogram, a clock,
the files a projection still has to make durable."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import trio

from .storage.files import sync_files

log = logging.getLogger("eurekamem.actor")


monotonic_ns = time.perf_counter_ns  # the clock of request latencies (a name, not a wrapper: one call less per request)


_log2 = math.log2


class PendingSync:
    """Files written without a sync (atomic_write(sync=False)) and removals, not yet durable.

    `update` adds paths (before writing them: a failure half-way still leaves them to sync); `sync`
    makes all of them durable in a worker thread, each file and folder once however often it was
    rewritten meanwhile, and on failure keeps them for the next call."""

    __slots__ = ("_paths",)

    def __init__(self) -> None:
        self._paths: set[Any] = set()

    def update(self, paths: Any) -> None:
        self._paths.update(paths)

    def __bool__(self) -> bool:
        return bool(self._paths)

    async def sync(self) -> None:
        paths, self._paths = self._paths, set()
        try:
            await trio.to_thread.run_sync(sync_files, sorted(paths))
        except BaseException:
            self._paths |= paths
            raise


class Waiter:
    """A one-shot slot: one side sets a value or an error, the other awaits it."""

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Histogram:
    """Latencies in microseconds, in buckets a quarter of a power of two wide (about 19 % apart)."""

    __slots__ = ("counts", "total", "max_us", "sum_us")

    BUCKETS = 4 * 40

    def __init__(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.total = 0
        self.max_us = 0.0
        self.sum_us = 0.0

    def add(self, micros: float) -> None:
        if micros <= 1.0:
            self.counts[0] += 1
        else:
            index = int(4 * _log2(micros)) + 1
            self.counts[index if index < 160 else 159] += 1  # 159 = BUCKETS - 1
        self.total += 1
        self.sum_us += micros
        if micros > self.max_us:
            self.max_us = micros

    def copy(self) -> Histogram:
        """A copy for another reader: the owner keeps adding to this one, nobody adds to the copy."""
        other = Histogram.__new__(Histogram)
        other.counts, other.total, other.max_us, other.sum_us = list(self.counts), self.total, self.max_us, self.sum_us
        return other

    def percentile(self, fraction: float) -> float:
        """The upper bound of the bucket holding that fraction of samples (0.0 when empty)."""
        if not self.total:
            return 0.0
        rank = max(1, math.ceil(fraction * self.total))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(self.max_us, 2 ** (index / 4)) if index else 1.0
        return self.max_us

    def summary(self) -> dict[str, float]:
        return {
            "count": self.total,
            "p50_us": round(self.percentile(0.50), 1),
            "p90_us": round(self.percentile(0.90), 1),
            "p99_us": round(self.percentile(0.99), 1),
            "p999_us": round(self.percentile(0.999), 1),
            "max_us": round(self.max_us, 1),
            "sum_us": round(self.sum_us, 1),
        }


