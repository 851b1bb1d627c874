"""Tier 4's records: what the memory tier journals (a memory put or purged, a maintenance run) and
what its snapshot holds (memory/memories.snapshot).

Rule kept here: these are plain msgspec Structs and import nothing of the memory tier's state, so
that every module that writes or reads them (the state, the review queue, the jobs' one-record
commit, recovery, verify) can name them without importing the state, and no import goes in a
circle. Their meaning (a PutMemory with `version` > 0 is a new version) is kept atop state.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import Memory, ReviewItem
from ..retrieval.lexical import LexicalDump


class PutMemory(msgspec.Struct, tag="memory.put"):
    memory: Memory
    model: str = ""
    vector: bytes = b""  # float32 row of the memory's embedding under `model` (empty: none yet)
    version: int = 0  # > 0: this is that version of the memory (see state.py's rule); 0: same version
    decision: str = ""  # with a version: created | merged | updated | archived | imported
    reason: str = ""
    # the memory as read from its file (another program wrote it: daemon/memory/watch.py): the
    # file already shows it, so the projection lists it in _index.json but does not rewrite it
    from_file: bool = False


class VersionEntry(msgspec.Struct, array_like=True):
    """One version in a memory's history; `memory` is None for the current one (in `memories`)."""

    version: int
    at: str
    decision: str
    reason: str
    memory: Memory | None = None


class PurgeMemory(msgspec.Struct, tag="memory.purge"):
    id: str


class MaintenanceRecord(msgspec.Struct, tag="memory.maintained", kw_only=True):
    """A finished maintenance run and its report (the memories it changed have PutMemory records
    of their own, journaled as it went); kept for sys.stats and to know when the last run was."""

    job_id: str
    started_at: str
    finished_at: str
    report: dict[str, Any] = {}


class MemorySnapshot(msgspec.Struct, kw_only=True):
    """memory/memories.snapshot: tier 4's state apart from the vectors (in memory/vectors/)."""

    model: str
    memories: list[Memory]
    labels: dict[str, int]
    models: dict[str, str]
    next_label: int
    vectors_fingerprint: Any
    previous_model: str = ""  # during a change of model: the old one, whose vectors still serve search
    previous_fingerprint: Any = ""
    lexical: LexicalDump | None = None  # the BM25 index as saved (absent in older snapshots: rebuilt)
    history: dict[str, list[VersionEntry]] = {}  # memories' versions (absent in older snapshots)
    vectors_stem: str = ""  # memory/vectors/<stem>.vectors holds `model`'s vectors ("": older snapshots, the model's name)
    previous_stem: str = ""  # likewise for `previous_model`'s
    reviews: list[ReviewItem] = []  # the review queue (daemon/memory/review.py), oldest first
    maintenance: list[MaintenanceRecord] = []  # the last maintenance runs (absent in older snapshots)

    def stem(self) -> str:
        return self.vectors_stem or self.model

    def stem_of_previous(self) -> str:
        return self.previous_stem or self.previous_model
