"""Tier 4's duplicates: which active memories a new text duplicates, and the merges.

Rule kept here: a memory is a near duplicate of a text when it is of the same domain and category,
valid now, and either its vector's cosine reaches the model's duplicate threshold or (among the 50
most recent) its words overlap EurekaClaw's way by KEYWORD_OVERLAP; a merge keeps the memory's id
and is a new version of it, committed as a PutMemory like any change. The one state kept here is
the word sets' cache, which a changed memory invalidates by being another object.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from ...protocol import Memory
from ...protocol import methods as m
from .data import MemoryData
from .format import derive_abstract, derive_overview, fingerprint, word_overlap, word_set
from .params import time_param
from .records import PutMemory

KEYWORD_OVERLAP = 0.4  # EurekaClaw's near-duplicate keyword overlap


WORD_SETS_KEPT = 4096  # word sets cached for keyword overlap (MemoryState._words_of)


def _origin_merged(old: Memory, p: m.MemoryAdd) -> dict[str, Any]:
    """A merge's conversation origin: the source message ids of both (the old first, at most
    MAX_SOURCE_IDS kept: the newest), who it is about and the time it refers to kept unless unset."""
    ids = list(dict.fromkeys(old.source_message_ids + list(p.source_message_ids)))[-m.MAX_SOURCE_IDS :]
    return {
        "source_message_ids": ids,
        "attributed_to": old.attributed_to or (p.attributed_to or "").strip() or None,
        "refers_to": old.refers_to if old.refers_to is not None else time_param("refers_to", p.refers_to),
    }


class Dedup(MemoryData):
    """Near duplicates and merges over MemoryData (module rule)."""

    def __init__(self, embedder: Any, files_root: str = "memories") -> None:
        super().__init__(embedder, files_root)
        self._word_sets: dict[str, tuple[Memory, frozenset[str]]] = {}  # id -> (memory, its words); see _words_of
        # the domains (slugs) in which the batch in progress deduplicated a text: what its decisions
        # read beside the memories it changed (daemon/memory/concurrency.py, several nodes)
        self.deduplicated: set[str] = set()

    def begin_batch(self) -> None:
        super().begin_batch()
        self.deduplicated.clear()

    def _near_duplicate(self, slug: str, p: m.MemoryAdd, vector: np.ndarray) -> tuple[str | None, str]:
        found = self.near_duplicates(slug, p.category, p.title, p.content, vector, limit=1)
        return found[0] if found else (None, "")

    def near_duplicates(
        self, slug: str, category: str, title: str, content: str, vector: np.ndarray, limit: int = 3
    ) -> list[tuple[str, str]]:
        """The active memories of a domain and category that the dedup rules call near duplicates of
        a text, with the rule and its figure: those at or above the model's cosine threshold, best
        first, then those of the 50 most recent with EurekaClaw's keyword overlap, newest first."""
        labels = self.columns.labels(slug=slug, categories=[category], valid_at=self.wall())  # a closed fact is no twin
        if not len(labels):
            return []
        out: dict[str, str] = {}
        if len(self.vectors):
            found, scores = self.vectors.search(vector, limit, labels)
            for label, score in zip(found.tolist(), scores.tolist()):
                if score >= self.thresholds.duplicate:
                    rule = f"cosine {score:.3f} >= {self.thresholds.duplicate} ({self.model})"
                    out[self._id_of[int(label)]] = f"near duplicate: {rule}"
        if len(out) >= limit:
            return list(out.items())[:limit]
        ids = [self._id_of[label] for label in labels[-50:].tolist()]  # labels ascend with creation
        new_words = word_set(f"{title} {content}")
        for memory_id in reversed(ids):  # the 50 most recent of the same category, as EurekaClaw checks
            if memory_id in out:
                continue
            overlap = word_overlap(self._words_of(self.memories[memory_id]), new_words)
            if overlap >= KEYWORD_OVERLAP:
                out[memory_id] = f"near duplicate: keyword overlap {overlap:.2f} >= {KEYWORD_OVERLAP}"
                if len(out) >= limit:
                    break
        return list(out.items())

    def _words_of(self, memory: Memory) -> frozenset[str]:
        """The word set keyword overlap compares, cached for the memories recently compared (the
        most recent of each domain and category), at most WORD_SETS_KEPT. A change replaces the
        Memory object, so an entry holding another object is stale."""
        cached = self._word_sets.get(memory.id)
        if cached is not None and cached[0] is memory:
            return cached[1]
        words = word_set(f"{memory.title} {memory.content}")
        self._word_sets.pop(memory.id, None)
        if len(self._word_sets) >= WORD_SETS_KEPT:
            del self._word_sets[next(iter(self._word_sets))]  # the oldest entry
        self._word_sets[memory.id] = (memory, words)
        return words

    def _merge(self, twin_id: str, p: m.MemoryAdd, vector: np.ndarray, why: str) -> Memory:
        """Without an LLM: keep the longer text, union the tags, raise confidence to the max."""
        old = self.memories[twin_id]
        new_longer = len(p.content.strip()) > len(old.content)
        content = p.content.strip() if new_longer else old.content
        title = p.title.strip() if new_longer else old.title
        merged = msgspec.structs.replace(
            old,
            title=title,
            content=content,
            abstract=(p.abstract or derive_abstract(content)) if new_longer else old.abstract,
            overview=(p.overview or derive_overview(content)) if new_longer else old.overview,
            confidence=max(old.confidence, round(float(p.confidence), 4)),
            tags=list(dict.fromkeys(old.tags + p.tags)),
            fingerprint=fingerprint(title, content),
            updated_at=self.stamp(),
            pinned=old.pinned or p.pinned,
            **_origin_merged(old, p),
        )
        version = self.version_of(old.id) + 1
        if new_longer:
            self.commit(PutMemory(merged, self.model, vector.astype(np.float32).tobytes(), version, "merged", why))
        else:
            vector_bytes = self.vector_bytes(old.id)
            self.commit(PutMemory(merged, self.model_of.get(old.id, ""), vector_bytes, version, "merged", why))
        return merged

    def merge_rewritten(
        self,
        target_id: str,
        text: tuple[str, str, str, str],
        p: m.MemoryAdd,
        vector: np.ndarray,
        reason: str,
    ) -> Memory:
        """The judge's MERGE: the memory's L0/L1/L2 rewritten to hold both (the newer statement
        wins a conflict; the old text stays in the history); tags unioned, confidence the max.
        `text` is (title, content, abstract, overview)."""
        title, content, abstract, overview = text
        old = self.memories[target_id]
        merged = msgspec.structs.replace(
            old,
            title=title.strip(),
            content=content.strip(),
            abstract=abstract.strip(),
            overview=overview.strip(),
            confidence=max(old.confidence, round(float(p.confidence), 4)),
            tags=list(dict.fromkeys(old.tags + p.tags)),
            fingerprint=fingerprint(title, content),
            updated_at=self.stamp(),
            **_origin_merged(old, p),
        )
        version = self.version_of(old.id) + 1
        self.commit(PutMemory(merged, self.model, vector.astype(np.float32).tobytes(), version, "merged", reason))
        return merged
