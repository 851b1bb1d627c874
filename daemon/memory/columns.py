"""What search filters and strength read of each memory, one numpy row per label (FilterColumns).

Rule kept here: a memory's row is written whenever the memory is (MemoryState._put, set_many at a
snapshot's load) and cleared when it is purged, so a filter never sees a memory other than as it
is now; the columns hold copies of the memory's fields and nothing else (and `seq`, the order
the memories came in, which memory.list's ties keep). memory.list's top offset + limit and
memory.domains' counts are read from these rows too, so neither walks the memories.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Sequence

import numpy as np

from ...protocol import MEMORY_CATEGORIES, Memory
from .strength import StrengthSettings, epoch, strengths

_CATEGORY_INDEX = {name: i for i, name in enumerate(MEMORY_CATEGORIES)}


class FilterColumns:
    """What search filters and strength look at, one numpy row per label: a filter is then one
    vectorised pass over 100,000 labels (~0.2 ms) instead of a walk over the memories in Python
    (~10 ms). Times are seconds since 1970 (float64): valid_from is the memory's, else its
    created_at; valid_until +inf while the fact holds; reference is strength's clock start
    (last_used, else created_at), updated the memory's updated_at."""

    NAMES = ("live", "active", "is_global", "domain", "category", "confidence", "pinned", "raw", "used",
             "reference", "updated", "valid_from", "valid_until", "created", "seq")

    def __init__(self) -> None:
        self.live = np.zeros(0, dtype=bool)
        self.active = np.zeros(0, dtype=bool)
        self.is_global = np.zeros(0, dtype=bool)
        self.domain = np.zeros(0, dtype=np.int32)
        self.category = np.zeros(0, dtype=np.int8)
        self.confidence = np.zeros(0, dtype=np.float64)
        self.pinned = np.zeros(0, dtype=bool)
        self.raw = np.zeros(0, dtype=bool)
        self.used = np.zeros(0, dtype=np.int32)
        self.reference = np.zeros(0, dtype=np.float64)
        self.updated = np.zeros(0, dtype=np.float64)
        self.valid_from = np.zeros(0, dtype=np.float64)
        self.valid_until = np.zeros(0, dtype=np.float64)
        # memory.list's order: `created` is created_at's wall clock (its offset ignored), so that it
        # never decreases where the created_at strings increase (NaN: not a timestamp); `seq` the
        # memory's place among the memories in the order they came (ties keep it)
        self.created = np.zeros(0, dtype=np.float64)
        self.seq = np.zeros(0, dtype=np.int64)
        self.next_seq = 0
        self.domain_ids: dict[str, int] = {}  # domain slug -> its number here

    def _fit(self, size: int) -> None:
        if size <= self.live.shape[0]:
            return
        cap = max(1024, 1 << (size - 1).bit_length())
        for name in self.NAMES:
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def _domain_id(self, slug: str) -> int:
        return self.domain_ids.setdefault(slug, len(self.domain_ids))

    def set(self, label: int, memory: Memory, slug: str, *, fresh: bool) -> None:
        """Write a memory's row; `fresh`: it is new among the memories (it gets the next seq)."""
        self._fit(label + 1)
        if fresh:
            self.seq[label] = self.next_seq
            self.next_seq += 1
        self.created[label] = wall_clock(memory.created_at)
        self.live[label] = True
        self.active[label] = memory.status == "active"
        self.is_global[label] = memory.scope == "global"
        self.domain[label] = self._domain_id(slug)
        self.category[label] = _CATEGORY_INDEX.get(memory.category, 0)
        self.confidence[label] = memory.confidence
        self.pinned[label] = memory.pinned
        self.raw[label] = memory.raw
        self.used[label] = min(memory.used_count, 2**31 - 1)
        self.reference[label], self.updated[label], self.valid_from[label], self.valid_until[label] = _times(memory)

    def set_many(self, labels: list[int], memories: list[Memory], slugs: list[str]) -> None:
        if not labels:
            return
        at = np.asarray(labels, dtype=np.int64)
        self._fit(int(at.max()) + 1)
        n = len(at)
        self.live[at] = True
        self.active[at] = np.fromiter((m.status == "active" for m in memories), dtype=bool, count=n)
        self.is_global[at] = np.fromiter((m.scope == "global" for m in memories), dtype=bool, count=n)
        self.domain[at] = np.fromiter(map(self._domain_id, slugs), dtype=np.int32, count=n)
        self.category[at] = np.fromiter((_CATEGORY_INDEX.get(m.category, 0) for m in memories), dtype=np.int8, count=n)
        self.confidence[at] = np.fromiter((m.confidence for m in memories), dtype=np.float64, count=n)
        self.pinned[at] = np.fromiter((m.pinned for m in memories), dtype=bool, count=n)
        self.raw[at] = np.fromiter((m.raw for m in memories), dtype=bool, count=n)
        self.used[at] = np.fromiter((min(m.used_count, 2**31 - 1) for m in memories), dtype=np.int32, count=n)
        times = np.asarray([_times(m) for m in memories], dtype=np.float64).reshape(n, 4)
        self.reference[at], self.updated[at], self.valid_from[at], self.valid_until[at] = times.T
        self.created[at] = np.fromiter((wall_clock(m.created_at) for m in memories), dtype=np.float64, count=n)
        self.seq[at] = np.arange(self.next_seq, self.next_seq + n, dtype=np.int64)
        self.next_seq += n

    def clear(self, label: int) -> None:
        if label < self.live.shape[0]:
            self.live[label] = self.active[label] = self.is_global[label] = False

    def labels(
        self,
        *,
        slug: str | None = None,
        include_global: bool = False,
        status: str = "active",
        categories: Sequence[str] | None = None,
        scope: str | None = None,
        min_confidence: float = 0.0,
        valid_at: float | None = None,
        include_expired: bool = False,
    ) -> np.ndarray:
        """The labels that pass every filter given, ascending (int64). `valid_at`: only memories
        valid then (valid_from <= valid_at < valid_until); with include_expired, also those whose
        validity ended by then (never those not valid yet)."""
        mask = self.live.copy()
        if status == "active":
            mask &= self.active
        elif status != "any":
            mask &= ~self.active
        if categories:
            wanted = [_CATEGORY_INDEX[c] for c in categories if c in _CATEGORY_INDEX]
            # one comparison a category: np.isin sorts, ~10x slower for the usual one or two
            in_categories = np.zeros_like(mask)
            for index in wanted:
                in_categories |= self.category == index
            mask &= in_categories
        if scope is not None:
            mask &= self.is_global if scope == "global" else ~self.is_global
        if min_confidence > 0.0:
            mask &= self.confidence >= float(min_confidence)
        if slug is not None:
            in_domain = self.domain == self.domain_ids.get(slug, -1)
            mask &= (in_domain | self.is_global) if include_global else in_domain
        if valid_at is not None:
            mask &= self.valid_from <= valid_at
            if not include_expired:
                mask &= self.valid_until > valid_at
        return np.flatnonzero(mask).astype(np.int64)

    def newest(self, labels: np.ndarray, count: int) -> np.ndarray | None:
        """Labels among `labels` holding the `count` newest by created_at, and perhaps a few more
        (the ties at the edge), in no order; None when created_at must be compared as text (one is
        not a timestamp). A superset because `created` never decreases where created_at increases."""
        created = self.created[labels]
        if np.isnan(created).any():
            return None
        if count >= labels.shape[0]:
            return labels
        edge = np.partition(created, labels.shape[0] - count)[labels.shape[0] - count]
        kept: np.ndarray = labels[created >= edge]
        return kept

    def counts(self, domain_id: int | None = None) -> np.ndarray:
        """Live memories by (domain number, category, archived), one numpy pass: an int64 array
        [domains, categories, 2], column 0 active and 1 archived; `domain_id`: that domain only
        (shape [1, categories, 2])."""
        n = self.live.shape[0]
        live = self.live[:n]
        if domain_id is not None:
            live = live & (self.domain[:n] == domain_id)
        domains = 1 if domain_id is not None else max(len(self.domain_ids), 1)
        domain = np.zeros(n, dtype=np.int64) if domain_id is not None else self.domain[:n].astype(np.int64)
        cell = (domain * len(MEMORY_CATEGORIES) + self.category[:n]) * 2 + ~self.active[:n]
        found = np.bincount(cell[live], minlength=domains * len(MEMORY_CATEGORIES) * 2)
        return found.reshape(domains, len(MEMORY_CATEGORIES), 2)

    def global_counts(self) -> np.ndarray:
        """Live global memories by (category, archived): an int64 array [categories, 2]."""
        n = self.live.shape[0]
        mine = self.live[:n] & self.is_global[:n]
        cell = self.category[:n].astype(np.int64) * 2 + ~self.active[:n]
        return np.bincount(cell[mine], minlength=len(MEMORY_CATEGORIES) * 2).reshape(len(MEMORY_CATEGORIES), 2)

    def next_change(self, after: float) -> float:
        """The first time after `after` at which some live memory becomes valid or stops being
        valid (+inf if none will): until then, which memories are valid "now" cannot change."""
        n = self.live.shape[0]
        live = self.live[:n]
        starts = self.valid_from[:n][live]
        ends = self.valid_until[:n][live]
        later = np.concatenate([starts[starts > after], ends[ends > after]])
        return float(later.min()) if later.size else math.inf

    def strengths(self, labels: np.ndarray, now: float, settings: StrengthSettings) -> np.ndarray:
        """The strength of each of `labels` at `now` (see daemon/memory/strength.py)."""
        at = np.asarray(labels, dtype=np.int64)
        return strengths(self.confidence[at], self.category[at], self.pinned[at], self.reference[at], self.used[at], now, settings)


def _times(memory: Memory) -> tuple[float, float, float, float]:
    """(strength's reference, updated, valid from, valid until) of a memory, as seconds since 1970."""
    created = _epoch_or(memory.created_at, 0.0)
    reference = _epoch_or(memory.last_used, created) if memory.last_used else created
    valid_from = _epoch_or(memory.valid_from, created) if memory.valid_from else created
    valid_until = _epoch_or(memory.valid_until, math.inf) if memory.valid_until else math.inf
    return reference, _epoch_or(memory.updated_at, created), valid_from, valid_until


def wall_clock(timestamp: str) -> float:
    """A timestamp as the daemon writes it (isoformat: every field at a fixed width, then an
    offset) as seconds, its offset ignored; NaN for any other text. Where two such texts differ,
    this never orders them the other way: the fields come first, and an offset's sign sorts
    before a fraction's dot."""
    if not _ISOFORMAT.fullmatch(timestamp):
        return math.nan
    try:
        parsed = _dt.datetime.fromisoformat(timestamp)
    except ValueError:
        return math.nan
    return (parsed.replace(tzinfo=None) - _EPOCH).total_seconds()


_ISOFORMAT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?[+-]\d\d:\d\d(:\d\d(\.\d{6})?)?", re.ASCII)
_EPOCH = _dt.datetime(1970, 1, 1)


def _epoch_or(timestamp: str | None, fallback: float) -> float:
    try:
        return epoch(timestamp) if timestamp else fallback
    except ValueError:  # a record from before timestamps were checked: treated as absent
        return fallback
